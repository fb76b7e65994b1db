// The device check of `train` (issue 27, train/device_check.h): the precisions and tolerances, the check itself on
// every model (a zero difference CPU against CPU, a perturbed "device" side caught, bf16 within its tolerance, the
// model left exactly as it was), and whole runs of the three tasks through the fault-injection hook
// MELFORGE_DEVICE_CHECK_FAULT: passing runs record the figures in config.json and end with the weights of a run
// with --no-device-check; a perturbed one stops with exit 1 and the figures. The `[cuda]` case runs on a GPU.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <torch/cuda.h>

#include "catch_torch.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "models/model.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/aam.h"
#include "train/checkpoint.h"
#include "train/device_check.h"
#include "train/rng_state.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_device_check {

using namespace melforge;
using melforge::test::read_json;
using melforge::test::run_in_process;
using melforge::test::TempDir;
using melforge::test::with;
namespace fs = std::filesystem;

namespace {

/// Sets MELFORGE_DEVICE_CHECK_FAULT to `value` (unset for nullopt) for its scope, then restores what was there.
class ScopedFault {
 public:
  explicit ScopedFault(const std::optional<std::string>& value) {
    if (const char* v = std::getenv(trainer::kDeviceCheckFaultVariable)) previous_ = v;
    if (value) ::setenv(trainer::kDeviceCheckFaultVariable, value->c_str(), 1);
    else ::unsetenv(trainer::kDeviceCheckFaultVariable);
  }
  ~ScopedFault() {
    if (previous_) ::setenv(trainer::kDeviceCheckFaultVariable, previous_->c_str(), 1);
    else ::unsetenv(trainer::kDeviceCheckFaultVariable);
  }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;

 private:
  std::optional<std::string> previous_;
};

/// A copy of every parameter and buffer of `m` by name ("p:" and "b:" prefixes), and whether each parameter has a
/// gradient ("g:").
std::map<std::string, at::Tensor> check_snapshot(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) {
    out["p:" + p.key()] = p.value().detach().clone();
    if (p.value().grad().defined()) out["g:" + p.key()] = p.value().grad().clone();
  }
  for (const auto& b : m.named_buffers()) out["b:" + b.key()] = b.value().detach().clone();
  return out;
}

/// Both snapshots hold the same names and bit-identical tensors.
void require_same_snapshot(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name) == 1);
    CHECK(at::equal(t, b.at(name)));
  }
}

/// The small models of the check's unit tests, for spectrograms [16 mels x 16 frames] and 4 classes.
std::shared_ptr<trainer::Classifier> check_model(const std::string& kind) {
  trainer::ModelOptions o;
  o.model = kind;
  o.hidden = 12;
  o.rnn_hidden = 8;
  o.embedding_dim = 16;
  o.width = "quarter";
  o.channels = 16;
  trainer::MelInfo info;
  info.n_mels = 16;
  info.n_frames = 16;
  return trainer::make_model(o, info, 4);
}

/// The task loss of `kind`'s output against `labels` on the output's device: AAM-softmax for the speaker models,
/// cross-entropy plus the detection BCE (positive class 0) for the classifiers.
trainer::CheckLoss check_loss(const std::string& kind, const at::Tensor& labels) {
  return [kind, labels](const trainer::ModelOutput& out) {
    const at::Tensor y = labels.to(out.logits.device());
    if (trainer::is_speaker_model(kind)) return trainer::aam_softmax_loss(out.logits, y, 0.2, 30);
    return trainer::combined_loss(out, y, 0, 1.0);
  };
}

/// The command line of a one-epoch run of `data` into `out` on one thread, logging at info.
std::vector<std::string> check_args(const fs::path& data, const fs::path& out) {
  return {"melforge-train", "train", "--data", data.string(), "--out", out.string(), "--epochs", "1", "--hidden",
          "24", "--seed", "42", "--lr", "3e-3", "--batch-size", "16", "--prefetch", "2", "--threads", "1",
          "--log-level", "info"};
}

