"""melforge.models: imported lazily (not by `import melforge`), build_model from every form a user holds: the
export's weights.pt.json as it is, its model_config dict, JSON text, a checkpoint dict (model_config a dict, or the
JSON string of checkpoint format version 1); inputs of any length with lengths: a padded row gives the output of the
row alone (the C++ twins are compared with these modules by trainer/tests/test_trainer_export.cpp)."""
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
    assert model.config() == dict(CONFIG, time_pool="flatten", cmn=False)  # no time_pool, no cmn: an older checkpoint
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
    assert model.config() == dict(config, cmn=False)
    assert model.output_names == ("logits", "embedding")
    assert model.state_dict()["aam.weight"].shape == (4, 12)
    cosine, embedding = model.eval()(torch.randn(3, 16, 20))
    assert cosine.shape == (3, 4) and embedding.shape == (3, 12)
    assert cosine.abs().max().item() <= 1 + 1e-6
    want = torch.nn.functional.cosine_similarity(embedding[:, None, :], model.aam.weight[None, :, :], dim=2)
    assert torch.allclose(cosine, want, atol=1e-6)
    with pytest.raises(ValueError, match="at least 2 classes"):
        melforge.models.build_model(dict(config, num_classes=1))


MASK_CONFIGS = [
    dict(CONFIG, time_pool="mean_max"),
    {"model": "crnn", "n_mels": 16, "n_frames": 12, "num_classes": 3, "channels": [4, 6], "rnn": "gru",
     "rnn_hidden": 10, "hidden": 8, "dropout": 0.3},
    {"model": "crnn", "n_mels": 16, "n_frames": 12, "num_classes": 3, "channels": [4, 6], "rnn": "lstm",
     "rnn_hidden": 10, "hidden": 8, "dropout": 0.3},
] + SPEAKER_CONFIGS


def _outputs(pair):
    """A model's two outputs side by side, [B, num_classes + 1 or + embedding_dim]."""
    import torch

    return torch.cat([o if o.dim() == 2 else o[:, None] for o in pair], 1)


@pytest.mark.needs_torch
@pytest.mark.parametrize("config", MASK_CONFIGS, ids=lambda c: f"{c['model']}-{c.get('rnn', '')}")
@pytest.mark.parametrize("frames", [40, 37])
def test_padded_rows_give_the_output_of_the_row_alone(config, frames):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = melforge.models.build_model(config)
    for name, b in model.named_buffers():
        if name.endswith("running_mean"):
            b.normal_(0, 0.5)
        if name.endswith("running_var"):
            b.uniform_(0.5, 2)
    model.eval()
    lengths = [frames, 17, 22, 3, 1, 9]
    x = torch.randn(len(lengths), 16, frames) * 8 - 30
    garbage, nan = x.clone(), x.clone()
    for i, n in enumerate(lengths):
        garbage[i, :, n:] = torch.randn(16, frames - n) * 1000
        nan[i, :, n:] = float("nan")
    mask = torch.arange(frames)[None, :] < torch.tensor(lengths)[:, None]
    lens = melforge.models.lengths_of(mask)
    assert lens.tolist() == lengths
    with torch.no_grad():
        batch = _outputs(model(garbage, lens))
        assert torch.equal(_outputs(model(nan, lens)), batch)
        for i, n in enumerate(lengths):
            alone = _outputs(model(x[i:i + 1, :, :n]))
            assert torch.allclose(batch[i], alone[0], rtol=1e-4, atol=1e-4), (i, n)
        assert not torch.allclose(_outputs(model(garbage))[3], batch[3], rtol=1e-2, atol=1e-2)


@pytest.mark.needs_torch
def test_lengths_are_checked_and_flatten_takes_full_rows_only():
    torch = pytest.importorskip("torch")
    model = melforge.models.build_model(dict(CONFIG, time_pool="mean_max")).eval()
    x = torch.zeros(2, 16, 7)
    for bad in (torch.tensor([7, 3], dtype=torch.int32), torch.tensor([7]), torch.tensor([8, 1]),
                torch.tensor([0, 1])):
        with pytest.raises(ValueError, match="lengths"):
            model(x, bad)
    with pytest.raises(ValueError, match=r"expected \[B, 16, T\]"):
        model(torch.zeros(2, 15, 7))
    old = melforge.models.build_model(CONFIG).eval()
    assert old.fc.in_features == 4 * 4 * 3
    with pytest.raises(ValueError, match=r"expected \[B, 16, 12\]"):
        old(x)
    with pytest.raises(ValueError, match="cannot leave padding out"):
        old(torch.zeros(2, 16, 12), torch.tensor([12, 5]))
    assert torch.equal(old(torch.ones(2, 16, 12), torch.tensor([12, 12]))[0], old(torch.ones(2, 16, 12))[0])


@pytest.mark.needs_torch
def test_crafted_checkpoints_are_refused_by_the_loaders(tmp_path, repo):
    """melforge.models.load_torch_file and build_checked_model (what melforge.predict reads a checkpoint with)
    refuse each file of tools/make_hostile_checkpoints.py with melforge.FormatError naming the file and the field,
    from the metadata, before anything of the declared size is allocated; a valid checkpoint loads."""
    import torch
    from melforge import models

    net = models.build_model(CONFIG)
    valid = tmp_path / "valid.pt"
    torch.save({"format": "melforge-checkpoint", "version": 2, "model_config": net.config(),
                "model": dict(net.state_dict()), "mel": "{}", "class_names": ["a", "b", "c"],
                "positive_class": "b", "positive_index": 1}, valid)
    obj = models.load_torch_file(valid)
    models.build_checked_model(obj, obj["model"], str(valid))
    out = tmp_path / "hostile"
    subprocess.run([sys.executable, str(repo / "tools" / "make_hostile_checkpoints.py"), str(valid), str(out)],
                   check=True, capture_output=True)
    cases = json.loads((out / "cases.json").read_text())
    assert [c["name"] for c in cases["cases"]] == ["huge_config", "width_bound", "stride0", "negative_stride",
                                                   "oversize_view", "short_record", "wrong_dtype", "nan_weight",
                                                   "pickle_payload"]
    for case in cases["cases"]:
        with pytest.raises(melforge.FormatError) as e:
            obj = models.load_torch_file(case["file"])
            models.build_checked_model(obj, obj["model"], case["file"])
        assert case["field"] in str(e.value) and case["file"] in str(e.value), (case["name"], str(e.value))
    assert not (out / "payload-ran").exists()
