// The defaults of `train --task verification` (issue 32): --model auto resolves to resnet-se, --cmn auto to on,
// the training view to 2 s crops and the evaluation to whole utterances, and the run's summary prints EER and
// minDCF; and per-utterance cepstral mean normalisation (--cmn) itself: a model with it on gives the same output when
// a constant is added to a mel bin of a row's real frames (and another one without it), a padded row gives the
// output of the row alone, the configuration records it, and the Python twin (python/melforge/models.py) reproduces
// a cmn model's outputs on padded rows.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <torch/torch.h>

#include "catch_torch.h"

#include <sstream>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "eval/batching.h"
#include "export/export.h"
#include "export_check.h"
#include "melforge/common/errors.h"
#include "models/model.h"
#include "options.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "trainer_fixture.h"
#include "venv_python.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_verification_defaults {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// The options of a small `model` with cmn `cmn` (on or off): widths small enough for a test.
ModelOptions small_model(const std::string& model, const std::string& cmn) {
  ModelOptions o;
  o.model = model;
  o.cmn = cmn;
  o.hidden = 16;
  o.rnn_hidden = 8;
  o.width = "quarter";
  o.embedding_dim = 12;
  o.channels = 16;
  o.seed = 5;
  return o;
}

/// A [n_mels x n_frames] MelInfo.
MelInfo info_of(int64_t n_mels, int64_t n_frames) {
  MelInfo info;
  info.n_mels = n_mels;
  info.n_frames = n_frames;
  return info;
}

/// The output a test compares: the embedding of a speaker model, else the class logits.
at::Tensor output_of(Classifier& model, const at::Tensor& x, const at::Tensor& lengths) {
  c10::NoGradGuard no_grad;
  const ModelOutput y = model.forward(x, lengths);
  return y.embedding.defined() ? y.embedding : y.logits;
}

/// max |a - b| / max(max |b|, 1).
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1.0);
}

/// The lines a run's stdout and log hold, with the config.json and report.json of its run folder.
struct DefaultRun {
  int code = -1;
  std::string output;
  nlohmann::json config, report;
};

/// `train --task verification` without --model or --cmn on a tone corpus split by class (each tone a speaker), one
/// epoch, at a quarter width on one thread.
DefaultRun run_default_verification(const fs::path& root) {
  const fs::path data = test::build_tone_dataset(
      root, 12, 4, "data", [](builder::BuildConfig& c) { c.build.split_by = builder::SplitBy::class_; });
  const fs::path run = root / "run";
  DefaultRun r;
  std::tie(r.code, r.output) = test::run_in_process(
      {"melforge-train", "train", "--task", "verification", "--data", data.string(), "--out", run.string(),
       "--epochs", "1", "--width", "quarter", "--embedding-dim", "16", "--batch-size", "16", "--threads", "1",
       "--trial-count", "100", "--log-level", "info"});
  if (r.code != 0) return r;
  r.config = test::read_json(run / "config.json");
  r.report = test::read_json(run / "report.json");
  return r;
}

}  // namespace

TEST_CASE("model auto and cmn auto resolve for the task: resnet-se with cmn for verification, cnn without",
          "[trainer][verification_defaults]") {
  const ModelOptions defaults;
  CHECK(defaults.model == "auto");
  CHECK(defaults.cmn == "auto");
  CHECK(defaults.resolved("verification").model == "resnet-se");
  CHECK(defaults.resolved("verification").cmn == "on");
  CHECK(defaults.resolved("multiclass").model == "cnn");
  CHECK(defaults.resolved("multilabel").cmn == "off");
  const std::string model = GENERATE(std::string("cnn"), std::string("crnn"), std::string("resnet-se"),
                                     std::string("ecapa"));
  ModelOptions o;
  o.model = model;
  const bool speaker = model == "resnet-se" || model == "ecapa";
  CAPTURE(model);
  CHECK(o.resolved("verification").model == model);
  CHECK(o.resolved("multiclass").cmn == (speaker ? "on" : "off"));
  o.cmn = speaker ? "off" : "on";
  CHECK(o.resolved("verification").cmn == o.cmn);
  CHECK(make_model(small_model(model, "auto"), info_of(16, 24), 4)->cmn() == speaker);
  CHECK(make_model(small_model(model, "auto"), info_of(16, 24), 4)->config_json().at("cmn") == speaker);
  o.cmn = "sometimes";
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("--cmn"));

  TrainConfig cfg;
  cfg.data.data = "/nonexistent/data";
  cfg.train.out = "/nonexistent/run";
  cfg.train.task = "verification";
  CHECK_NOTHROW(cfg.validate());
  cfg.train.task = "multiclass";
  CHECK_NOTHROW(cfg.validate());
  CHECK(to_json(ModelOptions()).at("cmn") == "auto");
  CHECK(model_options_from_json({{"model", "resnet-se"}}).cmn == "off");
  CHECK(model_options_from_json({{"model", "resnet-se"}, {"cmn", "on"}}).cmn == "on");
}

