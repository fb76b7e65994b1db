// --task multilabel checkpoints after training: the run's summary line (mAP, not accuracy), the val-tuned threshold
// the checkpoints store, `predict` (per-class sigmoid scores, label sets at the stored threshold or --threshold, per
// tile in --windows, equal to the scores the run's final evaluation wrote), `export` (metadata and the sigmoid scores
// reproduced in Python), and the host aggregate predict runs (kernels/vote multilabel_clips) against eval's.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "catch_torch.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "eval/multilabel.h"
#include "export/export.h"
#include "export_check.h"
#include "melforge/common/errors.h"
#include "models/model.h"
#include "multilabel_fixture.h"
#include "predict/predict.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "trainer_fixture.h"
#include "util.h"
#include "venv_python.h"
#include "vote/vote.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_multilabel_predict {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// Each file's class scores in a run's scores_<split>.csv ("path,<classes>"), by path.
std::map<std::string, std::vector<double>> read_scores_csv(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  std::string line;
  std::getline(in, line);
  std::map<std::string, std::vector<double>> out;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string field, path;
    std::getline(ss, path, ',');
    while (std::getline(ss, field, ',')) out[path].push_back(std::stod(field));
  }
  return out;
}

/// `melforge-train predict` in this process: exit code, stdout, stderr.
struct Predicted {
  int code = 0;
  std::string out, log;
};
Predicted predict(const trainer::PredictOptions& opts) {
  Predicted p;
  std::ostringstream out, log;
  try {
    trainer::run_predict(opts, out, log);
  } catch (const InvalidArgument& e) {
    p.code = 2;
    log << e.what();
  } catch (const Error& e) {
    p.code = 1;
    log << e.what();
  }
  p.out = out.str();
  p.log = log.str();
  return p;
}

}  // namespace

TEST_CASE("multilabel_clips (predict's aggregate) equals eval's aggregate_multilabel_clips, labels at >= threshold",
          "[trainer][multilabel][predict]") {
  const std::string how = GENERATE(std::string("mean"), std::string("max"));
  at::manual_seed(5);
  const at::Tensor probs = at::rand({7, 3});
  const std::vector<int64_t> clip = {1, 0, 2, 1, 1, 0, 2};
  const at::Tensor want = trainer::aggregate_multilabel_clips(probs, at::tensor(clip, at::kLong), 3, how);
  const float* p = probs.data_ptr<float>();
  const double threshold = 0.5;
  const vote::ClipLabels got = vote::multilabel_clips({p, 21}, clip, 3, 3, vote::parse_aggregate(how), threshold);
  REQUIRE(got.scores.size() == 9);
  for (int64_t f = 0; f < 3; ++f)
    for (int64_t c = 0; c < 3; ++c) {
      CAPTURE(how, f, c);
      const auto k = static_cast<std::size_t>(f * 3 + c);
      CHECK(got.scores[k] == Approx(want[f][c].item<float>()).margin(1e-6));
      CHECK(got.labels[k] == (static_cast<double>(got.scores[k]) >= threshold ? 1 : 0));
    }
  const vote::ClipLabels at_score =
      vote::multilabel_clips({p, 21}, clip, 3, 3, vote::parse_aggregate(how), got.scores[5]);
  CHECK(at_score.labels[5] == 1);
  CHECK_THROWS_AS(vote::multilabel_clips({p, 21}, clip, 4, 3, vote::Aggregate::mean, 0.5), InvalidArgument);
  CHECK_THROWS_WITH(vote::parse_aggregate("median"), Catch::Contains("--aggregate"));
}

