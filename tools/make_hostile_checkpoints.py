#!/usr/bin/env python3
"""Crafted checkpoints for issue 29: each one a small file that a careless reader would turn into a huge allocation,
a read past a buffer, a wrong dtype taken silently, a "holds NaN" about uninitialised memory, or code run from a
pickle. melforge-train (eval, predict, embed, export) and melforge.predict / melforge.models must refuse each one
with exit 1 / melforge.FormatError naming the file and the field, quickly and without big allocations.

Usage: make_hostile_checkpoints.py VALID.pt OUT_DIR
  VALID.pt: a melforge checkpoint (melforge-train train's best.pt, or one a test writes) whose 'model' holds at least
  one float32 tensor of 2 or more elements. OUT_DIR receives one <case>.pt per case and cases.json: a list of
  {"name", "file", "field"}, where "field" is a text every error message about that file must contain (the entry
  or configuration field at fault). Needs only torch (tools/setup_torch.sh's environment).

The cases (one per class of defect, not per example):
  huge_config      model_config within the field bounds but describing ~10^12 parameters (a 4 TiB layer)
  width_bound      model_config 'hidden' of 2^60 (outside the accepted range)
  stride0          a model tensor of 2^56 elements with stride 0 over a 1-element storage

Integers of 2^31 to 2^55 are pickled in 5 to 7 bytes, which LibTorch's unpickler refuses as a whole ("Expected
length to be 8"): safe, but the message cannot name the field, so the cases use 8-byte values (2^56, 2^60).
  negative_stride  a model tensor with stride -1 (a reversed view)
  oversize_view    a model tensor whose shape needs 2^30 elements of a 64-element storage
  short_record     a storage declaring 4099 float32 values whose record in the zip holds 16 bytes
  wrong_dtype      a float32 weight stored as int64 of the same shape
  nan_weight       a weight of the right shape and dtype holding NaN
  pickle_payload   a pickle that would run os.system when unpickled without weights_only
"""
import collections
import io
import json
import os
import sys
import zipfile

import torch


class _View:
    """A tensor's pickled form with chosen storage, offset, size and stride: torch.save writes the storage record and
    the view's metadata as given, with none of the bounds checks torch applies when such a view is made."""

    def __init__(self, storage_tensor, offset, size, stride):
        self.storage_tensor, self.offset, self.size, self.stride = storage_tensor, offset, size, stride

    def __reduce_ex__(self, protocol):
        t = self.storage_tensor
        storage = torch.storage.TypedStorage(wrap_storage=t.untyped_storage(), dtype=t.dtype, _internal=True)
        return (torch._utils._rebuild_tensor_v2,
                (storage, self.offset, tuple(self.size), tuple(self.stride), False, collections.OrderedDict()))


class _Payload:
    """Runs a shell command when unpickled by a reader that allows any global (torch.load(weights_only=False))."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def _victim(model):
    """The name of the first float32 tensor of 2 or more elements in `model`."""
    for name, t in model.items():
        if t.dtype == torch.float32 and t.numel() >= 2:
            return name
    raise SystemExit("make_hostile_checkpoints: the checkpoint's model holds no float32 tensor of 2+ elements")


def _shorten_record(path, record_bytes, keep):
    """Rewrites the zip at `path` with the one storage record of `record_bytes` bytes cut to `keep` bytes (stored,
    CRCs recomputed: only the declared size and the stored bytes disagree)."""
    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i.filename)) for i in z.infolist()]
    hits = [i.filename for i, data in entries if "/data/" in i.filename and len(data) == record_bytes]
    if len(hits) != 1:
        raise SystemExit(f"make_hostile_checkpoints: expected one record of {record_bytes} bytes, found {hits}")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for info, data in entries:
            z.writestr(info.filename, data[:keep] if info.filename == hits[0] else data, zipfile.ZIP_STORED)


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    valid, out = argv[1], argv[2]
    os.makedirs(out, exist_ok=True)
    base = torch.load(valid, map_location="cpu", weights_only=True)
    if not isinstance(base, dict) or base.get("format") != "melforge-checkpoint":
        raise SystemExit(f"make_hostile_checkpoints: {valid} is not a melforge checkpoint")
    config = base["model_config"]
    config = json.loads(config) if isinstance(config, (str, bytes)) else dict(config)
    victim = _victim(base["model"])
    shape = tuple(base["model"][victim].shape)
    cases = []

    def write(name, field, edit_model=None, edit_config=None, extra=None):
        obj = dict(base)
        obj["model"] = dict(base["model"])
        obj["model_config"] = dict(config)
        if edit_model is not None:
            obj["model"][victim] = edit_model
        if edit_config is not None:
            obj["model_config"].update(edit_config)
        if extra is not None:
            obj.update(extra)
        path = os.path.join(out, name + ".pt")
        torch.save(obj, path)
        cases.append({"name": name, "file": path, "field": field})
        return path

    write("huge_config", "model_config", edit_config={"hidden": 1 << 20, "n_frames": 1 << 20, "n_mels": 1 << 10})
    write("width_bound", "hidden", edit_config={"hidden": 1 << 60})
    write("stride0", victim, edit_model=_View(torch.zeros(1), 0, [1 << 56], [0]))
    write("negative_stride", victim, edit_model=_View(torch.zeros(4), 3, [4], [-1]))
    write("oversize_view", victim, edit_model=_View(torch.zeros(64), 0, [1 << 30], [1]))
    path = write("short_record", victim, edit_model=torch.zeros(4099))
    _shorten_record(path, 4099 * 4, 16)
    write("wrong_dtype", victim, edit_model=torch.zeros(shape, dtype=torch.int64))
    write("nan_weight", victim, edit_model=torch.full(shape, float("nan")))
    marker = os.path.join(out, "payload-ran")
    write("pickle_payload", "checkpoint", extra={"payload": _Payload(marker)})
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as fh:
        json.dump({"cases": cases, "payload_marker": marker, "victim": victim}, fh, indent=1)
    print(f"make_hostile_checkpoints: {len(cases)} cases in {out}")


if __name__ == "__main__":
    main(sys.argv)
