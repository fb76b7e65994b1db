// Issue 32's test of verification training on random crops of variable-length utterances (2-12 s): a corpus of 8
// synthetic speakers (each a voice of its own: a fundamental and harmonics under its own vibrato and noise), built with
// melforge-build (split by speaker), and once with --augment-copies 2, trained 2 epochs with --task verification:
// - the two epochs train on different crops (the crops the run's training loop received, logged by a hook, are
//   the loader's plan for the run's seed, and differ from epoch to epoch), and a resumed run receives the same
//   crops as an uninterrupted one;
// - with copies, each epoch draws one row per utterance (a group: clean copy and its copies), said in the log;
// - the test embeddings cover whole utterances: the report's coverage says every frame of every test clip was
//   embedded, and a test clip's embedding changes when its last 3 s are replaced by another speaker's frames (the
//   issue's "cosine 1.000000" bug), while every other clip's stays.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "build_cli.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "eval/verification.h"
#include "models/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_crops_utterances {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int kRate = 8000;
constexpr int kSpeakers = 8;
constexpr int kUtterances = 3;

/// Utterance `u` of speaker `s`: 2 to 12 s of a fundamental of the speaker's own (110 + 23 s Hz) with 4 harmonics
/// of speaker-dependent weights, a vibrato, and noise.
std::vector<float> voice(int s, int u, std::mt19937& rng) {
  const int seconds = 2 + (s * 5 + u * 7) % 11;
  const auto n = static_cast<std::size_t>(seconds * kRate);
  std::normal_distribution<float> noise(0.0f, 0.03f);
  std::vector<float> x(n);
  const double f0 = 110.0 + 23.0 * s, vibrato = 3.0 + 0.7 * s;
  double phase = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double t = double(i) / kRate;
    phase += 2.0 * M_PI * f0 * (1.0 + 0.03 * std::sin(2.0 * M_PI * vibrato * t)) / kRate;
    double v = 0;
    for (int h = 1; h <= 4; ++h) v += std::sin(h * phase) * (0.3 / h) * (1.0 + 0.8 * std::cos(0.9 * h * (s + 1)));
    x[i] = static_cast<float>(0.5 * v) + noise(rng);
  }
  return x;
}

/// Writes the corpus (spk<s>/utt<u>.wav) under `in` once.
void write_corpus(const fs::path& in) {
  if (fs::exists(in)) return;
  std::mt19937 rng(32);
  for (int s = 0; s < kSpeakers; ++s)
    for (int u = 0; u < kUtterances; ++u)
      test::write_samples(in / ("spk" + std::to_string(s)) / ("utt" + std::to_string(u) + ".wav"), voice(s, u, rng),
                          kRate);
}

/// Builds `in` into `out` through melforge-build's flags: 8 kHz, 32 mels, hop 64 (125 frames a second), split by
/// speaker 4/2/2, with `more` flags after.
void build(const fs::path& in, const fs::path& out, const std::vector<std::string>& more) {
  builder::BuildConfig config;
  std::string config_file;
  boost::program_options::options_description all;
  builder::add_build_groups(all, config, config_file);
  std::vector<std::string> args = {"--input", in.string(), "--output", out.string(), "--split-by", "class",
                                   "--split", "0.5,0.25,0.25", "--sample-rate", "8000", "--n-fft", "256",
                                   "--hop-length", "64", "--n-mels", "32", "--short-seconds", "0.5",
                                   "--device", "cpu", "--threads", "2", "--quiet"};
  args.insert(args.end(), more.begin(), more.end());
  std::ostringstream help;
  REQUIRE(builder::parse_build_args(args, all, help));
  builder::run_build(config);
}

/// A tiny resnet-se verification run of `data` into `out`: 2 epochs, crops of 2 s (the defaults), batch 8.
TrainConfig verification_config(const fs::path& data, const fs::path& out) {
  TrainConfig c = test::tiny_config(data, out, 2);
  c.train.task = "verification";
  c.model.model = "resnet-se";
  c.model.width = "quarter";
  c.model.embedding_dim = 32;
  c.loader.batch_size = 8;
  c.runtime.threads = 1;
  c.runtime.log_level = "info";
  return c;
}

/// The crops a run's training loop received: per epoch, clip row -> its frames (float32 [n_mels, T]).
using CropLog = std::map<int64_t, std::map<int64_t, at::Tensor>>;

