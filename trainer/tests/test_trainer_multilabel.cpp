// --task multilabel end to end on a tiny corpus of tone mixtures (labels: which tones a file holds), the file-score
// aggregation, the refusals around it, and --positive-class none.
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log1p.h>
#include <ATen/ops/rand.h>
#include <sndfile.h>

#include "catch_torch.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "data/dataset.h"
#include "eval/multilabel.h"
#include "melforge/common/errors.h"
#include "metrics/multilabel.h"
#include "predict/predict.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "multilabel_fixture.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_multilabel {

using namespace melforge;
using melforge::test::TempDir;
using melforge::test::read_json;
namespace fs = std::filesystem;

namespace {

using test::build_mix_dataset;

/// The mean prevalence of the classes in `split`'s targets: the mAP of scores that carry no information.
double chance_map(const trainer::Split& split) { return split.targets.mean(0).mean().item<double>(); }

}  // namespace

TEST_CASE("aggregate_multilabel_clips takes the mean or the max over each clip's examples", "[trainer][multilabel]") {
  const std::string how = GENERATE(std::string("mean"), std::string("max"));
  at::manual_seed(2);
  const at::Tensor clip = at::tensor({2, 0, 1, 2, 2, 0}, at::kLong);
  const at::Tensor probs = at::rand({6, 4});
  const at::Tensor got = trainer::aggregate_multilabel_clips(probs, clip, 3, how);
  REQUIRE(got.sizes() == at::IntArrayRef({3, 4}));
  for (int64_t f = 0; f < 3; ++f)
    for (int64_t c = 0; c < 4; ++c) {
      double sum = 0, n = 0, best = -1;
      for (int64_t e = 0; e < 6; ++e) {
        if (clip[e].item<int64_t>() != f) continue;
        const double p = probs[e][c].item<float>();
        sum += p;
        n += 1;
        best = std::max(best, p);
      }
      CAPTURE(how, f, c);
      CHECK(got[f][c].item<float>() == Approx(how == "max" ? best : sum / n).margin(1e-6));
    }
  for (int64_t f = 0; f < 3; ++f) {
    const at::Tensor rows = probs.index_select(0, clip.eq(f).nonzero().squeeze(1));
    const at::Tensor logits = at::log(rows) - at::log1p(-rows);
    CHECK(at::allclose(trainer::multilabel_file_scores(logits, how), got[f], 1e-5, 1e-6));
  }
}

