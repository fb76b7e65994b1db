"""melforge.models with per-utterance cepstral mean normalisation (the model configuration's "cmn", issue 32): a
constant added to a mel bin of a row's real frames leaves the output as it was (and changes it without cmn), a padded
row gives the output of the row alone whatever the padding holds, config() records cmn, a configuration without it
reads off and a non-boolean one is refused. The C++ model against this twin: trainer/tests/
test_trainer_verification_defaults.cpp ("Python's twin reproduces a cmn model's outputs")."""
import pytest

import melforge

pytestmark = pytest.mark.needs_torch

CONFIGS = [
    {"model": "cnn", "n_mels": 16, "n_frames": 24, "num_classes": 3, "channels": [2, 3, 4], "hidden": 8,
     "dropout": 0.3, "time_pool": "mean_max"},
    {"model": "crnn", "n_mels": 16, "n_frames": 24, "num_classes": 3, "channels": [2, 3], "rnn": "gru",
     "rnn_hidden": 6, "hidden": 8, "dropout": 0.3},
    {"model": "resnet-se", "n_mels": 16, "n_frames": 24, "num_classes": 4, "width": "quarter", "embedding_dim": 12},
    {"model": "ecapa", "n_mels": 16, "n_frames": 24, "num_classes": 4, "channels": 16, "embedding_dim": 12},
]


def _model(config, cmn):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return melforge.models.build_model(dict(config, cmn=cmn)).eval()


def _output(model, x, lengths):
    import torch

    with torch.no_grad():
        return model(x, lengths)[1 if model.output_names[1] == "embedding" else 0]


def _relative(a, b):
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1.0)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["model"])
def test_cmn_output_ignores_a_constant_per_mel_bin(config):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 16, 24, generator=g) * 4 - 20
    lengths = torch.tensor([24, 17, 9])
    real = (torch.arange(24)[None, None, :] < lengths[:, None, None]).float()
    shifted = x + torch.randn(3, 16, 1, generator=g) * 6 * real
    on, off = _model(config, True), _model(config, False)
    assert on.config()["cmn"] is True and off.config()["cmn"] is False
    assert _relative(_output(on, shifted, lengths), _output(on, x, lengths)) < 1e-4
    assert _relative(_output(off, shifted, lengths), _output(off, x, lengths)) > 1e-3


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["model"])
def test_cmn_padded_row_gives_the_row_alone(config):
    torch = pytest.importorskip("torch")
    model = _model(config, True)
    x = torch.randn(3, 16, 28, generator=torch.Generator().manual_seed(8)) * 5 - 30
    lengths = torch.tensor([28, 13, 21])
    x = torch.where(torch.arange(28)[None, None, :] >= lengths[:, None, None], torch.tensor(1e4), x)
    batched = _output(model, x, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = _output(model, x[b:b + 1, :, :n].contiguous(), None)
        assert _relative(batched[b:b + 1], alone) < 1e-5, (b, n)


def test_cepstral_mean_normalize_zeroes_the_padding_and_each_bin_mean():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 1, 5, 9, generator=torch.Generator().manual_seed(1)) + 7
    lengths = torch.tensor([9, 4])
    y = melforge.models.cepstral_mean_normalize(x, lengths)
    assert float(y[1, ..., 4:].abs().max()) == 0.0
    assert float(y[1, ..., :4].sum(-1).abs().max()) < 1e-5
    assert torch.allclose(y[0], x[0] - x[0].mean(-1, keepdim=True), atol=1e-6)
    assert torch.allclose(melforge.models.cepstral_mean_normalize(x), x - x.mean(-1, keepdim=True))


def test_cmn_absent_reads_off_and_a_non_boolean_is_refused():
    pytest.importorskip("torch")
    config = CONFIGS[2]
    assert melforge.models.build_model(config).cmn is False
    assert melforge.models.build_model({"model_config": dict(config, cmn=True)}).cmn is True
    with pytest.raises(ValueError, match="cmn"):
        melforge.models.build_model(dict(config, cmn="on"))