TEST_CASE("a multilabel run prints mAP and stores its val-tuned threshold, which predict and export use",
          "[trainer][multilabel][predict][export]") {
  TempDir d;
  const fs::path data = test::build_mix_dataset(d.path(), 5);
  const fs::path run = d / "run";
  const auto [code, output] = test::run_in_process(
      {"melforge-train", "train", "--data", data.string(), "--out", run.string(), "--task", "multilabel", "--epochs",
       "1", "--hidden", "24", "--batch-size", "16", "--threads", "2", "--lr", "3e-3", "--device", "cpu"});
  INFO(output);
  REQUIRE(code == 0);
  const nlohmann::json report = test::read_json(run / "report.json");
  const double tuned = report["tuned_threshold"].get<double>();
  CHECK_THAT(output, Catch::Contains(trainer::fmt("test: mAP %.4f", report["test"]["multilabel"]["map_macro"].get<double>())) &&
                         Catch::Contains("at the threshold tuned on val") && !Catch::Contains("test: accuracy"));
  const fs::path best = run / "checkpoints" / "best.pt";
  const trainer::Checkpoint ck = trainer::load_checkpoint(best);
  CHECK(ck.state[trainer::kTunedThresholdKey].get<double>() == tuned);
  CHECK(trainer::stored_threshold(ck.state, "best.pt") == tuned);
  for (const auto& line : test::epoch_lines(run / "metrics.jsonl")) CHECK(line["val_tuned_threshold"].is_number());

  // predict on the test files: the final evaluation's scores (scores_test.csv), labels at the stored threshold.
  const auto scores = read_scores_csv(run / "scores_test.csv");
  REQUIRE(scores.size() == 7);
  trainer::PredictOptions opts;
  opts.checkpoint = best;
  for (const auto& [path, s] : scores) opts.inputs.push_back(d / path);
  opts.format = "json";
  opts.device = "cpu";
  opts.threads = 2;
  opts.windows = d / "windows.json";
  Predicted p = predict(opts);
  REQUIRE(p.code == 0);
  CHECK_THAT(p.log, Catch::Contains("--task multilabel: mean class scores") &&
                        Catch::Contains("the threshold tuned on val, stored in the checkpoint"));
  const nlohmann::json rows = nlohmann::json::parse(p.out);
  const nlohmann::json windows = nlohmann::json::parse(std::ifstream(opts.windows));
  REQUIRE(rows.size() == 7);
  std::size_t window = 0;
  for (const auto& row : rows) {
    const std::string rel = fs::relative(row["path"].get<std::string>(), d.path()).string();
    CAPTURE(rel);
    REQUIRE(scores.count(rel));
    CHECK(row["threshold"].get<double>() == tuned);
    std::vector<std::string> labels;
    for (std::size_t c = 0; c < ck.class_names.size(); ++c) {
      const double s = row["probabilities"][ck.class_names[c]].get<double>();
      CHECK(s == Approx(scores.at(rel)[c]).margin(1e-5));
      if (s >= tuned) labels.push_back(ck.class_names[c]);
    }
    CHECK(row["labels"] == labels);
    const int64_t n = row["num_windows"].get<int64_t>();
    REQUIRE(n >= 1);
    std::vector<double> mean(ck.class_names.size(), 0.0);
    for (int64_t k = 0; k < n; ++k, ++window) {
      const auto& w = windows.at(window);
      CHECK(w["path"] == row["path"]);
      CHECK(w["window"] == k);
      std::vector<std::string> wl;
      for (std::size_t c = 0; c < ck.class_names.size(); ++c) {
        const double s = w["probabilities"][ck.class_names[c]].get<double>();
        mean[c] += s / static_cast<double>(n);
        if (s >= tuned) wl.push_back(ck.class_names[c]);
      }
      CHECK(w["labels"] == wl);
    }
    for (std::size_t c = 0; c < ck.class_names.size(); ++c)
      CHECK(mean[c] == Approx(row["probabilities"][ck.class_names[c]].get<double>()).margin(1e-6));
  }
  CHECK(window == windows.size());

  // CSV, --threshold and --aggregate max.
  opts.format = "csv";
  opts.windows.clear();
  opts.threshold = 0.97;
  opts.aggregate = "max";
  p = predict(opts);
  REQUIRE(p.code == 0);
  CHECK_THAT(p.log, Catch::Contains("max class scores") && Catch::Contains("0.97 (--threshold)"));
  std::istringstream csv(p.out);
  std::string line;
  std::getline(csv, line);
  CHECK(line == "path,labels,p_high,p_low,p_mid,error");
  int csv_rows = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    if (line.back() == ',') f.emplace_back();
    REQUIRE(f.size() == 6);
    std::string labels;
    for (std::size_t c = 0; c < 3; ++c)
      if (std::stod(f[2 + c]) >= 0.97) labels += (labels.empty() ? "" : ";") + ck.class_names[c];
    CHECK(f[1] == labels);
    CHECK(std::stod(f[2]) >= rows.at(static_cast<std::size_t>(csv_rows))["probabilities"]["high"].get<double>() - 1e-6);
    ++csv_rows;
  }
  CHECK(csv_rows == 7);

  // Refusals: --vote majority, a bad --aggregate; a checkpoint without a stored threshold uses 0.5 and says so.
  opts.threshold.reset();
  opts.aggregate.clear();
  opts.vote = "majority";
  CHECK(predict(opts).code == 2);
  opts.vote = "mean";
  opts.aggregate = "median";
  CHECK(predict(opts).code == 2);
  opts.aggregate.clear();
  trainer::Checkpoint bare = ck;
  bare.state.erase(trainer::kTunedThresholdKey);
  trainer::save_checkpoint(bare, d / "bare.pt");
  opts.checkpoint = d / "bare.pt";
  p = predict(opts);
  REQUIRE(p.code == 0);
  CHECK_THAT(p.log, Catch::Contains("0.5 (the default: the checkpoint stores no threshold tuned on val)"));
  bare.state[trainer::kTunedThresholdKey] = 7;
  trainer::save_checkpoint(bare, d / "bad.pt");
  opts.checkpoint = d / "bad.pt";
  p = predict(opts);
  CHECK(p.code == 1);
  CHECK_THAT(p.log, Catch::Contains("tuned_threshold") && Catch::Contains("bad.pt"));

  // export: the metadata says multilabel, sigmoid scores, the threshold; Python reproduces the scores.
  trainer::ExportOptions eo;
  eo.checkpoint = best;
  eo.out = d / "export" / "weights.pt";
  fs::create_directories(eo.out.parent_path());
  std::ostringstream eout;
  trainer::run_export(eo, eout);
  CHECK_THAT(eout.str(), Catch::Contains("--task multilabel"));
  const nlohmann::json meta = test::read_json(d / "export" / "weights.pt.json");
  CHECK(meta["task"] == "multilabel");
  CHECK(meta["scores"] == "sigmoid");
  CHECK(meta["aggregate"] == "mean");
  CHECK(meta["threshold"].get<double>() == tuned);
  const std::string python = test::venv_python();
  INFO("the torch venv of tools/setup_torch.sh (bash tools/setup_torch.sh)");
  REQUIRE_FALSE(python.empty());
  const auto model = trainer::make_model_from_json(ck.model_config, /*any_task=*/true);
  trainer::load_state_dict(*model, ck.model, "best.pt");
  model->eval();
  at::manual_seed(3);
  const at::Tensor x = at::randn({3, 32, 31}) * 10.0 - 40.0;
  const at::Tensor lengths = at::tensor(std::vector<int64_t>{31, 12, 1}, at::kLong);
  trainer::ModelOutput out;
  {
    c10::NoGradGuard no_grad;
    out = model->forward(x, lengths);
  }
  std::string check_output;
  const int rc = test::check_export_in_python(
      python, eo.out, x,
      {{"logits", out.logits}, {"detection", out.detection}, {"scores", at::sigmoid(out.logits)}}, check_output,
      lengths);
  INFO(check_output);
  CHECK(rc == 0);
  CHECK_THAT(check_output, Catch::Contains("scores (sigmoid)"));
}

}  // namespace melforge_test_trainer_multilabel_predict