TEST_CASE("multilabel training on tone mixtures ends well above chance, and eval reports the same numbers",
          "[trainer][multilabel]") {
  TempDir d;
  const fs::path data = build_mix_dataset(d.path(), 10);
  const fs::path run = d / "run";
  auto c = test::tiny_config(data, run, 8);
  c.train.task = "multilabel";
  std::ostringstream log;
  const trainer::TrainResult r = trainer::train(c, log);
  INFO(log.str());
  REQUIRE(r.test.has_value());
  REQUIRE(r.test->is_multilabel);
  const trainer::Split test = trainer::read_split(data / "test.h5", "test", /*load_mel=*/false);
  const double chance = chance_map(test);
  const auto& m = r.test->multilabel;
  INFO("test mAP " << m.map_macro << " (micro " << m.map_micro << "), AUC " << m.auc_macro << ", chance " << chance);
  CHECK(chance < 0.65);
  CHECK(m.map_macro >= chance + 0.25);
  CHECK(m.auc_macro >= 0.85);
  CHECK(m.ap_undefined == 0);

  const auto config = read_json(run / "config.json");
  CHECK(config["train"]["task"] == "multilabel");
  CHECK(config["train"]["best_metric"] == "val_map");
  CHECK(config["model_config"]["task"] == "multilabel");
  const auto lines = test::epoch_lines(run / "metrics.jsonl");
  REQUIRE(lines.size() == 8);
  for (const char* k : {"val_map", "val_map_micro", "val_auc", "val_f1_micro", "val_loss", "train_loss"}) {
    INFO(k);
    CHECK(lines.back()[k].is_number());
  }
  CHECK_FALSE(lines.back().contains("val_macro_f1"));
  CHECK_FALSE(lines.back().contains("val_det_f1"));
  const auto report = read_json(run / "report.json");
  CHECK(report["task"] == "multilabel");
  CHECK(report["test"]["multilabel"]["map_macro"].get<double>() == m.map_macro);
  CHECK(report["test"]["multilabel"]["f1_tuned"]["threshold"].get<double>() == report["tuned_threshold"].get<double>());
  CHECK(fs::is_regular_file(run / "scores_test.csv"));
  CHECK(trainer::load_checkpoint(run / "checkpoints/best.pt").model_config["task"] == "multilabel");

  std::vector<double> scores(r.test->file_scores.data_ptr<float>(),
                             r.test->file_scores.data_ptr<float>() + r.test->file_scores.numel());
  const at::Tensor t = test.targets.to(at::kByte).contiguous();
  const std::vector<uint8_t> targets(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  const auto again = metrics::multilabel_metrics(scores, targets, test.files(), 3, 0.5);
  CHECK(again.map_macro == m.map_macro);
  CHECK(again.auc_macro == m.auc_macro);

  trainer::EvalCommandOptions e;
  e.checkpoint = run / "checkpoints" / "best.pt";
  trainer::DataOptions data_opts;
  data_opts.data = data;
  trainer::RuntimeOptions runtime;
  runtime.log_level = "warn";
  std::ostringstream out;
  const nlohmann::json ev = trainer::run_eval(e, data_opts, trainer::EvalOptions{}, runtime, out, log);
  CHECK(ev["multilabel"]["map_macro"].get<double>() == m.map_macro);
  CHECK(ev["multilabel"]["f1_tuned"]["micro"].get<double>() == m.f1_tuned.micro);
  CHECK(ev["tuned_threshold"] == report["tuned_threshold"]);
  CHECK_THAT(out.str(), Catch::Contains("mAP macro") && Catch::Contains("tuned on val") && Catch::Contains("low"));
}

TEST_CASE("multilabel training refuses a single-label dataset and multiclass flags before any work",
          "[trainer][multilabel]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 2, 3);
  auto c = test::tiny_config(data, d / "run", 1);
  c.train.task = "multilabel";
  std::ostringstream log;
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--task multilabel") &&
                                                Catch::Contains("no multi-label targets matrix"));
  CHECK_FALSE(fs::exists(d / "run" / "config.json"));
  c.train.best_metric = "val_macro_f1";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--best-metric"));
  c.train.best_metric = "auto";
  c.train.positive_class = "class0";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--positive-class"));
  c.train.positive_class.clear();
  c.eval.aggregate = "median";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--aggregate"));
  c.eval.aggregate = "mean";
  c.eval.vote = "majority";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--vote") && Catch::Contains("--aggregate"));
  c.eval.vote = "mean";
  c.train.pos_weight = "2";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--pos-weight"));
  c.train.task = "multiclass";
  c.train.positive_class = "none";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--positive-class none"));
  c.train.pos_weight = "auto";
  c.eval.aggregate = "max";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--aggregate applies to --task multilabel"));
  c.eval.aggregate = "mean";
  c.train.task = "regression";
  CHECK_THROWS_WITH(trainer::train(c, log), Catch::Contains("--task"));
}