/// A multi-label tone dataset in `root`/data: write_tone_corpus's 3 classes of 5 files, every even file labelled
/// with the next class too, split by file number (0-2 train, 3 val, 4 test) through a manifest.
fs::path build_check_multilabel(const fs::path& root) {
  test::write_tone_corpus(root / "in", 3, 5);
  std::string manifest = "path,label,split\n";
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 5; ++i)
      manifest += "in/class" + std::to_string(c) + "/f" + std::to_string(i) + ".wav,class" + std::to_string(c) +
                  (i % 2 == 0 ? ";class" + std::to_string((c + 1) % 3) : std::string()) + "," +
                  (i < 3 ? "train" : i == 3 ? "val" : "test") + "\n";
  test::write_text(root / "m.csv", manifest);
  builder::BuildConfig c = test::tiny_build_config({}, root / "data");
  c.build.manifest = root / "m.csv";
  builder::run_build(c);
  return root / "data";
}

/// Thrown by the batch hook to end a run after its first batch.
struct EndAfterFirstBatch {};

/// Trains `c` (library call, log at info) until its second batch and returns the log: the device check has run on
/// the first one.
std::string log_of_first_batch(trainer::TrainConfig c) {
  c.runtime.log_level = "info";
  std::ostringstream log;
  trainer::TrainHooks hooks;
  int batches = 0;
  hooks.on_batch = [&batches](int64_t, trainer::Batch&) {
    if (++batches == 2) throw EndAfterFirstBatch{};
  };
  CHECK_THROWS_AS(trainer::train(c, log, hooks), EndAfterFirstBatch);
  return log.str();
}

}  // namespace

TEST_CASE("device check: the precision of each autocast dtype and of TF32, its tolerances, and the fault hook's value",
          "[trainer][device_check]") {
  using trainer::check_precision;
  const trainer::CheckPrecision fp32 = check_precision(at::kCPU, at::kFloat);
  CHECK(fp32.name == "fp32");
  CHECK(fp32.unit_roundoff == std::ldexp(1.0, -24));
  CHECK(fp32.logits_tolerance == std::ldexp(1.0, -13));
  const trainer::CheckPrecision bf16 = check_precision(at::kCPU, at::kBFloat16);
  CHECK(bf16.name == "bf16");
  CHECK(bf16.logits_tolerance == 0.125);
  CHECK(bf16.loss_tolerance == 0.125);
  const trainer::CheckPrecision fp16 = check_precision(at::Device("cuda:0"), at::kHalf);
  CHECK(fp16.name == "fp16");
  CHECK(fp16.logits_tolerance == 32 * std::ldexp(1.0, -11));
  auto& ctx = at::globalContext();
  const bool cudnn = ctx.allowTF32CuDNN();
  const std::string matmul = ctx.float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST ? "highest" : "high";
  ctx.setAllowTF32CuDNN(false);
  ctx.setFloat32MatmulPrecision("highest");
  CHECK(check_precision(at::Device("cuda:0"), at::kFloat).name == "fp32");
  ctx.setFloat32MatmulPrecision("high");
  const trainer::CheckPrecision tf32 = check_precision(at::Device("cuda:0"), at::kFloat);
  CHECK(tf32.name == "tf32");
  CHECK(tf32.unit_roundoff == std::ldexp(1.0, -11));
  CHECK(tf32.logits_tolerance == 32 * std::ldexp(1.0, -11));
  CHECK(check_precision(at::kCPU, at::kFloat).name == "fp32");
  ctx.setAllowTF32CuDNN(cudnn);
  ctx.setFloat32MatmulPrecision(matmul);

  {
    const ScopedFault unset(std::nullopt);
    CHECK_FALSE(trainer::device_check_fault().has_value());
  }
  for (const auto& [text, value] : std::vector<std::pair<std::string, double>>{{"0", 0.0}, {"0.25", 0.25}}) {
    const ScopedFault fault(text);
    CHECK(trainer::device_check_fault() == value);
  }
  for (const char* bad : {"-0.1", "abc", "0.1x", "nan", "inf"}) {
    INFO(bad);
    const ScopedFault fault{std::string(bad)};
    CHECK_THROWS_AS(trainer::device_check_fault(), InvalidArgument);
  }
}

