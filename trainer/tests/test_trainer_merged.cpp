// melforge-train on a dataset made by `melforge-build --shard K/N` plus `melforge-build merge` (virtual datasets
// over the shard files, or --copy): the same tensors, the same streamed batches and the same trained model as on
// the unsharded build of the same corpus; a merged dataset whose shard folder went missing is refused.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <sstream>

#include "data/dataset.h"
#include "data/loader.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_merged {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// The corpus of `root`/in built once unsharded into `root`/single and once as three shards merged into
/// `root`/run/vds (virtual) and `root`/run/copy (--copy), with chunks of `frames_per_chunk` frames.
void build_all(const fs::path& root, int frames_per_chunk) {
  const auto adjust = [&](builder::BuildConfig& c) { c.build.frames_per_chunk = frames_per_chunk; };
  test::build_tone_dataset(root, 3, 7, "single", adjust);
  builder::BuildConfig c = test::tiny_build_config(root / "in-3x7", root / "unused");
  adjust(c);
  const auto dirs = test::build_shards(c, root / "run", 3);
  test::merge_shards(dirs, root / "run/vds", false);
  test::merge_shards(dirs, root / "run/copy", true);
}

void require_same_split(const trainer::Split& a, const trainer::Split& b) {
  INFO(a.path.string() << " vs " << b.path.string());
  CHECK(a.info.first_difference(b.info, "a", "b").empty());
  CHECK(a.class_names == b.class_names);
  CHECK(a.paths == b.paths);
  CHECK(at::equal(a.label, b.label));
  CHECK(a.meta.frame_offset == b.meta.frame_offset);
  CHECK(a.meta.num_samples == b.meta.num_samples);
  CHECK(a.meta.clip_flags == b.meta.clip_flags);
  REQUIRE(a.frames.defined() == b.frames.defined());
  if (a.frames.defined()) CHECK(at::equal(a.frames, b.frames));
}

/// Every batch of two epochs of a loader over `split`'s default tiles (seed 5, batch 7, small windows).
std::vector<at::Tensor> batches(const trainer::Split& split) {
  trainer::LoaderOptions o;
  o.batch_size = 7;
  o.prefetch = 0;
  o.stream_window = 0.05;
  const auto view = trainer::split_view(split, trainer::resolve_view_options({}, split, "cnn"), false);
  trainer::BatchLoader loader(split, *view, split.info.n_frames, o, 5, at::kCPU);
  std::vector<at::Tensor> out;
  for (int64_t epoch : {0, 1}) {
    loader.start_epoch(epoch);
    while (auto b = loader.next()) {
      out.push_back(b->x);
      out.push_back(b->y);
      out.push_back(b->lengths);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the trainer loads a merged dataset with exactly the tensors of the unsharded build",
          "[trainer][shard]") {
  TempDir d;
  const int frames_per_chunk = GENERATE(0, 16);
  CAPTURE(frames_per_chunk);
  build_all(d.path(), frames_per_chunk);
  const trainer::Dataset single = trainer::load_dataset(d / "single");
  for (const std::string merged : {"run/vds", "run/copy"}) {
    CAPTURE(merged);
    const trainer::Dataset m = trainer::load_dataset(d / merged);
    CHECK(m.class_names == single.class_names);
    require_same_split(m.train, single.train);
    require_same_split(m.val, single.val);
    require_same_split(m.test, single.test);

    const trainer::Split a = trainer::open_split_streamed(d / "single/train.h5", "train", 1 << 20);
    const trainer::Split b = trainer::open_split_streamed(d / merged / "train.h5", "train", 1 << 20);
    CHECK(b.reader->rows_per_chunk() == a.reader->rows_per_chunk());
    CHECK(at::equal(b.read_clips(1, 5), a.read_clips(1, 5)));
    const auto xa = batches(a);
    const auto xb = batches(b);
    REQUIRE(xa.size() == xb.size());
    for (size_t i = 0; i < xa.size(); ++i) {
      CAPTURE(i);
      CHECK(at::equal(xa[i], xb[i]));
    }
  }
}

TEST_CASE("training on a merged dataset gives the model trained on the unsharded one", "[trainer][shard][train]") {
  TempDir d;
  build_all(d.path(), 16);
  std::ostringstream log;
  const auto last_of = [&](const std::string& data, const std::string& name, const std::string& stream) {
    auto c = test::tiny_config(d / data, d / name, 2);
    c.data.stream.stream = stream;
    trainer::train(c, log);
    return trainer::load_checkpoint(d / name / "checkpoints/last.pt");
  };
  const std::string stream = GENERATE(std::string("off"), std::string("on"));
  CAPTURE(stream);
  const trainer::Checkpoint single = last_of("single", "t-single", stream);
  const trainer::Checkpoint vds = last_of("run/vds", "t-vds", stream);
  test::require_same_tensors(vds.model, single.model, "model");
  test::require_same_tensors(vds.optimizer, single.optimizer, "optimizer");
}

TEST_CASE("a merged dataset whose source file is missing is refused, naming the file", "[trainer][shard]") {
  TempDir d;
  build_all(d.path(), 0);
  std::string name;
  for (const auto& entry : fs::directory_iterator(d / "run/vds/sources"))
    if (entry.path().filename().string().rfind("train-", 0) == 0) name = entry.path().filename().string();
  REQUIRE(!name.empty());
  fs::rename(d / "run/vds/sources" / name, d / "gone.h5");
  try {
    trainer::load_dataset(d / "run/vds");
    FAIL("a merged dataset with a missing source loaded");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Catch::Contains("sources/" + name) && Catch::Contains("missing"));
  }
  CHECK_NOTHROW(trainer::load_dataset(d / "run/copy"));
}

}  // namespace melforge_test_trainer_merged