TEST_CASE("positive class none trains without the detection head, the default names the class it took",
          "[trainer][train]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 4);
  std::ostringstream log;
  auto c = test::tiny_config(data, d / "run", 3);
  c.runtime.log_level = "info";
  const bool none = GENERATE(true, false);
  if (none) c.train.positive_class = "none";
  const trainer::TrainResult r = trainer::train(c, log);
  REQUIRE(r.test.has_value());
  const auto report = read_json(d / "run" / "report.json");
  const auto lines = test::epoch_lines(d / "run" / "metrics.jsonl");
  REQUIRE(lines.size() == 3);
  if (none) {
    CHECK(report["positive_class"] == "none");
    CHECK_FALSE(report["test"]["tiles"].contains("detection"));
    CHECK_FALSE(report["test"]["file"].contains("detection"));
    CHECK_FALSE(lines.back().contains("val_det_f1"));
    CHECK(report["test"]["tiles"]["accuracy"].get<double>() >= 0.8);
    CHECK_THAT(log.str(), Catch::Contains("--positive-class none: no detection head"));
    CHECK(trainer::load_checkpoint(d / "run" / "checkpoints/best.pt").positive_index == -1);
    trainer::PredictOptions p;
    p.checkpoint = d / "run" / "checkpoints/best.pt";
    p.inputs = {d / "in-3x4"};
    p.format = "json";
    p.device = "cpu";
    p.threads = 2;
    p.windows = d / "windows.csv";
    std::ostringstream out, plog;
    const trainer::PredictSummary summary = trainer::run_predict(p, out, plog);
    REQUIRE(summary.scored >= 12);
    CHECK(summary.failed == 0);
    for (const auto& row : nlohmann::json::parse(out.str())) {
      CHECK(row["probabilities"].size() == 3);
      CHECK(row["detection_score"].is_null());
      CHECK(row["detected"].is_null());
      CHECK(row["positive_class"].is_null());
    }
    CHECK_THAT(plog.str(), Catch::Contains("no detection head"));
    std::ifstream windows(p.windows);
    std::string header, line;
    std::getline(windows, header);
    CHECK(header.rfind("path,window,start,end,predicted,detection_score,detected,", 0) == 0);
    int window_rows = 0;
    while (std::getline(windows, line)) {
      std::vector<std::string> fields;
      std::stringstream ss(line);
      for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
      REQUIRE(fields.size() == 10);
      CHECK(fields[5].empty());
      CHECK(fields[6].empty());
      ++window_rows;
    }
    CHECK(window_rows >= summary.scored);
  } else {
    CHECK(report["positive_class"] == "class0");
    CHECK(report["test"]["tiles"].contains("detection"));
    CHECK(lines.back()["val_det_f1"].is_number());
    CHECK_THAT(log.str(), Catch::Contains("detects 'class0' (the first class)") &&
                              Catch::Contains("--positive-class none"));
  }
}

// Determinism with --mixup is proven by test_trainer_mixup.cpp ("a run with --mixup stopped after 2 epochs and resumed
// ends with the weights of an uninterrupted run", bit-exact); this test keeps what only it shows: the multi-label
// loop trains on mixed target rows and learns.
TEST_CASE("multilabel training with --mixup learns on mixed target rows", "[trainer][multilabel][mixup]") {
  TempDir d;
  const fs::path data = build_mix_dataset(d.path(), 5);
  const auto run = [&](const std::string& name, double alpha) {
    auto c = test::tiny_config(data, d / name, 6);
    c.train.task = "multilabel";
    c.mixup.alpha = alpha;
    std::ostringstream log;
    const trainer::TrainResult r = trainer::train(c, log);
    REQUIRE(r.test.has_value());
    return r.test->multilabel.map_macro;
  };
  const double a = run("a", 0.4);
  run("plain", 0.0);
  const double chance = chance_map(trainer::read_split(data / "test.h5", "test", /*load_mel=*/false));
  CAPTURE(a, chance);
  CHECK(a >= chance + 0.15);
  const auto ca = trainer::load_checkpoint(d / "a" / "checkpoints/last.pt");
  const auto cp = trainer::load_checkpoint(d / "plain" / "checkpoints/last.pt");
  bool differs = false;
  for (const auto& [name, t] : ca.model) differs = differs || !at::equal(t, cp.model.at(name));
  CHECK(differs);
  CHECK(read_json(d / "a" / "config.json")["augment"]["mixup"] == 0.4);
}

}  // namespace melforge_test_trainer_multilabel
