#pragma once
/// `melforge-build bench`: each stage of the build timed on its own, on a deterministic sample of the user's corpus,
/// by running the build's own stage functions (plan.h, batch_runner.h: scan, probe, the audio stages into the arena,
/// featurize::compute_files on the build's engine, the SplitWriter's compression and H5Dwrite_chunk), then a normal
/// build of the same sample.
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>

#include "audio_stage.h"
#include "build_options.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::builder {

/// Options of `melforge-build bench` (the build's own options come from BuildConfig).
struct BenchOptions {
  /// Files benchmarked: 0 takes every scanned audio file; N > 0 takes N files spread evenly over the scan's sorted
  /// list (index floor(i * total / N)), or all of them when there are fewer.
  int64_t bench_files = 2000;
  /// Times each stage runs over the sample, >= 1; the median is reported.
  int repeats = 3;
  /// Where to write the JSON results (empty: nowhere).
  std::filesystem::path bench_out;
  /// Existing folder in which the bench makes its scratch folder (melforge-bench-XXXXXX, removed at the end, also
  /// on error or SIGINT) for the HDF5 write stage and the end-to-end build; empty: $TMPDIR, else /tmp. Put it on the
  /// disk the dataset will go to: the write stage measures that disk (through the page cache, as a build does).
  std::filesystem::path scratch;

  /// Throws InvalidArgument naming the flag.
  void validate() const;
};

/// Registers --bench-files --repeats --bench-out --scratch.
void add_options(boost::program_options::options_description& desc, BenchOptions& opts);

/// The folder in which the scratch folder is made: opts.scratch, else $TMPDIR, else /tmp.
std::filesystem::path scratch_parent(const BenchOptions& opts);

/// Runs the bench. `config` is a build configuration whose `output` is ignored (the end-to-end build goes to the
/// scratch folder). Validates `config` (as run_build does, but without --output) and `opts` first, so bad
/// parameters throw InvalidArgument before any work. It runs the build's own stage functions (plan.h,
/// batch_runner.h) on the sample, each timed `repeats` times:
///   scan (listing of the whole corpus: entries/s), probe (headers of the sample: files/s), engine_init (the mel engine
///   of `--device`), then `repeats` runs of the build's batch runner with the writes in line rather than on the write
///   thread, so that each stage is timed alone, in batches bounded by --max-ram as a build makes them: decode
///   (libsndfile/soxr into the arena: files/s, audio s/s, input MB/s), every other audio stage of the build (augment
///   with --augment-copies: copies/s and rows/s; `extra_stages`: files/s), mel (the engine over every whole clip:
///   frames/s, audio s/s), compress (the writer's shuffle + deflate on --threads: MB/s in and out, ratio; absent with
///   --compression-level 0), write (the writer's HDF5 calls, chunks written with H5Dwrite_chunk into per-split files:
///   MB/s), write_raw (a second writer of the same chunks uncompressed, no filters: MB/s); finally end_to_end
///   (run_build of the sample with the same `extra_stages`: files/s; with the sum of the stage medians and its ratio to
///   the end-to-end median, the overlap the pipeline achieves).
/// Skipped files (scan, probe, decode or another audio stage) are counted and listed as in a build (from
/// the first run); --strict throws StrictError on the first one. Prints a table on `out` and notes on `log`;
/// returns the JSON (also written to opts.bench_out). Throws IoError, CudaError, Interrupted (request_stop(), e.g.
/// SIGINT); the scratch folder is removed in every case.
nlohmann::json run_bench(const BuildConfig& config, const BenchOptions& opts, std::ostream& out, std::ostream& log,
                         const AudioStages& extra_stages = {});

}  // namespace melforge::builder
