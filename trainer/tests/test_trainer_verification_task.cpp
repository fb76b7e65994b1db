// --task verification end to end on a tiny tone corpus split by class (each tone a "speaker", unseen tones in val and
// test): training with the AAM-softmax loss, validation by EER, the report and DET curve, exact resume, `eval` with
// generated and listed trials and AS-norm, `embed` on a dataset split and on raw audio, export to Python, and the
// refusals around the task. The embeddings and the EER are checked against a naive per-file computation here.
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include "catch_torch.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "data/dataset.h"
#include "embed/embed_command.h"
#include "eval/eval_command.h"
#include "eval/verification.h"
#include "export/export.h"
#include "export_check.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "models/model.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"
#include "venv_python.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_verification_task {

using namespace melforge;
using melforge::test::read_json;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// 12 tone classes of 4 files (and a stereo file) each, split by class: 7 train, 2 val, 3 test classes.
fs::path build_speakers(const fs::path& root) {
  return test::build_tone_dataset(root, 12, 4, "data",
                                  [](builder::BuildConfig& c) { c.build.split_by = builder::SplitBy::class_; });
}

/// A quarter-width resnet-se with 32-value embeddings for --task verification on `data`, on one thread (ctest -j2
/// runs two tests at once: two threads each would oversubscribe the 2 cores, and the resnet's many small kernels
/// then wait at every OpenMP barrier, measured 30x slower).
trainer::TrainConfig speaker_config(const fs::path& data, const fs::path& out, int64_t epochs) {
  trainer::TrainConfig c = test::tiny_config(data, out, epochs);
  c.model.model = "resnet-se";
  c.model.width = "quarter";
  c.model.embedding_dim = 32;
  c.train.task = "verification";
  c.verify.trial_count = 200;
  c.runtime.threads = 1;
  return c;
}

/// The naive per-file embeddings of `split`: each clip through the model one clip at a time (schema 3: the whole
/// clip; schema 1/2: its stored short segments, their embeddings averaged), divided by the norm, in double.
at::Tensor naive_embeddings(trainer::Classifier& model, const trainer::Split& split) {
  model.eval();
  c10::NoGradGuard no_grad;
  const int64_t M = split.info.n_mels, T = split.info.n_frames;
  std::vector<at::Tensor> rows;
  for (int64_t f = 0; f < split.files(); ++f) {
    const at::Tensor frames = split.read_clips(f, 1);
    const at::Tensor x = split.meta.schema_version >= 3 ? frames.t().unsqueeze(0).contiguous()
                                                        : frames.reshape({-1, T, M}).transpose(1, 2).contiguous();
    const at::Tensor mean = model.forward(x).embedding.to(at::kDouble).mean(0);
    rows.push_back(mean / mean.norm());
  }
  return at::stack(rows);
}

std::vector<int32_t> labels_of(const trainer::Split& split) {
  std::vector<int32_t> out;
  for (int64_t f = 0; f < split.files(); ++f) out.push_back(static_cast<int32_t>(split.label[f].item<int64_t>()));
  return out;
}

/// The EER (percent) of `trials` scored by the cosine of rows of `emb` (double [F, E]) computed here.
double naive_eer(const at::Tensor& emb, const std::vector<verification::Trial>& trials) {
  std::vector<float> scores;
  for (const auto& t : trials)
    scores.push_back(static_cast<float>((emb[t.enroll] * emb[t.test]).sum().item<double>()));
  return 100.0 * verification::error_rates(scores, verification::trial_targets(trials)).eer;
}

std::shared_ptr<trainer::Classifier> load_model(const fs::path& checkpoint) {
  const trainer::Checkpoint c = trainer::load_checkpoint(checkpoint);
  auto model = trainer::make_model_from_json(c.model_config, /*any_task=*/true);
  trainer::load_state_dict(*model, c.model, checkpoint.string());
  return model;
}

