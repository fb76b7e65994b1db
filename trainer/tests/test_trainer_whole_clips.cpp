// Issue 28's acceptance tests of evaluation over whole clips, through the builder, train and eval libraries with
// their defaults (only the corpus's sample rate and mel size, the epochs and the model's width are set, for speed):
// - late evidence: each clip's class shows only in its last 2 s of 12 s; whole clips are classified far above
//   chance, while the first 2 s of the same clips (the old default build kept only those) are at chance;
// - variable lengths: clips of 0.3 s to 30 s are all stored, and train then eval score every clip over its whole
//   length (report.json's coverage).
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <cmath>
#include <random>
#include <vector>

#include "data/dataset.h"
#include "eval/evaluate.h"
#include "models/model.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_whole_clips {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int kRate = 4000;

/// Uniform noise of amplitude `amp` and, from sample `tone_from` on, a sine of `hz` (amplitude 0.5).
std::vector<float> noise_then_tone(int64_t samples, int64_t tone_from, double hz, float amp, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> x(static_cast<std::size_t>(samples));
  for (int64_t i = 0; i < samples; ++i)
    x[static_cast<std::size_t>(i)] =
        u(rng) + (i >= tone_from ? 0.5f * static_cast<float>(std::sin(2.0 * M_PI * hz * double(i) / kRate)) : 0.0f);
  return x;
}

/// The builder's defaults but a 4 kHz corpus and a small mel (n_fft 128, hop 64: 62.5 frames a second, 24 bands),
/// tiles of 0.5 s.
builder::BuildConfig small_build(const fs::path& in, const fs::path& out) {
  builder::BuildConfig c;
  c.build.input = in;
  c.build.output = out;
  c.build.quiet = true;
  c.build.threads = 2;
  c.build.device = mel::Device::cpu;
  c.mel.sample_rate = kRate;
  c.mel.n_fft = 128;
  c.mel.win_length = 128;
  c.mel.hop_length = 64;
  c.mel.n_mels = 24;
  c.clips.short_seconds = 0.5;
  return c;
}

/// Accuracy of `model` on `split` with the default evaluation (mean vote over every tile of every clip).
double clip_accuracy(Classifier& model, const Split& split, const EvalOptions& eval) {
  return evaluate(model, split, -1, 1.0, eval, at::kCPU).file.accuracy;
}

/// `split` with each clip cut to its first `frames` frames (the old default build's first 2 s).
Split first_frames(const Split& split, int64_t frames) {
  Split s = split;
  std::vector<at::Tensor> parts;
  std::vector<int64_t> offset = {0};
  for (int64_t c = 0; c < split.files(); ++c) {
    const int64_t n = std::min(frames, split.clip_frames(c));
    parts.push_back(split.frames.narrow(0, split.meta.frame_offset[static_cast<std::size_t>(c)], n));
    offset.push_back(offset.back() + n);
    s.meta.num_samples[static_cast<std::size_t>(c)] = n * split.info.hop_length;
  }
  s.frames = at::cat(parts);
  s.meta.frame_offset = offset;
  return s;
}

}  // namespace

TEST_CASE("late evidence: whole clips are classified far above chance, their first 2 s are at chance",
          "[trainer][evaluate][whole-clips]") {
  // 4 classes x 16 clips of 12 s: noise for 10 s, then the class's tone under the same noise for the last 2 s.
  // Measured (2 cores, CPU, `ctest -R "late evidence"`): 4.0 s; test accuracy from whole clips 1.0; the same model on
  // the first 2 s of each test clip 0.25, chance being 0.25.
  TempDir dir;
  std::mt19937 rng(11);
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 16; ++i)
      test::write_samples(dir / "in" / ("class" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"),
                          noise_then_tone(12 * kRate, 10 * kRate, 350.0 * (c + 1), 0.3f, rng), kRate);
  builder::run_build(small_build(dir / "in", dir / "data"));
  TrainConfig config = test::tiny_config(dir / "data", dir / "run", 8);
  const TrainResult r = train(config, std::cerr);
  REQUIRE(r.test.has_value());
  const Coverage& cov = r.test->coverage;
  CHECK(cov.clips_scored == cov.clips);
  CHECK(cov.frames_covered == cov.frames);
  CHECK(cov.seconds == Approx(12.0 * double(cov.clips)).epsilon(1e-3));
  CHECK(r.test->file.accuracy >= 0.9);

  const Checkpoint best = load_checkpoint(r.run_dir / "checkpoints" / "best.pt");
  const std::shared_ptr<Classifier> model = make_model_from_json(best.model_config);
  load_state_dict(*model, best.model, "best.pt");
  const Dataset ds = load_dataset(dir / "data");
  EvalOptions eval;
  eval.view = resolve_view_options(data::views::ViewOptions{}, ds.test, model->kind());
  CHECK(clip_accuracy(*model, ds.test, eval) == r.test->file.accuracy);
  const Split head = first_frames(ds.test, frame_rate(ds.info).frames(2.0));
  CHECK(clip_accuracy(*model, head, eval) <= 0.5);
}

TEST_CASE("variable lengths: every clip of 0.3 s to 30 s is stored and scored over its whole length",
          "[trainer][evaluate][whole-clips]") {
  // 3 classes x 8 clips whose lengths run from 0.3 s to 30 s (tones at 4 kHz). Measured: 0.9 s.
  TempDir dir;
  std::mt19937 rng(5);
  double total = 0;
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 8; ++i) {
      const double seconds = 0.3 * std::pow(100.0, double((i * 3 + c) % 24) / 23.0);
      const auto samples = static_cast<int64_t>(std::llround(seconds * kRate));
      total += double(samples) / kRate;
      test::write_samples(dir / "in" / ("class" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"),
                          noise_then_tone(samples, 0, 350.0 * (c + 1), 0.05f, rng), kRate);
    }
  builder::run_build(small_build(dir / "in", dir / "data"));
  TrainConfig config = test::tiny_config(dir / "data", dir / "run", 1);
  const TrainResult r = train(config, std::cerr);
  REQUIRE(r.val.has_value());
  REQUIRE(r.test.has_value());
  double scored = 0;
  for (const EvalResult* e : {&*r.val, &*r.test}) {
    CHECK(e->coverage.clips_scored == e->coverage.clips);
    CHECK(e->coverage.frames_covered == e->coverage.frames);
    scored += e->coverage.seconds_scored;
  }
  const Dataset ds = load_dataset(dir / "data");
  double stored = 0;
  for (const Split* s : {&ds.train, &ds.val, &ds.test})
    for (const int64_t n : s->meta.num_samples) stored += double(n) / kRate;
  CHECK(ds.train.files() + ds.val.files() + ds.test.files() == 24);
  CHECK(stored >= 0.999 * total);
  CHECK(scored == Approx(stored - [&] {
          double t = 0;
          for (const int64_t n : ds.train.meta.num_samples) t += double(n) / kRate;
          return t;
        }()));
  const nlohmann::json report = test::read_json(r.run_dir / "report.json");
  CHECK(report["test"]["coverage"]["fraction"] == 1.0);
  CHECK(report["test"]["coverage"]["clips_scored"] == ds.test.files());
}

}  // namespace melforge_test_trainer_whole_clips
