#include "cv/cv_command.h"

#include <boost/program_options.hpp>

#include <cmath>
#include <limits>
#include <utility>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"
#include "util.h"

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace melforge::trainer {

data::CvOptions CvCommandOptions::parse(uint64_t seed) const {
  data::CvOptions o;
  data::parse_val_option(val, o);
  if (!folds.empty()) o.folds = data::parse_fold_list(folds);
  o.seed = seed;
  o.validate();
  return o;
}

void add_options(po::options_description& desc, CvCommandOptions& opts) {
  desc.add_options()("folds", po::value(&opts.folds)->value_name("1,2,..."),
                     "cv: the test folds to run (default: every fold of the dataset)")(
      "val", po::value(&opts.val)->default_value(opts.val)->value_name("fold-offset|ratio[:R]"),
      "cv: val is the next fold (fold-offset, K wraps to 1) or a share R (default 0.1) of the training folds' files, "
      "whole groups, stratified by class, drawn with --seed");
}

namespace {

/// Throws InvalidArgument for what cv cannot do, then validates the train configuration.
void check_cv_config(const TrainConfig& config) {
  if (!config.train.resume.empty())
    throw InvalidArgument("--resume: melforge-train cv resumes by itself: run the same cv command again (complete "
                          "folds are skipped, a partial fold's run is resumed)");
  if (config.train.verification())
    throw InvalidArgument("--task verification: cv reports a classification metric; use --task multiclass or "
                          "multilabel");
  if (config.train.out.empty()) throw InvalidArgument("--out: cv needs the folder of its fold runs");
  config.validate();
}

/// The pool indices `indices` as (split, row) pairs.
std::vector<std::pair<int, int64_t>> pool_rows(const data::FoldPool& pool, const std::vector<int64_t>& indices) {
  std::vector<std::pair<int, int64_t>> rows;
  for (const int64_t i : indices)
    rows.emplace_back(pool.split[static_cast<std::size_t>(i)], pool.row[static_cast<std::size_t>(i)]);
  return rows;
}

/// The fold's train, val and test splits cut from the pooled splits of `data`.
Dataset fold_dataset(const Dataset& data, const data::FoldPool& pool, const data::CvFold& fold) {
  const std::vector<const Split*> sources = {&data.train, &data.val, &data.test};
  Dataset d;
  d.dir = data.dir;
  d.info = data.info;
  d.class_names = data.class_names;
  const std::string name = "cv fold " + std::to_string(fold.fold) + " ";
  d.train = subset_split(sources, pool_rows(pool, fold.train), "train", data.dir / (name + "train"));
  d.val = subset_split(sources, pool_rows(pool, fold.val), "val", data.dir / (name + "val"));
  d.test = subset_split(sources, pool_rows(pool, fold.test), "test", data.dir / (name + "test"));
  return d;
}

/// DIR/cv_splits.json: the membership of every fold. A DIR that records other membership is refused unless
/// `overwrite` (InvalidArgument naming --out).
void record_splits(const fs::path& dir, const data::FoldPool& pool, const std::vector<data::CvFold>& all,
                   const data::CvOptions& cv, bool overwrite) {
  nlohmann::json j = {{"dataset", fs::absolute(pool.dir).string()}, {"build_id", pool.build_id},
                      {"num_folds", pool.num_folds}, {"val", cv.val_text()}, {"seed", cv.seed},
                      {"folds", nlohmann::json::array()}};
  for (const auto& f : all) j["folds"].push_back(data::cv_fold_json(pool, f));
  const fs::path file = dir / "cv_splits.json";
  if (!overwrite && fs::exists(file)) {
    const auto before = nlohmann::json::parse(read_regular_file(file, "cv_splits.json"), nullptr, false);
    if (before.is_discarded() || before.value("folds", nlohmann::json()) != j["folds"] ||
        before.value("build_id", std::string()) != pool.build_id)
      throw InvalidArgument("--out " + utf8::for_terminal(dir.string()) + " holds a cross-validation with other " +
                            "fold membership (its cv_splits.json: another build of the dataset, --val or --seed); " +
                            "use another --out, or --overwrite to train every fold again");
  }
  fs::create_directories(dir);
  write_json_atomically(file, j);
}

/// A JSON number of `j` at `pointer`, NaN for null; FormatError naming `file` when it is missing.
double report_number(const nlohmann::json& j, const std::string& pointer, const fs::path& file) {
  const nlohmann::json::json_pointer p(pointer);
  if (!j.contains(p) || !(j.at(p).is_number() || j.at(p).is_null()))
    throw FormatError(utf8::for_terminal(file.string()) + " has no number at " + pointer +
                      " (not a complete run report: remove the fold's folder to train it again)");
  return j.at(p).is_null() ? std::numeric_limits<double>::quiet_NaN() : j.at(p).get<double>();
}

/// The test metrics of a fold's report.json.
std::map<std::string, double> fold_metrics(const fs::path& report, bool multilabel) {
  const auto j = nlohmann::json::parse(read_regular_file(report, "a fold's report.json"), nullptr, false);
  if (j.is_discarded()) throw FormatError(utf8::for_terminal(report.string()) + " is not valid JSON");
  if (multilabel) return {{"map", report_number(j, "/test/multilabel/map_macro", report)}};
  return {{"file_accuracy", report_number(j, "/test/file/accuracy", report)},
          {"file_macro_f1", report_number(j, "/test/file/macro_f1", report)}};
}

/// Trains (or skips, or resumes) test fold `fold` into DIR/fold-<f>; false when a hook stopped its run.
bool run_fold(const TrainConfig& config, const Dataset& data, const data::FoldPool& pool, const data::CvFold& fold,
              const Logger& log, const TrainHooks& hooks, CvFoldResult& r) {
  const fs::path dir = config.train.out / ("fold-" + std::to_string(fold.fold));
  r = {fold.fold, fold.val_fold, static_cast<int64_t>(fold.train.size()), static_cast<int64_t>(fold.val.size()),
       static_cast<int64_t>(fold.test.size()), {}, dir, false, false};
  const fs::path report = dir / "report.json";
  if (!config.train.overwrite && fs::exists(report)) {
    log.info("cv: fold " + std::to_string(fold.fold) + " is complete (" + report.string() + "): skipped");
    r.skipped = true;
    r.metrics = fold_metrics(report, config.train.multilabel());
    return true;
  }
  TrainConfig c = config;
  c.train.out = dir;
  r.resumed = !config.train.overwrite && fs::exists(dir / "checkpoints" / "last.pt");
  if (r.resumed) {
    c.train.resume = dir;
    c.given.clear();
  } else {
    c.train.overwrite = fs::exists(dir);
  }
  const Dataset fold_data = fold_dataset(data, pool, fold);
  TrainHooks h = hooks;
  h.dataset = [&fold_data] { return fold_data; };
  log.info(fmt("cv: fold %lld (%s): train %lld, val %lld, test %lld files -> %s", static_cast<long long>(fold.fold),
               r.resumed ? "resuming its run" : "training", static_cast<long long>(r.train_files),
               static_cast<long long>(r.val_files), static_cast<long long>(r.test_files), dir.string().c_str()));
  if (train(c, log.stream(), h).interrupted) return false;
  r.metrics = fold_metrics(report, config.train.multilabel());
  return true;
}

/// Mean and sample standard deviation of each metric over the folds.
void summarize(CvResult& result) {
  for (const auto& entry : result.folds.front().metrics) {
    const std::string& name = entry.first;
    double sum = 0;
    for (const auto& f : result.folds) sum += f.metrics.at(name);
    const auto n = static_cast<double>(result.folds.size());
    const double mean = sum / n;
    double squares = 0;
    for (const auto& f : result.folds) squares += (f.metrics.at(name) - mean) * (f.metrics.at(name) - mean);
    result.mean[name] = mean;
    result.std[name] = result.folds.size() > 1 ? std::sqrt(squares / (n - 1)) : 0.0;
  }
}

/// A JSON number, or null for NaN.
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

/// DIR/cv_report.json.
void write_report(const CvResult& result, const TrainConfig& config, const data::FoldPool& pool,
                  const data::CvOptions& cv) {
  nlohmann::json folds = nlohmann::json::array(), mean, spread;
  for (const auto& f : result.folds) {
    nlohmann::json metrics;
    for (const auto& [k, v] : f.metrics) metrics[k] = number(v);
    folds.push_back({{"fold", f.fold},
                     {"val_fold", f.val_fold},
                     {"files", {{"train", f.train_files}, {"val", f.val_files}, {"test", f.test_files}}},
                     {"metrics", metrics},
                     {"run_dir", fs::absolute(f.run_dir).string()},
                     {"skipped", f.skipped},
                     {"resumed", f.resumed}});
  }
  for (const auto& [k, v] : result.mean) mean[k] = number(v);
  for (const auto& [k, v] : result.std) spread[k] = number(v);
  const nlohmann::json j = {{"dataset", fs::absolute(config.data.data).string()},
                            {"build_id", pool.build_id},
                            {"num_folds", pool.num_folds},
                            {"val", cv.val_text()},
                            {"seed", cv.seed},
                            {"metric", result.metric},
                            {"folds", folds},
                            {"mean", mean},
                            {"std", spread},
                            {"std_kind", "sample (n - 1); 0 for a single fold"},
                            {"splits", "cv_splits.json"},
                            {"options", config.to_json()}};
  write_json_atomically(result.report, j);
}

}  // namespace

CvResult run_cv(TrainConfig config, const CvCommandOptions& options, std::ostream& log_stream,
                const TrainHooks& hooks) {
  check_cv_config(config);
  const data::CvOptions cv = options.parse(config.model.seed);
  const Logger log = Logger::from(log_stream, config.runtime);
  const Dataset meta = load_dataset(config.data.data, /*load_frames=*/false);
  const data::FoldPool pool = data::pool_folds({&meta.train.meta, &meta.val.meta, &meta.test.meta}, meta.dir);
  data::CvOptions every = cv;
  every.folds.clear();
  const std::vector<data::CvFold> chosen = data::cv_splits(pool, cv);
  if (chosen.empty())
    throw FormatError("the dataset " + utf8::for_terminal(meta.dir.string()) + " has folds but no files");
  record_splits(config.train.out, pool, data::cv_splits(pool, every), cv, config.train.overwrite);
  const int64_t available = available_memory_bytes();
  const Dataset data = load_dataset(config.data.data, config.data.stream, available < 0 ? -1 : available / 2,
                                    hooks.on_load);
  log.info(fmt("cv: %lld files in %lld folds, %lld test folds to run (val %s); frames %s",
               static_cast<long long>(pool.size()), static_cast<long long>(pool.num_folds),
               static_cast<long long>(chosen.size()), cv.val_text().c_str(),
               data.train.streamed() ? "streamed from the files" : "in RAM, read once"));
  CvResult result;
  result.metric = config.train.multilabel() ? "map" : "file_accuracy";
  result.report = config.train.out / "cv_report.json";
  for (const auto& fold : chosen) {
    CvFoldResult r;
    if (!run_fold(config, data, pool, fold, log, hooks, r)) {
      result.interrupted = true;
      return result;
    }
    result.folds.push_back(std::move(r));
  }
  summarize(result);
  write_report(result, config, pool, cv);
  return result;
}

std::string cv_summary_line(const CvResult& r) {
  const bool map = r.metric == "map";
  return fmt("cv: mean %s %.3f \u00b1 %.3f over %lld folds", map ? "mAP" : "file accuracy", r.mean.at(r.metric),
             r.std.at(r.metric), static_cast<long long>(r.folds.size()));
}

}  // namespace melforge::trainer
