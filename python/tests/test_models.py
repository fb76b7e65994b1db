"""melforge.models: imported lazily (not by `import melforge`), build_model from every form a user holds: the
export's weights.pt.json as it is, its model_config dict, JSON text, a checkpoint dict (model_config a dict, or the
JSON string of checkpoint format version 1)."""
import json
import subprocess
import sys

import pytest

import melforge

CONFIG = {"model": "cnn", "n_mels": 16, "n_frames": 12, "num_classes": 3, "channels": [2, 3, 4], "hidden": 8,
          "dropout": 0.3}


def test_import_melforge_does_not_import_torch():
    code = "import sys, melforge; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.needs_torch
@pytest.mark.parametrize("form", ["config", "export_json", "json_text", "checkpoint_dict", "checkpoint_v1"])
def test_build_model_accepts_every_form(form):
    torch = pytest.importorskip("torch")
    holder = {
        "config": CONFIG,
        "export_json": {"model_config": CONFIG, "class_names": ["a", "b", "c"], "positive_class": "b", "mel": {}},
        "json_text": json.dumps({"model_config": CONFIG}),
        "checkpoint_dict": {"format": "melforge-checkpoint", "version": 2, "model_config": CONFIG},
        "checkpoint_v1": {"format": "melforge-checkpoint", "version": 1, "model_config": json.dumps(CONFIG)},
    }[form]
    model = melforge.models.build_model(holder)
    assert model.config() == CONFIG
    logits, det = model.eval()(torch.zeros(2, 16, 12))
    assert logits.shape == (2, 3) and det.shape == (2,)


@pytest.mark.needs_torch
def test_build_model_refuses_what_holds_no_config():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="model configuration"):
        melforge.models.build_model({"class_names": ["a"]})
    with pytest.raises(ValueError, match="unknown model"):
        melforge.models.build_model(dict(CONFIG, model="resnet"))
