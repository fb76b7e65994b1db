"""melforge.onnx_export (what `melforge-train export --onnx` runs): the ONNX model of an export, run with
onnxruntime, gives the torch twin's L2-normalised embeddings (verification) within 1e-4 for batches of other sizes and
lengths than the traced one; the file holds the weights (no external data) and names its inputs and output."""
import importlib

import numpy as np
import pytest

from melforge_run import write_export

# torch, onnx and onnxruntime are imported inside the tests: collecting this file must not need them
# (tools/wheels_multi.sh deselects the needs_torch tests under Pythons without torch).
pytestmark = pytest.mark.needs_torch

CONFIG = {"model": "resnet-se", "n_mels": 24, "n_frames": 40, "num_classes": 4, "width": "quarter",
          "embedding_dim": 8, "task": "verification"}


def test_the_onnx_model_equals_the_torch_twin_for_two_lengths(tmp_path):
    import onnx
    import onnxruntime
    import torch

    onnx_export = importlib.import_module("melforge.onnx_export")
    net = write_export(tmp_path, CONFIG)
    assert onnx_export.main([str(tmp_path / "weights.pt"), str(tmp_path / "model.onnx")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "weights.pt", "weights.pt.json"]
    proto = onnx.load(str(tmp_path / "model.onnx"))
    assert [i.name for i in proto.graph.input] == ["x", "lengths"]
    assert [o.name for o in proto.graph.output] == ["embedding"]
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    net.eval()
    for frames, batch in ((31, 3), (113, 1)):
        gen = torch.Generator().manual_seed(frames)
        x = torch.randn(batch, 24, frames, generator=gen) * 4.0 - 2.0
        lengths = torch.tensor([frames] + [frames // 2 + b for b in range(batch - 1)])
        with torch.no_grad():
            expected = torch.nn.functional.normalize(net(x, lengths)[1], dim=1).numpy()
        (got,) = session.run(None, {"x": x.numpy(), "lengths": lengths.numpy()})
        assert got.shape == (batch, 8)
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_onnx_export_names_a_missing_export(tmp_path, capsys):
    onnx_export = importlib.import_module("melforge.onnx_export")
    assert onnx_export.main([str(tmp_path / "nothing.pt"), str(tmp_path / "model.onnx")]) == 1
    assert "nothing.pt" in capsys.readouterr().err
    assert not (tmp_path / "model.onnx").exists()
