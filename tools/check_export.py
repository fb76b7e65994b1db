#!/usr/bin/env python3
"""Checks melforge-train's files from Python with the pinned torch (run with the venv python of
tools/setup_torch.sh). Used by trainer/tests/test_trainer_checkpoint.cpp and test_trainer_export.cpp.

  check_export.py checkpoint CKPT
      torch.load(CKPT) with the default weights_only=True; checks the entries and their types.
  check_export.py export WEIGHTS INPUT EXPECTED [TOL]
      torch.load(WEIGHTS) (weights_only), builds the model of WEIGHTS.json's model_config with
      python/melforge/models.py (loaded by path: this venv does not have melforge installed), load_state_dict(strict=True), eval mode, runs INPUT (a tensor saved with
      torch::pickle_save, or a dict of the input "x" and its "lengths", int64 [B]) and compares its two outputs, named by the model's `output_names` ((logits, detection)
      for the classifiers, (logits, embedding) for the speaker models), with EXPECTED (a dict holding both names)
      within TOL (default 1e-5, max absolute difference). When EXPECTED also holds "scores", the model's class
      scores (`class_scores` of melforge.models: the function WEIGHTS.json's "scores" names, softmax or sigmoid)
      are compared with it too. WEIGHTS.json's "task" and "scores" must agree with the model configuration
      (multilabel: sigmoid, with "aggregate" and "threshold": null or a number in [0, 1]).

Exit code 0 when every check passes, 1 with a message on stderr otherwise.
"""
import importlib.util
import json
import os
import sys

import torch

MODELS_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "melforge", "models.py")


def load_models():
    """python/melforge/models.py as a module, loaded by path (it imports nothing else of the package)."""
    spec = importlib.util.spec_from_file_location("melforge_models", MODELS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fail(msg: str) -> None:
    print(f"check_export.py: {msg}", file=sys.stderr)
    sys.exit(1)


def check_checkpoint(path: str) -> None:
    ck = torch.load(path)
    if not isinstance(ck, dict):
        fail(f"{path}: top level is {type(ck).__name__}, not dict")
    expect = {"format": str, "version": int, "model_config": dict, "config": str, "mel": str, "class_names": list,
              "positive_class": str, "positive_index": int, "epoch": int, "step": int, "model": dict,
              "optimizer": dict, "scaler": dict, "scheduler": str, "state": str}
    for key, typ in expect.items():
        if key not in ck:
            fail(f"{path}: missing entry {key!r}")
        if not isinstance(ck[key], typ):
            fail(f"{path}: entry {key!r} is {type(ck[key]).__name__}, not {typ.__name__}")
    if ck["format"] != "melforge-checkpoint":
        fail(f"{path}: format {ck['format']!r}")
    for key in ("config", "mel", "scheduler", "state"):
        json.loads(ck[key])
    for key in ("model", "optimizer", "scaler"):
        for name, t in ck[key].items():
            if not isinstance(name, str) or not isinstance(t, torch.Tensor):
                fail(f"{path}: entry {key}.{name} is not a str -> tensor item")
    if ck["rng_state"] is not None and not isinstance(ck["rng_state"], torch.Tensor):
        fail(f"{path}: rng_state is {type(ck['rng_state']).__name__}")
    if "model" not in ck["model_config"]:
        fail(f"{path}: model_config has no 'model' entry")
    load_models().model_config_of(ck)
    model_keys = sorted(ck["model"])
    print(f"ok: {len(ck)} entries, model tensors: {','.join(model_keys)}, epoch {ck['epoch']}, step {ck['step']}")


def check_export(weights: str, input_path: str, expected_path: str, tol: float) -> None:
    melforge_models = load_models()

    state = torch.load(weights)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        fail(f"{weights}: not a dict of tensors")
    with open(weights + ".json") as f:
        meta = json.load(f)
    for key in ("model_config", "class_names", "positive_class", "mel"):
        if key not in meta:
            fail(f"{weights}.json: missing {key!r}")
    check_task_meta(weights, meta, melforge_models)
    model = melforge_models.build_model(meta)
    model.load_state_dict(state, strict=True)
    model.eval()
    x = torch.load(input_path)
    lengths = None
    if isinstance(x, dict):
        x, lengths = x["x"], x["lengths"]
    expected = torch.load(expected_path)
    with torch.no_grad():
        outputs = model(x, lengths)
    for name, got in zip(model.output_names, outputs):
        if name not in expected:
            fail(f"{expected_path}: missing {name!r}")
        want = expected[name]
        if got.shape != want.shape:
            fail(f"{name}: shape {list(got.shape)} != {list(want.shape)}")
        diff = (got - want).abs().max().item()
        if not diff <= tol:
            fail(f"{name}: max abs difference {diff:.3g} > {tol:g}")
    scores = ""
    if "scores" in expected:
        got = model.class_scores(outputs[0])
        want = expected["scores"]
        if got.shape != want.shape:
            fail(f"scores: shape {list(got.shape)} != {list(want.shape)}")
        diff = (got - want).abs().max().item()
        if not diff <= tol:
            fail(f"scores ({meta['scores']}): max abs difference {diff:.3g} > {tol:g}")
        scores = f", scores ({meta['scores']})"
    with_lengths = "" if lengths is None else " (with lengths)"
    print(f"ok: {len(state)} tensors, logits {list(outputs[0].shape)}{with_lengths}{scores}, max diff within {tol:g}")


def check_task_meta(weights: str, meta: dict, melforge_models) -> None:
    """WEIGHTS.json's "task" and "scores" agree with the model configuration's task (exports written before they
    existed have neither); a multilabel export names its aggregate and its threshold (null or in [0, 1])."""
    if "task" not in meta and "scores" not in meta:
        return
    task = melforge_models.model_config_of(meta).get("task", "multiclass")
    want = {"multiclass": "softmax", "multilabel": "sigmoid", "verification": "cosine"}.get(task)
    if meta.get("task") != task or meta.get("scores") != want:
        fail(f"{weights}.json: task {meta.get('task')!r} with scores {meta.get('scores')!r}, but the model "
             f"configuration's task is {task!r} (scores {want!r})")
    if task == "multilabel":
        if meta.get("aggregate") not in ("mean", "max"):
            fail(f"{weights}.json: aggregate {meta.get('aggregate')!r}, not mean or max")
        t = meta.get("threshold", "missing")
        if t is not None and not (isinstance(t, (int, float)) and 0 <= t <= 1):
            fail(f"{weights}.json: threshold {t!r}, not null or a number in [0, 1]")


def main(argv) -> None:
    if len(argv) >= 2 and argv[0] == "checkpoint":
        check_checkpoint(argv[1])
    elif len(argv) >= 4 and argv[0] == "export":
        check_export(argv[1], argv[2], argv[3], float(argv[4]) if len(argv) > 4 else 1e-5)
    else:
        fail("usage: check_export.py checkpoint CKPT | export WEIGHTS INPUT EXPECTED [TOL]")


if __name__ == "__main__":
    main(sys.argv[1:])