TEST_CASE("a model configuration records cmn, reads an absent one as off and refuses a non-boolean one",
          "[trainer][verification_defaults][cmn]") {
  const std::string model = GENERATE(std::string("cnn"), std::string("resnet-se"));
  const std::string cmn = GENERATE(std::string("on"), std::string("off"));
  CAPTURE(model, cmn);
  const auto net = make_model(small_model(model, cmn), info_of(16, 24), 4);
  nlohmann::json j = net->config_json();
  REQUIRE(j.at("cmn") == (cmn == "on"));
  CHECK(make_model_from_json(j, true)->cmn() == (cmn == "on"));
  CHECK(model_size_from_json(j).parameters == model_size(small_model(model, cmn), info_of(16, 24), 4).parameters);
  j.erase("cmn");
  CHECK_FALSE(make_model_from_json(j, true)->cmn());
  j["cmn"] = "on";
  CHECK_THROWS_AS(make_model_from_json(j, true), FormatError);
  CHECK_THROWS_WITH(model_size_from_json(j), Catch::Contains("'cmn'"));
}

TEST_CASE("cmn: a constant added to a mel bin of a row's real frames leaves the output as it was, and changes it "
          "without cmn",
          "[trainer][verification_defaults][cmn]") {
  const std::string model = GENERATE(std::string("cnn"), std::string("crnn"), std::string("resnet-se"),
                                     std::string("ecapa"));
  CAPTURE(model);
  const int64_t M = 16, T = 24;
  at::manual_seed(3);
  const at::Tensor x = at::randn({3, M, T}) * 4 - 20;
  const at::Tensor lengths = at::tensor(std::vector<int64_t>{T, 17, 9}, at::kLong);
  const at::Tensor real = (at::arange(T).view({1, 1, T}) < lengths.view({3, 1, 1})).to(at::kFloat);
  const at::Tensor shift = (at::randn({3, M, 1}) * 6) * real;
  for (const std::string cmn : {"on", "off"}) {
    const auto net = make_model(small_model(model, cmn), info_of(M, T), 4);
    net->eval();
    const double diff = relative_difference(output_of(*net, x + shift, lengths), output_of(*net, x, lengths));
    CAPTURE(cmn, diff);
    if (cmn == "on") CHECK(diff < 1e-4);
    else CHECK(diff > 1e-3);
  }
  const at::Tensor normalised = cepstral_mean_normalize(x + shift, lengths);
  CHECK(relative_difference(normalised, cepstral_mean_normalize(x, lengths)) < 1e-5);
  CHECK((normalised * real).sum(-1).abs().max().item<double>() < 1e-3);
  CHECK(normalised.masked_select(real.logical_not()).abs().max().item<double>() == 0.0);
}