TEST_CASE("device check: CPU against its own copy differs by exactly 0, a perturbed side fails, bf16 stays within its "
          "tolerance, and the model, its mode and the generator are left as they were",
          "[trainer][device_check]") {
  at::set_num_threads(1);
  const std::string kind = GENERATE("cnn", "crnn", "resnet-se", "ecapa");
  CAPTURE(kind);
  const auto model = check_model(kind);
  model->train();
  at::manual_seed(3);
  const at::Tensor x = at::randn({6, 16, 16});
  const trainer::CheckLoss loss = check_loss(kind, at::arange(6, at::kLong) % 4);
  const auto before = check_snapshot(*model);
  const at::Tensor generator = trainer::rng_state();

  const trainer::DeviceCheckResult same = trainer::run_device_check(*model, x, at::Tensor(), at::kFloat, loss, 0.0);
  CHECK(same.passed());
  CHECK(same.precision.name == "fp32");
  CHECK(same.device == "cpu");
  CHECK(same.examples == 6);
  CHECK(same.logits_max_abs_diff == 0);
  CHECK(same.loss_rel_diff == 0);
  CHECK(same.logits_scale > 0);
  CHECK(std::isfinite(same.loss_cpu));

  const trainer::DeviceCheckResult wrong = trainer::run_device_check(*model, x, at::Tensor(), at::kFloat, loss, 0.01);
  CHECK_FALSE(wrong.passed());
  CHECK(wrong.result == "failed");
  CHECK(wrong.logits_rel_diff == Approx(0.01).epsilon(1e-4));
  CHECK(wrong.loss_device != wrong.loss_cpu);
  CHECK(wrong.to_json()["fault_injected"] == 0.01);
  CHECK(wrong.summary().find("device check failed on cpu (fp32") == 0);

  const trainer::DeviceCheckResult bf16 = trainer::run_device_check(*model, x, at::Tensor(), at::kBFloat16, loss, std::nullopt);
  INFO(bf16.summary());
  CHECK(bf16.passed());
  CHECK(bf16.precision.name == "bf16");
  CHECK(bf16.logits_rel_diff > 0);
  CHECK(bf16.logits_rel_diff <= bf16.precision.logits_tolerance);
  CHECK_FALSE(bf16.to_json().contains("fault_injected"));

  CHECK(model->is_training());
  require_same_snapshot(before, check_snapshot(*model));
  CHECK(at::equal(generator, trainer::rng_state()));
}

