"""The builder's resampler attributes and per-file source_sample_rate dataset, read back with h5py from a build of
files at 8 and 16 kHz (docs/FORMAT.md)."""
import pytest

from melforge_run import binary, run, write_tone

pytestmark = pytest.mark.needs_h5py


def test_resampler_attributes_and_source_rates(tmp_path):
    h5py = pytest.importorskip("h5py")
    build_bin = binary("MELFORGE_BUILD_BIN", "builder/melforge-build")
    rates = {}
    for c in range(2):
        for i, rate in enumerate((8000, 16000, 22050, 44100)):
            write_tone(tmp_path / "in" / f"c{c}" / f"r{rate}.wav", 400 + 300 * c, 1.2, rate, seed=i)
            rates[f"c{c}/r{rate}.wav"] = rate
    run([build_bin, "--input", tmp_path / "in", "--output", tmp_path / "out", "--sample-rate", 16000, "--n-fft", 512,
         "--n-mels", 40, "--split", "0.5,0.25,0.25", "--device", "cpu", "--quiet"])
    seen = {}
    for split in ("train", "val", "test"):
        with h5py.File(tmp_path / "out" / f"{split}.h5", "r") as f:
            assert f.attrs["resampler"] == "soxr"
            assert f.attrs["resampler_quality"] == "HQ"
            assert f.attrs["resampler_phase"] == "linear"
            assert f.attrs["resampler_version"].startswith("libsoxr-")
            assert f.attrs["schema_version"] == 3
            ds = f["source_sample_rate"]
            assert ds.dtype == "int32" and ds.shape == f["label"].shape
            seen.update(zip(f["path"].asstr()[...], ds[...].tolist()))
    assert seen == rates