/// A hook that records every training row's crop in `log` (each clip at most once an epoch).
TrainHooks logging_hooks(CropLog& log) {
  TrainHooks hooks;
  hooks.on_batch = [&log](int64_t epoch, Batch& b) {
    for (int64_t i = 0; i < b.x.size(0); ++i) {
      const int64_t clip = b.clip[i].item<int64_t>();
      REQUIRE(log[epoch].count(clip) == 0);
      log[epoch][clip] = b.x[i].narrow(1, 0, b.lengths[i].item<int64_t>()).clone();
    }
  };
  return hooks;
}

/// The run's crops of `epoch` as its loader plans them from the run's seed and view (config.json), clip -> frames.
std::map<int64_t, at::Tensor> planned(const Split& train, const fs::path& run, int64_t epoch) {
  const nlohmann::json config = test::read_json(run / "config.json");
  data::views::ViewOptions vo;
  vo.view = config["view"]["view"].get<std::string>();
  vo.crop_seconds = config["view"]["crop_seconds"].get<double>();
  vo.aug_prob = config["view"]["aug_prob"].get<double>();
  const auto view = split_view(train, vo, false);
  const int64_t frames = example_frames(vo, train);
  LoaderOptions lo;
  BatchLoader loader(train, *view, frames, lo, config["model"]["seed"].get<uint64_t>(), at::kCPU);
  std::map<int64_t, at::Tensor> out;
  const auto examples = loader.epoch_examples(epoch);
  const ExampleBatch b = gather_examples(train, examples, frames);
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    out[examples[i].clip] = b.x[row].narrow(1, 0, b.lengths[row].item<int64_t>());
  }
  return out;
}

/// Rows of `log` and `plan` are the same clips with the same frames.
bool same_crops(const std::map<int64_t, at::Tensor>& log, const std::map<int64_t, at::Tensor>& plan) {
  if (log.size() != plan.size()) return false;
  for (const auto& [clip, x] : log)
    if (!plan.count(clip) || !at::equal(x, plan.at(clip))) return false;
  return true;
}

}  // namespace

TEST_CASE("verification on crops of 2-12 s utterances: new crops each epoch, exact resume, whole-utterance tests",
          "[trainer][crops_utterances]") {
  TempDir d;
  write_corpus(d / "in");
  build(d / "in", d / "data", {});
  const Dataset ds = load_dataset(d / "data");
  REQUIRE(ds.train.files() == 4 * kUtterances);
  REQUIRE(ds.test.files() == 2 * kUtterances);

  CropLog straight_log, piece_log;
  std::ostringstream log;
  const TrainResult r = train(verification_config(d / "data", d / "straight"), log, logging_hooks(straight_log));
  REQUIRE(r.epochs_done == 2);
  REQUIRE(straight_log.size() == 2);
  for (int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    CHECK(straight_log[epoch].size() == static_cast<std::size_t>(ds.train.files()));
    CHECK(same_crops(straight_log[epoch], planned(ds.train, d / "straight", epoch)));
  }
  const int64_t crop = frame_rate(ds.info).frames(2.0);
  int64_t changed = 0, long_changed = 0, long_clips = 0;
  for (const auto& [clip, x] : straight_log[0]) {
    const bool other = !at::equal(x, straight_log[1][clip]);
    changed += other;
    if (ds.train.clip_frames(clip) >= 2 * crop) {
      ++long_clips;
      long_changed += other;
    }
  }
  CAPTURE(changed, long_changed, long_clips);
  CHECK(changed >= 2 * ds.train.files() / 3);
  CHECK(long_clips >= 3);
  CHECK(long_changed == long_clips);

  TrainConfig first = verification_config(d / "data", d / "pieces");
  TrainHooks stop = logging_hooks(piece_log);
  stop.on_epoch_end = [](int64_t) { return false; };
  CHECK(train(first, log, stop).epochs_done == 1);
  TrainConfig resume;
  resume.train.resume = d / "pieces";
  resume.runtime.threads = 1;
  resume.runtime.log_level = "warn";
  CHECK(train(resume, log, logging_hooks(piece_log)).epochs_done == 2);
  CHECK(same_crops(piece_log[0], straight_log[0]));
  CHECK(same_crops(piece_log[1], straight_log[1]));

  REQUIRE(r.test.has_value());
  const Coverage& cov = r.test->coverage;
  CHECK(cov.view == "clips");
  CHECK(cov.clips_scored == ds.test.files());
  CHECK(cov.frames_covered == cov.frames);
  CHECK(cov.frames == ds.test.total_frames());
  const nlohmann::json report = test::read_json(r.run_dir / "report.json");
  CHECK(report["test"]["coverage"]["fraction"] == 1.0);

  const Checkpoint best = load_checkpoint(r.run_dir / "checkpoints" / "best.pt");
  const std::shared_ptr<Classifier> model = make_model_from_json(best.model_config, /*any_task=*/true);
  load_state_dict(*model, best.model, "best.pt");
  Coverage embedded;
  const at::Tensor e = embed_split(*model, ds.test, 64, at::kCPU, at::kFloat, &embedded);
  CHECK(embedded.frames_covered == ds.test.total_frames());
  int64_t longest = 0, other = -1;
  for (int64_t c = 1; c < ds.test.files(); ++c)
    if (ds.test.clip_frames(c) > ds.test.clip_frames(longest)) longest = c;
  const int64_t tail = frame_rate(ds.info).frames(3.0);
  for (int64_t c = 0; c < ds.test.files(); ++c)
    if (ds.test.label[c].item<int64_t>() != ds.test.label[longest].item<int64_t>() && ds.test.clip_frames(c) >= tail)
      other = c;
  REQUIRE(other >= 0);
  REQUIRE(ds.test.clip_frames(longest) >= 2 * tail);
  Split spliced = ds.test;
  spliced.frames = ds.test.frames.clone();
  const int64_t end = ds.test.meta.frame_offset[static_cast<std::size_t>(longest) + 1];
  spliced.frames.narrow(0, end - tail, tail).copy_(ds.test.read_clips(other, 1).narrow(0, 0, tail));
  const at::Tensor e2 = embed_split(*model, spliced, 64, at::kCPU);
  const at::Tensor cosine = (e * e2).sum(1);
  const double moved = cosine[longest].item<double>();
  std::cout << "crops_utterances: cosine of the " << double(ds.test.clip_frames(longest)) / 125.0
            << " s test clip with its last 3 s replaced: " << moved << "\n";
  CHECK(moved < 0.9999);
  for (int64_t c = 0; c < ds.test.files(); ++c)
    if (c != longest) CHECK(cosine[c].item<double>() == Approx(1.0).margin(1e-5));
}

