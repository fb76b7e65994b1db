"""torch.export of the speaker models of an export (melforge.models built from `weights.pt.json` and `weights.pt`):
the traced program keeps the batch and time axes dynamic (torch.export.Dim.DYNAMIC) and takes the lengths, and its
outputs equal the eager model's for other batch sizes and lengths than the traced ones (within 1e-5)."""

import pytest

from melforge_run import write_export

# torch is imported inside the tests: collecting this file must not need it (tools/wheels_multi.sh deselects the
# needs_torch tests under Pythons without torch).
pytestmark = pytest.mark.needs_torch

CONFIGS = {
    "resnet-se": {"model": "resnet-se", "n_mels": 24, "n_frames": 40, "num_classes": 4, "width": "quarter",
                  "embedding_dim": 8, "task": "verification"},
    "ecapa": {"model": "ecapa", "n_mels": 24, "n_frames": 40, "num_classes": 4, "channels": 16, "embedding_dim": 8,
              "task": "verification"},
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_exported_speaker_model_traces_with_a_dynamic_time_axis(kind, tmp_path):
    import torch

    net = write_export(tmp_path, CONFIGS[kind]).eval()
    x = torch.randn(2, 24, 40)
    lengths = torch.tensor([40, 27])
    dyn = torch.export.Dim.DYNAMIC
    program = torch.export.export(net, (x, lengths), dynamic_shapes={"x": {0: dyn, 2: dyn}, "lengths": {0: dyn}})
    traced = program.module()
    for frames, batch in ((23, 3), (97, 2)):
        gen = torch.Generator().manual_seed(frames)
        x2 = torch.randn(batch, 24, frames, generator=gen) * 3.0
        lengths2 = torch.tensor([frames] + [max(9, frames // (b + 2)) for b in range(batch - 1)])
        with torch.no_grad():
            eager = net(x2, lengths2)
            got = traced(x2, lengths2)
        for name, a, b in zip(net.output_names, eager, got):
            assert a.shape == b.shape, name
            assert float((a - b).abs().max()) <= 1e-5, f"{kind} T={frames}: {name}"
        # Padding is left out: a row's embedding is that of its real frames alone.
        with torch.no_grad():
            alone = traced(x2[1:2, :, : int(lengths2[1])].contiguous(), lengths2[1:2])
        assert float((alone[1][0] - got[1][1]).abs().max()) <= 1e-4
