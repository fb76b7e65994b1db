#pragma once
/// The results of melforge-build bench: the seconds of each stage over the repeats, the figures of the runs, and
/// from them the JSON and the printed table.
#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch_runner.h"
#include "bench.h"
#include "build_state.h"

namespace melforge::builder {

/// Seconds of each stage, one entry per repeat, in first-use order. A stage timed several times in one repeat (per
/// batch) adds up.
class RepeatTimes {
 public:
  /// `repeats` >= 1 entries per stage.
  explicit RepeatTimes(int repeats) : repeats_(repeats) {}
  /// Adds `seconds` to repeat `repeat` (0-based) of `stage`.
  void add(const std::string& stage, int repeat, double seconds);
  /// Whether `stage` was timed.
  bool has(const std::string& stage) const { return seconds_.count(stage) > 0; }
  /// [repeats] seconds of `stage`.
  const std::vector<double>& seconds(const std::string& stage) const { return seconds_.at(stage); }
  /// Median over the repeats of `stage`, seconds.
  double median(const std::string& stage) const;
  /// Stages in first-use order.
  const std::vector<std::string>& order() const { return order_; }
  /// Repeats per stage.
  int repeats() const { return repeats_; }

 private:
  int repeats_;
  std::vector<std::string> order_;
  std::map<std::string, std::vector<double>> seconds_;
};

/// What the bench measured besides the stage times.
struct BenchFigures {
  /// Entries the scan found (audio files plus skipped entries).
  int64_t scanned = 0;
  /// Audio files the scan found.
  int64_t audio_files = 0;
  /// Audio files in the sample.
  int64_t selected = 0;
  /// The sample is the whole corpus.
  bool whole = false;
  /// Rows the audio stages ran on in one run: the sample's files that passed probe and plan, and their augmented
  /// copies (--augment-copies).
  int64_t decoded = 0;
  /// Augmented copies among `decoded` (0 without augmentation).
  int64_t augmented = 0;
  /// Bytes of those files on disk.
  int64_t input_bytes = 0;
  /// Bytes of their arena slices (4 * plan.samples, summed).
  int64_t arena_bytes = 0;
  /// Frames per HDF5 chunk (chunk_frames, as the writer cuts them).
  int64_t frames_per_chunk = 0;
  /// Bytes of one uncompressed chunk: frames_per_chunk * the bytes of one frame.
  int64_t chunk_bytes = 0;
  /// --compression-level > 0: writes[0] of `run` compressed, writes[1] the same chunks raw.
  bool compressed = false;
  /// The first run of the batches.
  BatchTotals run;
  /// Files skipped by the plan and by the first run, in order.
  std::vector<SkippedFile> skipped;
  /// Names of the build's audio stages, in order (decode first).
  std::vector<std::string> audio_stages;
};

/// One throughput of a stage.
struct Rate {
  /// Units per second.
  double value = 0;
  /// Unit as printed, e.g. "files/s".
  std::string unit;
  /// Key in the stage's JSON `per_s`, e.g. "files".
  std::string key;
};

/// Stage name -> its throughputs (first one printed on the stage's row).
using StageRates = std::map<std::string, std::vector<Rate>>;

/// The throughputs of every stage from the figures and the stage medians; end_to_end's from `e2e_report` (the
/// first end-to-end build's report).
StageRates stage_rates(const BenchFigures& figures, const RepeatTimes& times, const nlohmann::json& e2e_report);

/// The bench's JSON (documented in bench.h and docs/PERFORMANCE.md): versions, engine, configuration
/// (`e2e_report`'s, with --input and --manifest as given and no output), bench parameters, machine, file counts,
/// bytes, chunks, each stage's seconds, median and rates, the sum of the stage medians against the end-to-end
/// median, and the checks of the figures against the end-to-end build. `parent`: the folder of the scratch folder.
nlohmann::json bench_results(const BuildState& state, const BenchOptions& opts, const std::filesystem::path& parent,
                             const BenchFigures& figures, const RepeatTimes& times, const StageRates& rates,
                             const nlohmann::json& e2e_report);

/// Prints the bench's table on `out` from `results` (bench_results): the sample, the skipped files, one row per
/// stage with its median and rates, the sum of stages against end to end, and a note when a check failed.
void print_bench_table(std::ostream& out, const nlohmann::json& results, const RepeatTimes& times,
                       const StageRates& rates, const nlohmann::json& e2e_report);

}  // namespace melforge::builder
