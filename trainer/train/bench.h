#pragma once
/// `melforge-train bench`: the data pipeline, the training step and the evaluation of a dataset, each timed on its
/// own.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>

#include "train/config.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// `bench` settings.
struct BenchOptions {
  /// Timed training steps (after warmup), >= 1.
  int64_t steps = 50;
  /// Untimed warmup steps, >= 0.
  int64_t warmup = 5;
  /// Where to write the JSON results (empty: nowhere).
  std::filesystem::path out;

  /// Throws InvalidArgument naming the flag.
  void validate() const;
};

/// Registers --steps --warmup-steps --out.
void add_options(boost::program_options::options_description& desc, BenchOptions& opts);

/// `bench`: on the dataset of config.data, times separately the data pipeline (batches/s and samples/s of the
/// loader, with prefetch), the training step on a batch already in place (samples/s), and the evaluation of
/// the val split (files/s). Prints a table on `out` and returns (and writes to opts.out) the JSON:
/// {"device", "threads", "model", "positive_class", "data_pipeline", "train_step", "evaluation",
/// "melforge_version"}.
nlohmann::json run_bench(const TrainConfig& config, const BenchOptions& opts, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