TEST_CASE("device check in a multiclass run: the hook's CPU check records its zero figures in config.json and leaves "
          "the weights of a run with --no-device-check, and a perturbed device side stops the run with exit 1",
          "[trainer][device_check]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  {
    const ScopedFault fault(std::string("0"));
    const auto [code, out] = run_in_process(check_args(data, d / "checked"));
    INFO(out);
    REQUIRE(code == 0);
    CHECK(out.find("device check passed on cpu (fp32") != std::string::npos);
  }
  const nlohmann::json dc = read_json(d / "checked" / "config.json")["device_check"];
  INFO(dc.dump());
  CHECK(dc["result"] == "passed");
  CHECK(dc["device"] == "cpu");
  CHECK(dc["reference"] == "cpu");
  CHECK(dc["precision"] == "fp32");
  CHECK(dc["mode"] == "eval");
  CHECK(dc["examples"] == 16);
  CHECK(dc["logits_max_abs_diff"] == 0.0);
  CHECK(dc["loss_rel_diff"] == 0.0);
  CHECK(dc["loss_device"] == dc["loss_cpu"]);
  CHECK(dc["fault_injected"] == 0.0);
  CHECK(dc["logits_tolerance"] == std::ldexp(1.0, -13));

  const auto [code, out] = run_in_process(with(check_args(data, d / "unchecked"), {"--no-device-check"}));
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("device check skipped: --no-device-check") != std::string::npos);
  CHECK(read_json(d / "unchecked" / "config.json")["device_check"] ==
        nlohmann::json({{"result", "skipped"}, {"reason", "--no-device-check"}}));
  test::require_same_tensors(trainer::load_checkpoint(d / "checked" / "checkpoints" / "last.pt").model,
                             trainer::load_checkpoint(d / "unchecked" / "checkpoints" / "last.pt").model, "last.pt");

  const ScopedFault fault(std::string("0.01"));
  const auto [bad, said] = run_in_process(check_args(data, d / "perturbed"));
  INFO(said);
  CHECK(bad == trainer::kExitError);
  CHECK(said.find("device check failed on cpu (fp32") != std::string::npos);
  CHECK(said.find("logits differ by up to") != std::string::npos);
  CHECK(said.find("= 1 % of their scale") != std::string::npos);
  CHECK(said.find("tolerance 0.0122 %") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "perturbed" / "config.json"));

  const auto [resumed, text] = run_in_process(
      {"melforge-train", "train", "--resume", (d / "checked").string(), "--epochs", "2", "--threads", "1"});
  INFO(text);
  CHECK(resumed == trainer::kExitError);
  const nlohmann::json failed = read_json(d / "checked" / "config.json")["device_check"];
  CHECK(failed["result"] == "failed");
  CHECK(failed["logits_rel_diff"].get<double>() == Approx(0.01).epsilon(1e-4));
  CHECK(failed["fault_injected"] == 0.01);
}

TEST_CASE("device check with --task multilabel: the hook's CPU check passes with zero figures, a perturbed side fails "
          "with exit 1", "[trainer][device_check]") {
  TempDir d;
  const fs::path data = build_check_multilabel(d.path());
  trainer::TrainConfig c = test::tiny_config(data, d / "run", 1);
  c.train.task = "multilabel";
  c.runtime.threads = 1;
  {
    const ScopedFault fault(std::string("0"));
    const std::string log = log_of_first_batch(c);
    INFO(log);
    CHECK(log.find("device check passed on cpu (fp32, eval mode, the 16 examples of the first batch") !=
          std::string::npos);
    CHECK(log.find("logits differ by up to 0 = 0 %") != std::string::npos);
    CHECK(log.find("a relative difference of 0 %") != std::string::npos);
  }
  const ScopedFault fault(std::string("0.5"));
  const auto [code, out] = run_in_process(with(check_args(data, d / "bad"), {"--task", "multilabel"}));
  INFO(out);
  CHECK(code == trainer::kExitError);
  CHECK(out.find("device check failed on cpu (fp32") != std::string::npos);
  CHECK(out.find("= 50 % of their scale") != std::string::npos);
}

TEST_CASE("device check with --task verification (AAM-softmax): the hook's CPU check passes with zero figures, a "
          "perturbed side fails with exit 1", "[trainer][device_check]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(
      d.path(), 10, 3, "data", [](builder::BuildConfig& b) { b.build.split_by = builder::SplitBy::class_; });
  trainer::TrainConfig c = test::tiny_config(data, d / "run", 1);
  c.train.task = "verification";
  c.model.model = "resnet-se";
  c.model.width = "quarter";
  c.model.embedding_dim = 16;
  c.verify.trial_count = 50;
  c.runtime.threads = 1;
  {
    const ScopedFault fault(std::string("0"));
    const std::string log = log_of_first_batch(c);
    INFO(log);
    CHECK(log.find("device check passed on cpu (fp32") != std::string::npos);
    CHECK(log.find("logits differ by up to 0 = 0 %") != std::string::npos);
    CHECK(log.find("a relative difference of 0 %") != std::string::npos);
  }
  const ScopedFault fault(std::string("0.5"));
  const auto [code, out] =
      run_in_process(with(check_args(data, d / "bad"), {"--task", "verification", "--model", "resnet-se", "--width",
                                                        "quarter", "--embedding-dim", "16", "--trial-count", "50"}));
  INFO(out);
  CHECK(code == trainer::kExitError);
  CHECK(out.find("device check failed on cpu (fp32") != std::string::npos);
  CHECK(out.find("= 50 % of their scale") != std::string::npos);
}

