#pragma once
/// melforge-build merge: joins the output folders of a `--shard K/N` series into one dataset whose train.h5, val.h5
/// and test.h5 hold the files in exactly the order of an unsharded build (docs/FORMAT.md, "Sharded builds and merge").
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

namespace boost::program_options {
class options_description;
}

namespace melforge::builder {

/// Options of `melforge-build merge`.
struct MergeOptions {
  /// Output folders of `melforge-build --shard K/N`, one per shard, in any order.
  std::vector<std::filesystem::path> shards;
  /// Output folder for train.h5, val.h5, test.h5 and build_report.json.
  std::filesystem::path output;
  /// Spectrograms copied and recompressed into the merged files, instead of virtual datasets over the shard files
  /// (hard-linked, or copied, into OUT/sources/).
  bool copy = false;
  /// Replace existing outputs in `output`.
  bool overwrite = false;
  /// Threads that recompress chunks with `copy` (0: all cores).
  int threads = 0;
  /// Checks the options and folders before any work: at least one shard folder, each an existing folder and given
  /// once, `output` absent, empty or `overwrite`, and not one of the shard folders. Throws InvalidArgument.
  void validate() const;
};

/// Registers --output --copy --overwrite --threads and the positional shard folders (option name "shards").
void add_options(boost::program_options::options_description& desc, MergeOptions& opts);

/// Validates `options`, then that the shards agree: each folder holds a finished shard build (build_report.json
/// with a "shard" entry, train.h5, val.h5, test.h5, none of them virtual), all with the same N, indices 1..N each
/// present once, the same corpus fingerprint, schema version (3: shards of schema 1 or 2 are refused, naming the
/// file), root attributes, class names, frame width, element type, chunk shape and filters. Throws FormatError naming
/// the file and the disagreement otherwise, before writing anything. Then writes each split's file (frames as a
/// virtual dataset over the shards' split files, which are hard-linked (or, where impossible, copied) into
/// OUT/sources/ as <split>-<K>of<N>.h5 so that the merged folder is self-contained and passes the readers' rule that
/// virtual sources lie inside the dataset's folder; frame_offset rebased onto the concatenation, the other datasets
/// copied; or everything copied with `copy`) in OUT/.partial/, moves them into OUT under the same lock and rules as
/// a build, and writes OUT/build_report.json last, with a new build_id (also the root attribute `build_id` of each
/// merged file). Returns that report. Throws IoError on write failures (nothing in OUT is replaced then).
nlohmann::json run_merge(const MergeOptions& options);

}  // namespace melforge::builder
