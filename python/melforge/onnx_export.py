"""`python -m melforge.onnx_export WEIGHTS OUT.onnx`: an export of `melforge-train export` as an ONNX model.

`melforge-train export --onnx FILE` runs this module (with the interpreter of its `--python`) after writing the
export; it can also be run by hand on any export. The model (python/melforge/models.py, built from WEIGHTS.json's
model configuration with WEIGHTS' tensors, in eval mode) is traced by torch.onnx.export's dynamo exporter with a
dynamic batch and time axis:

- inputs: `x` float32 [B, n_mels, T] (the log-mel or fbank frames of melforge's featurizer, as a dataset stores
  them, without any normalisation: the model applies its own) and `lengths` int64 [B] (real frames of each row,
  1 <= lengths[b] <= T; the frames after them are padding the model leaves out);
- output: for a `--task verification` model `embedding` float32 [B, E], each row L2-normalised (the rows of
  `melforge-train embed` and `melforge.embed`, so that a dot product is the cosine score); otherwise `scores`
  float32 [B, C], the class scores of the task (softmax for multiclass, sigmoid for multilabel) of each row, the
  detection head left out.

T is at least 9 frames for resnet-se (the traced graph holds for lengths whose three stride-2 stages leave more than
one step; torch.export records that bound); a Cnn of time_pool "flatten" (checkpoints from before inputs of any
length) keeps its fixed n_frames. This module imports only `melforge.models` of the package (and torch, onnx,
onnxscript).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from .models import build_checked_model, load_torch_file

class OnnxModule(torch.nn.Module):
    """The model as the ONNX file computes it: `forward(x [B, n_mels, T], lengths int64 [B])` -> the L2-normalised
    embedding [B, E] of a verification model, else the class scores [B, C]."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net
        self.verification = getattr(net, "task", "multiclass") == "verification"

    @property
    def output_name(self) -> str:
        """"embedding" or "scores"."""
        return "embedding" if self.verification else "scores"

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out = self.net(x, lengths)
        if self.verification:
            return torch.nn.functional.normalize(out[1].float(), dim=1, eps=1e-12)
        return self.net.class_scores(out[0])


def load_export(weights: str) -> torch.nn.Module:
    """The model of an export (`weights.pt` with `weights.pt.json` beside it), in eval mode, read as an untrusted
    file (models.load_torch_file, build_checked_model). Raises ValueError (melforge.FormatError inside the package)
    for a file that is not such an export."""
    weights = os.fspath(weights)
    meta_path = weights + ".json"
    if not os.path.isfile(weights):
        raise ValueError(f"{weights}: no such export (a state dict of melforge-train export)")
    if not os.path.isfile(meta_path):
        raise ValueError(f"{weights}: no export metadata {meta_path} beside it")
    with open(meta_path, encoding="utf-8") as fh:
        meta = json.load(fh)
    state = load_torch_file(weights)
    if not isinstance(state, dict) or "model_config" not in meta:
        raise ValueError(f"{weights}: not an export of melforge-train (a dict of tensors with 'model_config' in "
                         f"{meta_path})")
    return build_checked_model(meta, state, weights).eval()


def example_inputs(net: torch.nn.Module):
    """(x, lengths, fixed_time): a batch of two rows to trace with (random frames, the second row padded), and
    whether the model takes only its n_frames (a "flatten" Cnn)."""
    fixed = getattr(net, "time_pool", None) == "flatten"
    frames = int(net.n_frames) if fixed else max(int(net.n_frames), 18)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, int(net.n_mels), frames, generator=generator)
    lengths = torch.tensor([frames, frames if fixed else frames - frames // 3], dtype=torch.int64)
    return x, lengths, fixed


def export_onnx(weights: str, out: str, opset: int | None = None) -> str:
    """Writes the ONNX model of the export `weights` to `out` (one file, the weights inside it); returns the output
    name ("embedding" or "scores")."""
    module = OnnxModule(load_export(weights)).eval()
    x, lengths, fixed = example_inputs(module.net)
    dynamic = torch.export.Dim.DYNAMIC  # named Dims refuse the stride guards torch derives for resnet-se's reshape
    shapes = {"x": {0: dynamic} if fixed else {0: dynamic, 2: dynamic}, "lengths": {0: dynamic}}
    with torch.no_grad():
        program = torch.onnx.export(module, (x, lengths), dynamo=True, input_names=["x", "lengths"],
                                    output_names=[module.output_name], dynamic_shapes=shapes,
                                    opset_version=opset, external_data=False, verbose=False)
    program.save(out, external_data=False)
    return module.output_name


def main(argv=None) -> int:
    """The command line: WEIGHTS OUT [--opset N]. Exit 0 when OUT is written, 1 with a message otherwise."""
    parser = argparse.ArgumentParser(prog="python -m melforge.onnx_export",
                                     description="Writes an export of melforge-train export as an ONNX model.")
    parser.add_argument("weights", help="the export's state dict (weights.pt, with weights.pt.json beside it)")
    parser.add_argument("out", help="the ONNX file to write")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: torch.onnx's)")
    args = parser.parse_args(argv)
    try:
        name = export_onnx(args.weights, args.out, args.opset)
    except Exception as e:  # noqa: BLE001 - reported to the calling melforge-train, which names the export
        print(f"melforge.onnx_export: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} (inputs x [batch, n_mels, frames], lengths [batch]; output {name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
