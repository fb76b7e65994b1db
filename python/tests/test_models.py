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


SPEAKER_CONFIGS = [
    {"model": "resnet-se", "n_mels": 16, "n_frames": 20, "num_classes": 4, "width": "quarter", "embedding_dim": 12},
    {"model": "ecapa", "n_mels": 16, "n_frames": 20, "num_classes": 4, "channels": 16, "embedding_dim": 12},
]


@pytest.mark.needs_torch
@pytest.mark.parametrize("config", SPEAKER_CONFIGS, ids=lambda c: c["model"])
def test_speaker_models_give_cosine_logits_and_embeddings(config):
    torch = pytest.importorskip("torch")
    model = melforge.models.build_model({"model_config": config})
    assert model.config() == config
    assert model.output_names == ("logits", "embedding")
    assert model.state_dict()["aam.weight"].shape == (4, 12)
    cosine, embedding = model.eval()(torch.randn(3, 16, 20))
    assert cosine.shape == (3, 4) and embedding.shape == (3, 12)
    assert cosine.abs().max().item() <= 1 + 1e-6
    want = torch.nn.functional.cosine_similarity(embedding[:, None, :], model.aam.weight[None, :, :], dim=2)
    assert torch.allclose(cosine, want, atol=1e-6)
    with pytest.raises(ValueError, match="at least 2 classes"):
        melforge.models.build_model(dict(config, num_classes=1))