TEST_CASE("device check: a bad MELFORGE_DEVICE_CHECK_FAULT, or one with --no-device-check, is refused before any work",
          "[trainer][device_check]") {
  TempDir d;
  const auto args = check_args(d / "no-data", d / "run");
  {
    const ScopedFault fault(std::string("-1"));
    const auto [code, out] = run_in_process(args);
    CHECK(code == trainer::kExitUsage);
    CHECK(out.find("MELFORGE_DEVICE_CHECK_FAULT (the device check's fault-injection test hook) must be a finite "
                   "number >= 0, got '-1'") != std::string::npos);
  }
  const ScopedFault fault(std::string("0"));
  const auto [code, out] = run_in_process(with(args, {"--no-device-check"}));
  CHECK(code == trainer::kExitUsage);
  CHECK(out.find("which --no-device-check skips") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "run"));
}

TEST_CASE("[cuda] device check on the GPU: every model passes in TF32, bf16 and fp16 and is left as it was, a run "
          "records the check, and a perturbed device side stops it with exit 1",
          "[trainer][device_check][cuda]") {
  if (!torch::cuda::is_available()) MELFORGE_SKIP("no CUDA device");
  trainer::configure_cuda(true);
  const at::Device cuda("cuda:0");
  for (const std::string kind : {"cnn", "crnn", "resnet-se", "ecapa"}) {
    const auto model = check_model(kind);
    model->to(cuda);
    if (kind == "cnn") trainer::to_channels_last(*model);
    model->train();
    at::manual_seed(5);
    const at::Tensor x = at::randn({8, 16, 16}).to(cuda);
    const auto before = check_snapshot(*model);
    const at::Tensor cpu_generator = trainer::rng_state(), cuda_generator = trainer::rng_state(cuda);
    for (const auto& [amp, name] : std::vector<std::pair<at::ScalarType, std::string>>{
             {at::kFloat, "tf32"}, {at::kBFloat16, "bf16"}, {at::kHalf, "fp16"}}) {
      const trainer::DeviceCheckResult r =
          trainer::run_device_check(*model, x, at::Tensor(), amp, check_loss(kind, at::arange(8, at::kLong) % 4), std::nullopt);
      INFO(kind << " " << r.summary());
      CHECK(r.passed());
      CHECK(r.precision.name == name);
      CHECK(r.device == "cuda:0");
    }
    CHECK(model->is_training());
    require_same_snapshot(before, check_snapshot(*model));
    CHECK(at::equal(cpu_generator, trainer::rng_state()));
    CHECK(at::equal(cuda_generator, trainer::rng_state(cuda)));
  }

  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  const auto args = with(check_args(data, d / "run"), {"--device", "cuda", "--amp", "bf16", "--channels-last"});
  const auto [code, out] = run_in_process(args);
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("device check passed on cuda:0 (bf16") != std::string::npos);
  const nlohmann::json dc = read_json(d / "run" / "config.json")["device_check"];
  CHECK(dc["result"] == "passed");
  CHECK(dc["device"] == "cuda:0");
  CHECK(dc["precision"] == "bf16");
  CHECK_FALSE(dc.contains("fault_injected"));

  const ScopedFault fault(std::string("0.5"));
  const auto [bad, said] = run_in_process(with(check_args(data, d / "bad"), {"--device", "cuda"}));
  INFO(said);
  CHECK(bad == trainer::kExitError);
  CHECK(said.find("device check failed on cuda:0 (tf32") != std::string::npos);
}

}  // namespace melforge_test_trainer_device_check