TEST_CASE("cmn: a row padded in a batch gives the output of the row alone, whatever the padding holds",
          "[trainer][verification_defaults][cmn]") {
  const std::string model = GENERATE(std::string("cnn"), std::string("crnn"), std::string("resnet-se"),
                                     std::string("ecapa"));
  CAPTURE(model);
  const int64_t M = 16, T = 28;
  const auto net = make_model(small_model(model, "on"), info_of(M, T), 4);
  net->eval();
  at::manual_seed(8);
  const std::vector<int64_t> lens = {T, 13, 21};
  at::Tensor x = at::randn({3, M, T}) * 5 - 30;
  const at::Tensor lengths = at::tensor(lens, at::kLong);
  const at::Tensor pad = at::arange(T).view({1, 1, T}) >= lengths.view({3, 1, 1});
  x = at::where(pad, at::full({}, 1e4), x);
  const at::Tensor batched = output_of(*net, x, lengths);
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t n = lens[static_cast<std::size_t>(b)];
    const at::Tensor alone = output_of(*net, x.narrow(0, b, 1).narrow(2, 0, n).contiguous(), at::Tensor());
    CAPTURE(b, n);
    CHECK(relative_difference(batched.narrow(0, b, 1), alone) < 1e-5);
  }
}

TEST_CASE("train --task verification with defaults trains resnet-se with cmn on 2 s crops and prints EER and "
          "minDCF",
          "[trainer][verification_defaults]") {
  TempDir d;
  const DefaultRun r = run_default_verification(d.path());
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.config.at("model").at("model") == "resnet-se");
  CHECK(r.config.at("model").at("cmn") == "on");
  CHECK(r.config.at("model_config").at("model") == "resnet-se");
  CHECK(r.config.at("model_config").at("cmn") == true);
  CHECK(r.config.at("input_mean") == 0.0);
  CHECK(r.config.at("input_std") == 1.0);
  CHECK(r.config.at("view").at("view") == "crops");
  CHECK(r.config.at("view").at("crop_seconds") == 2.0);
  CHECK_THAT(r.output, Catch::Contains("--cmn on") && Catch::Contains("training view: crops"));
  CHECK_THAT(r.output, Catch::Contains("test: EER ") && Catch::Contains("minDCF(0.01)") &&
                           !Catch::Contains("accuracy 0.0000"));
  CHECK(r.report.at("task") == "verification");
  const Dataset meta = load_dataset(d / "data", /*load_mel=*/false);
  data::views::ViewOptions view;
  view.view = "crops";
  CHECK(evaluation_view_options(view, meta.test, "resnet-se").view == "clips");
}

TEST_CASE("Python's twin reproduces a cmn model's outputs on padded rows within 1e-5",
          "[trainer][verification_defaults][cmn][python]") {
  const std::string python = test::venv_python();
  if (python.empty()) MELFORGE_SKIP("the torch venv of tools/setup_torch.sh is not installed (run bash tools/setup_torch.sh)");
  TempDir d;
  const int64_t M = 16, T = 20;
  const auto net = make_model(small_model("resnet-se", "auto"), info_of(M, T), 4);
  REQUIRE(net->cmn());
  net->train();
  {
    c10::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) net->forward(at::randn({6, M, T}) * 20 - 35);
  }
  net->eval();
  Checkpoint ck;
  ck.version = kCheckpointVersion;
  ck.model_config = net->config_json();
  ck.model_config["task"] = "verification";
  ck.mel = {{"sample_rate", 16000}, {"n_mels", M}};
  ck.class_names = {"id1", "id2", "id3", "id4"};
  ck.positive_class = "id1";
  ck.model = state_dict(*net);
  save_checkpoint(ck, d / "ck.pt");
  ExportOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.out = d / "weights.pt";
  std::ostringstream out;
  run_export(opts, out);

  at::manual_seed(4);
  const at::Tensor x = at::randn({4, M, T}) * 12.5 - 40.0;
  const at::Tensor lengths = at::tensor(std::vector<int64_t>{T, 1, T / 2, 7}, at::kLong);
  c10::NoGradGuard no_grad;
  const ModelOutput y = net->forward(x, lengths);
  std::string output;
  const int rc = test::check_export_in_python(python, d / "weights.pt", x,
                                              {{"logits", y.logits}, {"embedding", y.embedding}}, output, lengths);
  INFO(output);
  CHECK(rc == 0);
  CHECK_THAT(output, Catch::Contains("ok:"));
}

}  // namespace melforge_test_trainer_verification_defaults