/// One trained run shared by the tests that only read it: 2 epochs with a margin warm-up over both.
struct SharedRun {
  TempDir dir;
  fs::path data, run;
  trainer::TrainResult result;
  SharedRun() {
    data = build_speakers(dir.path());
    run = dir / "run";
    trainer::TrainConfig c = speaker_config(data, run, 2);
    c.train.margin_warmup = 2;
    std::ostringstream log;
    result = trainer::train(c, log);
  }
};

SharedRun& shared() {
  static SharedRun r;
  return r;
}

}  // namespace

TEST_CASE("a speaker run trains with AAM, validates by EER and writes its report and DET curve",
          "[trainer][verification]") {
  const SharedRun& s = shared();
  REQUIRE(s.result.test.has_value());
  CHECK(s.result.test->is_verification);
  const auto lines = test::epoch_lines(s.run / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  double best = 1e9;
  int64_t best_epoch = 0;
  for (const auto& l : lines) {
    CHECK(l.contains("val_eer"));
    CHECK(l.contains("val_min_dcf_0.01"));
    CHECK_FALSE(l.contains("val_accuracy"));
    CHECK(l["train_loss"].get<double>() > 0);
    if (l["val_eer"].get<double>() < best) {
      best = l["val_eer"].get<double>();
      best_epoch = l["epoch"].get<int64_t>();
    }
  }
  // The margin rises over both epochs' steps: half of it after the first, all of it after the second.
  CHECK(lines[0]["margin"].get<double>() == Approx(0.1));
  CHECK(lines[1]["margin"].get<double>() == Approx(0.2));
  CHECK(s.result.best_epoch == best_epoch);
  const nlohmann::json report = read_json(s.run / "report.json");
  CHECK(report["task"] == "verification");
  CHECK(report["best_metric"] == "val_eer");
  const double eer = report["test"]["verification"]["EER"].get<double>();
  CHECK(eer == Approx(100.0 * s.result.test->verification.eer));
  CHECK(eer >= 0);
  CHECK(eer <= 100);
  CHECK(report["test"]["verification"]["targets"].get<int64_t>() > 0);
  const nlohmann::json config = read_json(s.run / "config.json");
  CHECK(config["model_config"]["task"] == "verification");
  CHECK(config["positive_class"] == "none");
  std::ifstream png(s.run / "det_test.png", std::ios::binary);
  std::string magic(8, '\0');
  png.read(magic.data(), 8);
  CHECK(magic == std::string("\x89PNG\r\n\x1a\n", 8));

  SECTION("the report's EER is that of naive per-file embeddings of best.pt on the same trials") {
    auto model = load_model(s.run / "checkpoints" / "best.pt");
    const trainer::Dataset d = trainer::load_dataset(s.data, trainer::StreamOptions{});
    const at::Tensor naive = naive_embeddings(*model, d.test);
    const at::Tensor fast = trainer::embed_split(*model, d.test, 1024, at::kCPU);
    CHECK(at::allclose(fast.to(at::kDouble), naive, 1e-6, 1e-5));
    trainer::VerifyOptions v;
    v.trial_count = 200;
    const auto trials = trainer::split_trials(labels_of(d.test), d.test.paths, v, false, "test");
    CHECK(naive_eer(naive, trials) == Approx(eer).margin(1e-9));
  }
}

TEST_CASE("the margin warm-up changes the training, and a speaker run resumes bit-exactly", "[trainer][verification]") {
  TempDir d;
  const fs::path data = build_speakers(d.path());
  std::ostringstream log;
  trainer::TrainConfig straight = speaker_config(data, d / "straight", 2);
  straight.train.margin_warmup = 0.5;
  trainer::train(straight, log);
  trainer::TrainConfig first = speaker_config(data, d / "resumed", 1);
  first.train.margin_warmup = 0.5;
  first.train.epochs = 2;
  trainer::TrainHooks stop_after_one;
  stop_after_one.on_epoch_end = [](int64_t epoch) { return epoch < 0; };
  trainer::train(first, log, stop_after_one);
  trainer::TrainConfig resume;
  resume.train.resume = d / "resumed";
  resume.runtime = first.runtime;
  trainer::train(resume, log);
  const auto a = trainer::load_checkpoint(d / "straight" / "checkpoints" / "last.pt");
  const auto b = trainer::load_checkpoint(d / "resumed" / "checkpoints" / "last.pt");
  REQUIRE(b.epoch == 2);
  test::require_same_tensors(a.model, b.model, "resumed");

  SECTION("the comparison can fail: without the warm-up the weights differ") {
    trainer::TrainConfig plain = speaker_config(data, d / "plain", 2);
    trainer::train(plain, log);
    const auto c = trainer::load_checkpoint(d / "plain" / "checkpoints" / "last.pt");
    bool differ = false;
    for (const auto& [name, t] : a.model) differ = differ || !at::equal(t, c.model.at(name));
    CHECK(differ);
  }
}

TEST_CASE("a speaker run trains with bf16 autocast, gradient accumulation and clipping", "[trainer][verification]") {
  TempDir d;
  const fs::path data = build_speakers(d.path());
  trainer::TrainConfig c = speaker_config(data, d / "run", 1);
  c.train.amp = "bf16";
  c.optim.accumulate = 2;
  c.optim.clip_norm = 0.5;
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(c, log);
  REQUIRE(r.test.has_value());
  CHECK(std::isfinite(r.test->verification.eer));
  const auto lines = test::epoch_lines(d / "run" / "metrics.jsonl");
  REQUIRE(lines.size() == 1);
  CHECK(std::isfinite(lines[0]["train_loss"].get<double>()));
  const nlohmann::json config = read_json(d / "run" / "config.json");
  CHECK(config["optim"]["accumulate"] == 2);
  CHECK(config["train"]["amp"] == "bf16");
}

TEST_CASE("CUDA: a speaker run with bf16, a resident split and its AAM step captured in a CUDA graph",
          "[trainer][verification][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  TempDir d;
  const fs::path data = build_speakers(d.path());
  trainer::TrainConfig c = speaker_config(data, d / "run", 4);
  c.runtime.device = "cuda";
  c.runtime.log_level = "info";
  c.train.amp = "bf16";
  c.train.cuda_graph = true;
  c.loader.gpu_mem = 64;
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(c, log);
  INFO(log.str());
  REQUIRE(r.test.has_value());
  CHECK(std::isfinite(r.test->verification.eer));
  CHECK_THAT(log.str(), Catch::Contains("captured the training step in a CUDA Graph"));
  const auto lines = test::epoch_lines(d / "run" / "metrics.jsonl");
  REQUIRE(lines.size() == 4);
  CHECK(lines.back()["train_loss"].get<double>() < lines.front()["train_loss"].get<double>());
}

TEST_CASE("eval scores a speaker checkpoint on generated or listed trials, with AS-norm, and names the EER",
          "[trainer][verification]") {
  const SharedRun& s = shared();
  trainer::EvalCommandOptions e;
  e.checkpoint = s.run / "checkpoints" / "best.pt";
  e.verify.trial_count = 200;
  trainer::DataOptions data;
  data.data = s.data;
  trainer::EvalOptions eval;
  trainer::RuntimeOptions runtime;
  runtime.threads = 2;
  std::ostringstream out, log;
  const nlohmann::json generated = trainer::run_eval(e, data, eval, runtime, out, log);
  CHECK(generated["task"] == "verification");
  CHECK(generated["EER"].get<double>() == Approx(100.0 * s.result.test->verification.eer).margin(1e-9));
  CHECK_THAT(out.str(), Catch::Contains("EER "));

  // The same trials written as a VoxCeleb list give the same EER.
  const trainer::Dataset d = trainer::load_dataset(s.data, /*load_mel=*/false);
  const auto trials = trainer::split_trials(labels_of(d.test), d.test.paths, e.verify, false, "test");
  {
    std::ofstream list(s.dir / "trials.txt");
    for (const auto& t : trials)
      list << (t.target ? 1 : 0) << ' ' << d.test.paths[static_cast<std::size_t>(t.enroll)] << ' '
           << d.test.paths[static_cast<std::size_t>(t.test)] << '\n';
  }
  e.verify.trials = {s.dir / "trials.txt"};
  e.det_png = s.dir / "det.png";
  const nlohmann::json listed = trainer::run_eval(e, data, eval, runtime, out, log);
  CHECK(listed["EER"].get<double>() == Approx(generated["EER"].get<double>()).margin(1e-9));
  CHECK(listed["verification"]["trials"] == (s.dir / "trials.txt").string());
  CHECK(fs::file_size(s.dir / "det.png") > 100);

  e.verify.as_norm = 4;
  const nlohmann::json normed = trainer::run_eval(e, data, eval, runtime, out, log);
  CHECK(normed["verification"]["scoring"] == "as-norm");
  CHECK(std::isfinite(normed["EER"].get<double>()));
  CHECK(normed["verification"]["targets"] == listed["verification"]["targets"]);

  // A path the split does not hold is refused with the list's line.
  {
    std::ofstream bad(s.dir / "bad.txt");
    bad << "1 nowhere/a.wav " << d.test.paths[0] << '\n';
  }
  e.verify.trials = {s.dir / "bad.txt"};
  CHECK_THROWS_WITH(trainer::run_eval(e, data, eval, runtime, out, log),
                    Catch::Contains("bad.txt") && Catch::Contains("nowhere/a.wav"));
}

TEST_CASE("embed writes per-file embeddings of a split or of audio files that h5py-style readers get back",
          "[trainer][verification]") {
  const SharedRun& s = shared();
  trainer::EmbedOptions o;
  o.checkpoint = s.run / "checkpoints" / "best.pt";
  o.data = s.data;
  o.split = "test";
  o.out = s.dir / "emb.h5";
  o.threads = 2;
  std::ostringstream out, log;
  const trainer::EmbedSummary sum = trainer::run_embed(o, out, log);
  const trainer::Dataset d = trainer::load_dataset(s.data, trainer::StreamOptions{});
  CHECK(sum.embedded == d.test.files());
  h5::File f = h5::open_file(o.out);
  const std::vector<std::string> paths = h5::read_strings(f, "path");
  CHECK(paths == d.test.paths);
  CHECK(h5::read_int32(f, "label") == labels_of(d.test));
  const h5::Dataset ds = h5::open_dataset(f, "embedding");
  REQUIRE(h5::dims(ds) == std::vector<int64_t>{d.test.files(), 32});
  std::vector<float> values(static_cast<std::size_t>(d.test.files() * 32));
  REQUIRE(H5Dread(ds.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  const at::Tensor stored = at::from_blob(values.data(), {d.test.files(), 32}, at::kFloat).clone();
  auto model = load_model(o.checkpoint);
  CHECK(at::allclose(stored.to(at::kDouble), naive_embeddings(*model, d.test), 1e-6, 1e-5));
  CHECK(h5::read_attribute_string(f, "source") == "dataset");
  CHECK_FALSE(fs::exists(o.out.string() + ".partial"));

  SECTION("raw audio through the builder's featurization gives the dataset's embeddings, and a bad file is skipped") {
    const fs::path corpus = s.dir / "in-12x4";
    trainer::EmbedOptions a = o;
    a.data.clear();
    a.out = s.dir / "audio.h5";
    a.inputs = {corpus / d.test.paths[0], corpus / d.test.paths[1], s.dir / "trials_missing.wav"};
    const trainer::EmbedSummary raw = trainer::run_embed(a, out, log);
    CHECK(raw.embedded == 2);
    CHECK(raw.skipped == 1);
    h5::File g = h5::open_file(a.out);
    CHECK(h5::read_strings(g, "skipped_path") == std::vector<std::string>{(s.dir / "trials_missing.wav").string()});
    CHECK(h5::read_int32(g, "label") == std::vector<int32_t>{-1, -1});
    const h5::Dataset gd = h5::open_dataset(g, "embedding");
    std::vector<float> rv(2 * 32);
    REQUIRE(H5Dread(gd.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, rv.data()) >= 0);
    const at::Tensor raw_rows = at::from_blob(rv.data(), {2, 32}, at::kFloat);
    CHECK(at::allclose(raw_rows, stored.slice(0, 0, 2), 1e-5, 1e-5));
  }
  SECTION("a classification checkpoint is refused") {
    TempDir other;
    const fs::path data = test::build_tone_dataset(other.path(), 3, 3);
    trainer::train(test::tiny_config(data, other / "run", 1), log);
    trainer::EmbedOptions c = o;
    c.checkpoint = other / "run" / "checkpoints" / "best.pt";
    CHECK_THROWS_WITH(trainer::run_embed(c, out, log), Catch::Contains("--task verification"));
  }
}

TEST_CASE("Python reproduces a trained speaker checkpoint's exported embeddings", "[trainer][verification][python]") {
  const std::string python = test::venv_python();
  if (python.empty()) {
    MELFORGE_SKIP("the torch venv of tools/setup_torch.sh is not installed (run bash tools/setup_torch.sh)");
  }
  const SharedRun& s = shared();
  trainer::ExportOptions opts;
  opts.checkpoint = s.run / "checkpoints" / "best.pt";
  opts.out = s.dir / "export" / "weights.pt";
  fs::create_directories(opts.out.parent_path());
  std::ostringstream out;
  trainer::run_export(opts, out);
  auto model = load_model(opts.checkpoint);
  model->eval();
  c10::NoGradGuard no_grad;
  at::manual_seed(3);
  const at::Tensor x = at::randn({4, 32, 32}) * 10.0 - 30.0;
  const trainer::ModelOutput y = model->forward(x);
  std::string output;
  const int rc = test::check_export_in_python(python, opts.out, x, {{"logits", y.logits}, {"embedding", y.embedding}},
                                              output);
  INFO(output);
  CHECK(rc == 0);
}

TEST_CASE("the speaker task refuses what it cannot do before any work", "[trainer][verification]") {
  trainer::TrainConfig c = speaker_config("/nonexistent/data", "/nonexistent/run", 1);
  CHECK_NOTHROW(c.validate());
  const auto refused = [](trainer::TrainConfig bad, const std::string& what) {
    CAPTURE(what);
    CHECK_THROWS_WITH(bad.validate(), Catch::Contains(what));
  };
  trainer::TrainConfig t = c;
  t.model.model = "cnn";
  refused(t, "--model resnet-se or ecapa");
  t = c;
  t.train.task = "multiclass";
  refused(t, "--task verification");
  t = c;
  t.mixup.alpha = 0.4;
  refused(t, "--mixup");
  t = c;
  t.train.cuda_graph = true;
  t.train.margin_warmup = 1;
  refused(t, "--margin-warmup");
  t = c;
  t.train.margin = 1.6;
  refused(t, "--margin");
  t = c;
  t.train.scale = 0;
  refused(t, "--scale");
  t = c;
  t.train.positive_class = "class0";
  refused(t, "--positive-class");
  t = c;
  t.verify.trial_count = 7;
  refused(t, "--trial-count");
  t = c;
  t.verify.cohort_size = 10;
  refused(t, "--cohort-size");
  trainer::TrainConfig m = test::tiny_config("/nonexistent/data", "/nonexistent/run", 1);
  m.train.margin = 0.3;
  refused(m, "--margin");
  m = test::tiny_config("/nonexistent/data", "/nonexistent/run", 1);
  m.verify.as_norm = 5;
  refused(m, "--as-norm");
}

TEST_CASE("a speaker run refuses a split that cannot give trials, and a trial list that does not fit, before training",
          "[trainer][verification]") {
  TempDir d;
  const fs::path data = build_speakers(d.path());
  trainer::TrainConfig c = speaker_config(data, d / "run", 1);
  c.verify.trials = {d / "list.txt"};
  std::ofstream(d / "list.txt") << "1 class0/f0.wav class99/f0.wav\n";
  std::ostringstream log;
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("list.txt") && Catch::Contains("class99/f0.wav"));
  CHECK_FALSE(fs::exists(d / "run" / "checkpoints"));
}

}  // namespace melforge_test_trainer_verification_task
