// A dataset built with --features fbank (issue 31) trains, evaluates, predicts and embeds, and every program follows
// its front-end: the checkpoint's config and the export carry the fbank parameters, raw audio is featurized with
// Kaldi's filterbank at predict and embed time (the frames the builder stored), and a checkpoint is refused on a
// dataset of the other front-end, naming both. Feature values are the kernel's business; these tests compare the
// programs with each other, on tiny tone corpora (one epoch each): raw audio featurized alone equals the frames the
// builder stored in its batches to float32 rounding (the last bits of the weakest bands may differ; the other
// front-end's features differ by whole log units), so the datasets are float32, which no float16 step amplifies.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <map>
#include <sstream>

#include "data/dataset.h"
#include "embed/embed_command.h"
#include "export/export.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "predict/predict.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_fbank {

using namespace melforge;
using melforge::test::read_json;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// Kaldi fbank at 8 kHz as a recipe sets it (25/10 ms hamming frames, dither 0) with 31 bins and the energy column:
/// 32 columns, the width of the mel tone datasets, so the models are the tests' usual ones.
fbank::FbankArgs recipe() {
  fbank::FbankArgs f;
  f.num_mel_bins = 31;
  f.use_energy = true;
  f.window_type = fbank::KaldiWindow::hamming;
  f.dither = 0;
  return f;
}

/// A tone dataset of `classes` x `per_class` files under `root/name` built with recipe(), stored as float32; split
/// by class for speakers.
fs::path build_fbank(const fs::path& root, int classes, int per_class, const std::string& name, bool by_class) {
  return test::build_tone_dataset(root, classes, per_class, name, [by_class](builder::BuildConfig& c) {
    c.mel.use_fbank(recipe());
    c.build.dtype = mel::DType::float32;
    if (by_class) c.build.split_by = builder::SplitBy::class_;
  });
}

/// The float32 rows of the dataset `name` of an HDF5 file.
std::vector<float> read_rows(const fs::path& file, const std::string& name) {
  const h5::File f = h5::open_file(file);
  const h5::Dataset ds = h5::open_dataset(f, name);
  int64_t n = 1;
  for (const int64_t d : h5::dims(ds)) n *= d;
  std::vector<float> values(static_cast<std::size_t>(n));
  REQUIRE(H5Dread(ds.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  return values;
}

}  // namespace

TEST_CASE("an fbank speaker dataset trains, evaluates and embeds raw audio with Kaldi's filterbank",
          "[trainer][fbank][verification]") {
  TempDir d;
  const fs::path data = build_fbank(d.path(), 12, 4, "fb", true);
  const trainer::Dataset ds = trainer::load_dataset(data, trainer::StreamOptions{});
  REQUIRE(ds.info.is_fbank());
  CHECK(ds.info.n_mels == 32);
  CHECK(ds.info.fbank.num_mel_bins == 31);

  trainer::TrainConfig c = test::tiny_config(data, d / "run", 1);
  c.model.model = "resnet-se";
  c.model.width = "quarter";
  c.model.embedding_dim = 32;
  c.train.task = "verification";
  c.verify.trial_count = 200;
  c.runtime.threads = 1;
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(c, log);
  REQUIRE(r.test.has_value());
  CHECK(r.test->is_verification);
  const nlohmann::json config = read_json(d / "run" / "config.json");
  CHECK(config["mel"]["features"] == "fbank");
  CHECK(config["mel"]["num_mel_bins"] == 31);
  CHECK(config["mel"]["window_type"] == "hamming");
  const fs::path best = d / "run" / "checkpoints" / "best.pt";
  const data::MelInfo saved = data::MelInfo::from_json(trainer::load_checkpoint(best).mel);
  CHECK(saved.first_difference(ds.info, "the checkpoint", "the dataset").empty());

  trainer::EmbedOptions o;
  o.checkpoint = best;
  o.data = data;
  o.split = "test";
  o.out = d / "split.h5";
  o.threads = 2;
  std::ostringstream out;
  REQUIRE(trainer::run_embed(o, out, log).embedded == ds.test.files());
  const std::vector<float> stored = read_rows(o.out, "embedding");

  trainer::EmbedOptions a = o;
  a.data.clear();
  a.out = d / "audio.h5";
  const fs::path corpus = d / "in-12x4";
  a.inputs = {corpus / ds.test.paths[0], corpus / ds.test.paths[1]};
  REQUIRE(trainer::run_embed(a, out, log).embedded == 2);
  const std::vector<float> raw = read_rows(a.out, "embedding");
  REQUIRE(raw.size() == 2 * 32);
  for (std::size_t i = 0; i < raw.size(); ++i) CHECK(raw[i] == Approx(stored[i]).margin(2e-3));

  SECTION("a mel dataset is refused by the fbank checkpoint, naming both front-ends") {
    const fs::path mel = test::build_tone_dataset(d.path(), 12, 4, "mel");
    trainer::EmbedOptions m = o;
    m.data = mel;
    m.out = d / "mel.h5";
    CHECK_THROWS_WITH(trainer::run_embed(m, out, log),
                      Catch::Contains("features is fbank in the checkpoint") && Catch::Contains("mel in the dataset"));
    CHECK_FALSE(fs::exists(m.out));
  }
}

TEST_CASE("an fbank classifier predicts raw files from the frames the builder stored, and its export carries fbank",
          "[trainer][fbank][predict]") {
  TempDir d;
  const fs::path data = build_fbank(d.path(), 3, 4, "fb", false);
  const trainer::Dataset ds = trainer::load_dataset(data, trainer::StreamOptions{});
  REQUIRE(ds.info.is_fbank());
  const fs::path corpus = d / "in-3x4";
  int64_t compared = 0;
  for (const trainer::Split* split : {&ds.train, &ds.val, &ds.test}) {
    for (int64_t f = 0; f < split->files(); ++f) {
      CAPTURE(split->name, split->paths[f]);
      const at::Tensor got = trainer::featurize_clip(corpus / split->paths[f], ds.info, 2);
      const at::Tensor want = split->read_clips(f, 1);
      REQUIRE(got.sizes() == want.sizes());
      CHECK(got.size(1) == 32);
      CHECK(got.size(0) == split->clip_frames(f));
      CHECK(at::allclose(got, want, 1e-3, 0.02));
      ++compared;
    }
  }
  CHECK(compared == 15);

  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(test::tiny_config(data, d / "run", 1), log);
  REQUIRE(r.test.has_value());
  trainer::PredictOptions p;
  p.checkpoint = d / "run" / "checkpoints" / "best.pt";
  p.inputs = {corpus / "class0", corpus / "class2"};
  p.format = "json";
  p.threads = 2;
  p.device = "cpu";
  std::ostringstream out;
  trainer::run_predict(p, out, log);
  const auto rows = nlohmann::json::parse(out.str());
  REQUIRE(rows.size() == 10);
  for (const auto& row : rows) {
    CAPTURE(row.dump());
    CHECK_FALSE(row.contains("error"));
    CHECK(row["probabilities"].size() == 3);
  }

  trainer::ExportOptions e;
  e.checkpoint = p.checkpoint;
  e.out = d / "weights.pt";
  trainer::run_export(e, out);
  const nlohmann::json meta = read_json(d / "weights.pt.json");
  CHECK(meta["mel"]["features"] == "fbank");
  CHECK(meta["mel"]["use_energy"] == 1);
  const data::MelInfo exported = data::MelInfo::from_json(meta["mel"]);
  CHECK(exported.first_difference(ds.info, "the export", "the dataset").empty());
  CHECK(exported.mel_args().is_fbank());
}

}  // namespace melforge_test_trainer_fbank