TEST_CASE("verification on crops with --augment-copies 2: one row per utterance each epoch, stated in the log",
          "[trainer][crops_utterances]") {
  TempDir d;
  write_corpus(d / "in");
  build(d / "in", d / "copies", {"--augment-copies", "2", "--speed", "0.9,1.1", "--gain-db", "-6,3"});
  const Dataset ds = load_dataset(d / "copies");
  const std::vector<int64_t> groups = ds.train.meta.group_offsets();
  REQUIRE(ds.train.files() == 3 * 4 * kUtterances);
  REQUIRE(groups.size() == static_cast<std::size_t>(4 * kUtterances + 1));
  CHECK(ds.test.meta.group_offsets().size() == static_cast<std::size_t>(ds.test.files() + 1));

  CropLog crops;
  std::ostringstream log;
  const TrainResult r = train(verification_config(d / "copies", d / "run"), log, logging_hooks(crops));
  REQUIRE(r.epochs_done == 2);
  CHECK_THAT(log.str(), Catch::Contains("crops: 12 utterances, 2 copies each, aug-prob 0.6"));
  CHECK_THAT(log.str(), Catch::Contains("train: 12 examples an epoch"));
  int64_t augmented = 0;
  for (int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    REQUIRE(crops[epoch].size() == groups.size() - 1);
    std::vector<int> seen(groups.size() - 1, 0);
    for (const auto& [clip, x] : crops[epoch]) {
      ++seen[static_cast<std::size_t>(std::upper_bound(groups.begin(), groups.end(), clip) - groups.begin() - 1)];
      augmented += ds.train.meta.aug_copy[static_cast<std::size_t>(clip)] > 0;
    }
    CHECK(seen == std::vector<int>(groups.size() - 1, 1));
    CHECK(same_crops(crops[epoch], planned(ds.train, d / "run", epoch)));
  }
  CHECK(augmented > 0);
  CHECK(augmented < 24);
  const nlohmann::json config = test::read_json(d / "run" / "config.json");
  CHECK(config["view"]["aug_prob"] == 0.6);
}

}  // namespace melforge_test_trainer_crops_utterances
