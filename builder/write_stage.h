#pragma once
/// The write stage of the batch runner: each split's frames and metadata go to <folder>/<split>.h5 through a
/// SplitWriter (chunks compressed in parallel, then H5Dwrite_chunk), for every write target.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "build_state.h"
#include "h5_writer.h"

namespace melforge::builder {

/// A folder the batch runner writes every split to. A build has one (its staging folder); the bench adds a second
/// one without compression to time raw writes.
struct WriteTarget {
  /// Folder that receives <split>.h5 (must exist).
  std::filesystem::path folder;
  /// Deflate level of its `frames` dataset, 0..9 (0: raw chunks, no filters).
  int compression_level = 0;
};

/// What the writers of one target did, summed over the splits.
struct WriteTotals {
  /// The split files written, in split order.
  std::vector<std::filesystem::path> files;
  /// Seconds spent compressing chunks (SplitWriter::compress_seconds).
  double compress_s = 0;
  /// Seconds spent in HDF5 calls that write (SplitWriter::write_seconds).
  double write_s = 0;
  /// Bytes of `frames` chunks written, compressed where the target compresses.
  int64_t bytes = 0;
  /// `frames` chunks written.
  int64_t chunks = 0;
};

/// True when a file of `scan` has a group: the build writes the `group` dataset.
bool has_groups(const ScanResult& scan);

/// The identifier of the build of `state` (whose plan is made): identity_hash of the melforge version, the corpus
/// fingerprint (paths, labels and splits of every scanned entry, the skipped ones), every parameter attribute
/// (dataset_attributes, so the shard, augmentation and speed-speaker settings too), the --test-trials list's trials
/// and, for each file the build writes, its path,
/// its planned frames, and its size and modification time (nanoseconds). Identical inputs and parameters give the same
/// identifier (and byte-identical files); another corpus, other parameters or a changed input file another one.
std::string build_identity(const BuildState& state);

/// The front-end's root attributes (docs/FORMAT.md): `features` ("mel" or "fbank") and, for fbank, every fbank
/// parameter under torchaudio's name (data::fbank_attributes). The report's configuration lists the same.
std::vector<Attribute> front_end_attributes(const mel::MelArgs& mel);

/// Root attributes describing every parameter of a build of `state` (whose plan and engine are set), with the
/// front-end's (front_end_attributes), with
/// split_by ("class") with --split-by class, folds (K) when the files have folds, shard_index and shard_count for a
/// --shard build, the augment_* settings with --augment-copies, speed_speakers (the factors as %g, comma-separated)
/// with --speed-speakers, and build_id (state.build_id) once it is set.
std::vector<Attribute> dataset_attributes(const BuildState& state);

/// The writers of one split: one SplitWriter per target, each given every batch of the split.
class SplitOutputs {
 public:
  /// Creates <target.folder>/<split name>.h5.partial for each of `targets`, with `attributes` as root attributes.
  /// Throws IoError or InvalidArgument (SplitWriter).
  SplitOutputs(const BuildState& state, std::size_t split, const std::vector<WriteTarget>& targets,
               const std::vector<Attribute>& attributes);
  /// Appends `records.size()` clips to every target: `frames` holds their frames, clip after clip, [n_mels] elements
  /// of the build's dtype each (SplitWriter::append). Throws IoError.
  void append(const void* frames, const std::vector<FileRecord>& records);
  /// Finishes every target's file (metadata, close, rename to <split>.h5). Throws IoError.
  void finish();
  /// Adds the file, seconds, bytes and chunks of target t to totals[t], for every target.
  void add_to(std::vector<WriteTotals>& totals) const;

 private:
  std::vector<std::unique_ptr<SplitWriter>> writers_;
  std::vector<std::filesystem::path> paths_;
};

}  // namespace melforge::builder
