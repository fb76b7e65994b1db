// `melforge-train cv` (issue 30): one run per test fold of a dataset with folds, the frames read once, per-fold and
// mean ± std of the protocol's metric in cv_report.json and one summary line, resume after a stop (complete folds
// not retrained), and the refusals before any work.
#include "catch_torch.h"

#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cv/cv_command.h"
#include "fold_fixture.h"
#include "melforge/common/errors.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_cv {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

using test::read_json;
using test::run_in_process;
using test::tiny_config;

namespace {

/// A tone dataset of 3 classes x 10 files (30 files) with 5 folds of 6 files (add_folds: groups of two files).
fs::path folded_dataset(const TempDir& tmp) {
  const fs::path dir = test::build_tone_dataset(tmp.path(), 3, 9);
  test::add_folds(dir, 5);
  return dir;
}

}  // namespace

TEST_CASE("cv trains one run per fold from frames read once, reports mean and std, resumes after a stop", "[cv]") {
  TempDir tmp;
  const fs::path data = folded_dataset(tmp);
  const fs::path out = tmp / "cv";
  trainer::TrainConfig config = tiny_config(data, out, 2);
  trainer::CvCommandOptions options;
  std::ostringstream log;
  int loads = 0, epochs = 0;
  trainer::TrainHooks stop;
  // on_load is polled before each block of frames read into RAM: one block per split file of this tiny dataset, so 3
  // for the whole cv (not 3 per fold: the folds are cut from the pool, nothing is read again).
  stop.on_load = [&] { ++loads; };
  stop.on_epoch_end = [&](int64_t) { return ++epochs < 3; };
  const trainer::CvResult stopped = trainer::run_cv(config, options, log, stop);
  CHECK(stopped.interrupted);
  CHECK(loads == 3);
  CHECK(fs::exists(out / "fold-1" / "report.json"));
  CHECK(fs::exists(out / "fold-2" / "checkpoints" / "last.pt"));
  CHECK_FALSE(fs::exists(out / "fold-2" / "report.json"));
  CHECK_FALSE(fs::exists(out / "cv_report.json"));
  const auto best_time = fs::last_write_time(out / "fold-1" / "checkpoints" / "best.pt");
  const auto last_time = fs::last_write_time(out / "fold-1" / "checkpoints" / "last.pt");

  trainer::TrainHooks count;
  loads = 0;
  count.on_load = [&] { ++loads; };
  const trainer::CvResult r = trainer::run_cv(config, options, log, count);
  REQUIRE_FALSE(r.interrupted);
  CHECK(loads == 3);
  REQUIRE(r.folds.size() == 5);
  CHECK(r.folds[0].skipped);
  CHECK(r.folds[1].resumed);
  CHECK(fs::last_write_time(out / "fold-1" / "checkpoints" / "best.pt") == best_time);
  CHECK(fs::last_write_time(out / "fold-1" / "checkpoints" / "last.pt") == last_time);
  CHECK(test::epoch_lines(out / "fold-2" / "metrics.jsonl").size() == 2);

  const auto report = read_json(out / "cv_report.json");
  REQUIRE(report["folds"].size() == 5);
  CHECK(report["metric"] == "file_accuracy");
  CHECK(report["build_id"] == data::read_build_id(data / "train.h5"));
  CHECK_FALSE(report["build_id"].get<std::string>().empty());
  double sum = 0;
  for (int f = 0; f < 5; ++f) {
    const auto& j = report["folds"][static_cast<std::size_t>(f)];
    INFO("fold " << f + 1);
    CHECK(j["fold"] == f + 1);
    CHECK(j["val_fold"] == (f + 1) % 5 + 1);
    CHECK(j["files"]["test"] == 6);
    CHECK(j["files"]["val"] == 6);
    CHECK(j["files"]["train"] == 18);
    const auto run = read_json(out / ("fold-" + std::to_string(f + 1)) / "report.json");
    CHECK(j["metrics"]["file_accuracy"].get<double>() == run["test"]["file"]["accuracy"].get<double>());
    CHECK(j["metrics"]["file_macro_f1"].get<double>() == run["test"]["file"]["macro_f1"].get<double>());
    sum += j["metrics"]["file_accuracy"].get<double>();
  }
  CHECK(report["mean"]["file_accuracy"].get<double>() == Approx(sum / 5));
  CHECK(report["std"]["file_accuracy"].get<double>() >= 0);
  CHECK(std::regex_match(trainer::cv_summary_line(r),
                         std::regex("cv: mean file accuracy [01]\\.\\d{3} \u00b1 [01]\\.\\d{3} over 5 folds")));

  const auto splits = read_json(out / "cv_splits.json");
  REQUIRE(splits["folds"].size() == 5);
  for (const auto& fold : splits["folds"]) {
    std::set<std::string> test_paths;
    for (const auto& m : fold["test"])
      test_paths.insert(m[0].get<std::string>() + "/" + std::to_string(m[1].get<int>()));
    CHECK(test_paths.size() == 6);
  }
}

TEST_CASE("cv on the command line: one summary line, refusals before any work", "[cv]") {
  TempDir tmp;
  const fs::path data = folded_dataset(tmp);
  const std::vector<std::string> base = {"melforge-train", "cv", "--data", data.string(), "--epochs", "1",
                                         "--hidden", "24", "--batch-size", "16", "--threads", "2",
                                         "--log-level", "warn"};
  const auto [code, text] =
      run_in_process(test::with(base, {"--out", (tmp / "cv").string(), "--folds", "3,1", "--val", "ratio"}));
  INFO(text);
  REQUIRE(code == 0);
  CHECK(std::regex_search(text, std::regex("(^|\n)cv: mean file accuracy [01]\\.\\d{3} \u00b1 [01]\\.\\d{3} over 2 "
                                           "folds\n")));
  const auto report = read_json(tmp / "cv" / "cv_report.json");
  CHECK(report["val"] == "ratio:0.1");
  CHECK(report["folds"].size() == 2);
  CHECK(report["folds"][0]["fold"] == 1);

  const auto refused = [&](const std::vector<std::string>& more, int exit_code, const std::string& needle) {
    const auto [c, t] = run_in_process(test::with(base, more));
    INFO(t);
    CHECK(c == exit_code);
    CHECK(t.find(needle) != std::string::npos);
  };
  refused({"--out", (tmp / "a").string(), "--folds", "1,7"}, 2, "--folds: fold 7 is not a fold of");
  refused({"--out", (tmp / "a").string(), "--val", "ratio:0.9"}, 2, "--val");
  refused({"--out", (tmp / "a").string(), "--resume", (tmp / "cv" / "fold-1").string()}, 2, "resumes by itself");
  CHECK_FALSE(fs::exists(tmp / "a"));
  const fs::path plain = test::build_tone_dataset(tmp.path(), 3, 2, "plain");
  const std::vector<std::string> no_folds = {"melforge-train", "cv", "--data", plain.string(), "--out",
                                             (tmp / "b").string(), "--epochs", "1"};
  const auto [c, t] = run_in_process(no_folds);
  CHECK(c == 1);
  CHECK(t.find("melforge-build --folds K") != std::string::npos);
  CHECK(t.find("--layout") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "b"));
  refused({"--out", (tmp / "cv").string(), "--val", "fold-offset"}, 2, "other fold membership");
}

}  // namespace melforge_test_trainer_cv