namespace melforge_test_trainer_device_check {

namespace {

/// What check_training_memory advises after "; lower " when `available` bytes are too few (empty when it passes).
std::string memory_advice(const trainer::TrainConfig& c, const trainer::MelInfo& info, int64_t classes, bool cuda,
                          int64_t available, int64_t clip_frames) {
  try {
    trainer::check_training_memory(c, info, classes, cuda, available, clip_frames);
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    const std::size_t at = m.find("; lower ");
    return at == std::string::npos ? m : m.substr(at + 8);
  }
  return {};
}

}  // namespace

TEST_CASE("memory pre-check: a default resnet-se verification run fits, its evaluation rows are charged as "
          "inference, and the refusal names only the flags of its model and view",
          "[trainer][device_check][memory][verification_defaults]") {
  trainer::TrainConfig c;
  c.train.task = "verification";
  c.model = c.model.resolved(c.train.task);
  REQUIRE(c.model.model == "resnet-se");
  c.view.view = "crops";
  trainer::MelInfo info;
  info.n_mels = 80;
  info.n_frames = 200;
  const int64_t classes = 1211, clip_frames = 12800;
  const trainer::ModelSize size = trainer::model_size(c.model, info, classes);
  const double gib = 1 << 30;
  const double need = trainer::training_memory_bytes(c, info, classes, false, clip_frames);
  CAPTURE(size.parameters, need / gib);
  CHECK(need < 16 * gib);
  CHECK(need == Approx(size.parameters * 16 + 2.0 * 64 * size.activation_floats * 4));
  const double clips_dominate = trainer::training_memory_bytes(c, info, classes, false, clip_frames * 10000);
  CHECK(clips_dominate == Approx(size.parameters * 16 + 10000.0 * clip_frames * 80 * 4));
  c.eval.batch_size = 100000;
  CHECK(trainer::training_memory_bytes(c, info, classes, false, clip_frames) == need);
  c.eval.batch_size = 1024;

  const std::string train_advice = memory_advice(c, info, classes, false, 1 << 20, clip_frames);
  CAPTURE(train_advice);
  CHECK(train_advice == "--embedding-dim, --batch-size or --crop-seconds (or give --width quarter)");
  c.loader.batch_size = 1;
  CHECK(memory_advice(c, info, classes, false, 1 << 20, clip_frames * 10000) ==
        "--embedding-dim or --clip-batch-seconds (or give --width quarter)");
  CHECK(memory_advice(c, info, classes, true, 1 << 20, clip_frames) == "--embedding-dim (or give --width quarter)");
  try {
    trainer::check_training_memory(c, info, classes, false, 1 << 20, clip_frames);
    FAIL("not refused");
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("--model resnet-se, --width half, --embedding-dim 192") &&
                      Catch::Contains("inference, no stored activations") && !Catch::Contains("--hidden") &&
                      !Catch::Contains("--rnn-hidden") && !Catch::Contains("--tile") &&
                      !Catch::Contains("--eval-batch-size") && !Catch::Contains("--channels"));
  }

  c.train.task = "multiclass";
  c.model = trainer::ModelOptions().resolved(c.train.task);
  c.view.view = "tiles";
  c.loader.batch_size = 64;
  CHECK(memory_advice(c, info, 4, false, 1 << 20, 0) == "--hidden, --batch-size or --tile-seconds");
  c.loader.batch_size = 1;
  c.eval.batch_size = 1 << 20;
  CHECK(memory_advice(c, info, 4, false, 1 << 20, 0) == "--hidden or --eval-batch-size");
  c.model.model = "crnn";
  CHECK(memory_advice(c, info, 4, true, 1 << 10, 0) == "--hidden or --rnn-hidden");
  c.model.model = "ecapa";
  c.train.task = "verification";
  CHECK(memory_advice(c, info, 4, true, 1 << 10, 0) == "--channels or --embedding-dim");
}

}  // namespace melforge_test_trainer_device_check
