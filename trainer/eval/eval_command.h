#pragma once
/// `melforge-train eval`: a checkpoint evaluated on one split of a dataset, printed as a summary and written as a
/// JSON report.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>

#include "eval/evaluate.h"
#include "options.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// `eval` settings besides the data, evaluation and runtime groups.
struct EvalCommandOptions {
  /// The checkpoint to evaluate.
  std::filesystem::path checkpoint;
  /// Where to write the JSON report (empty: nowhere; the summary is printed either way).
  std::filesystem::path out;

  /// Throws InvalidArgument when the checkpoint is missing.
  void validate() const;
};

/// Registers --checkpoint --out.
void add_options(boost::program_options::options_description& desc, EvalCommandOptions& opts);

/// `eval`: loads the checkpoint and the dataset, checks they fit, evaluates split eval.split and prints a summary
/// on `out` (and the JSON report to opts.out). Returns the report: {"checkpoint", "data", "split", "classes",
/// "positive_class", "segment", "file", "seconds", "files_per_s"}.
nlohmann::json run_eval(const EvalCommandOptions& opts, const DataOptions& data, const EvalOptions& eval,
                        const RuntimeOptions& runtime, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
