#pragma once
/// `melforge-train embed`: the per-file speaker embeddings of a `--task verification` checkpoint, for a split of a
/// dataset folder (embed_split: whole clips) or for raw audio files (each decoded whole, its frames computed as
/// melforge-build stores a schema-3 clip, one forward pass over the whole utterance), written as an HDF5 file that
/// h5py reads.
///
/// The file (written to `<out>.partial` and renamed into place when complete):
/// - `embedding`: float32 [N, E], each row the L2-normalised embedding of the whole file (pooled over its real
///   frames; with --embed-crops N the mean of N evenly spaced crops of the checkpoint's --crop-seconds; a
///   schema-1/2 dataset split: the mean over its stored short segments);
/// - `path`: UTF-8 strings [N], the dataset's `path` of each file (raw audio: the path as found);
/// - `label`: int32 [N], the class index in `class_names` (raw audio: -1), and `class_names`: UTF-8 strings;
/// - `skipped_path`, `skipped_reason`: UTF-8 strings, the raw audio inputs that could not be embedded and why;
/// - attributes `checkpoint`, `model`, `embedding_dim`, `source` (`dataset` or `audio`), `split` (dataset only),
///   `data` (dataset only), `epoch`, `embed_crops` (0: whole files).
#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace boost::program_options {
class options_description;
}

namespace melforge::trainer {

/// `embed` settings.
struct EmbedOptions {
  /// A `--task verification` checkpoint.
  std::filesystem::path checkpoint;
  /// A dataset folder (with --split), or empty when raw audio inputs are given.
  std::filesystem::path data;
  /// The split of `data` to embed: train, val or test.
  std::string split = "test";
  /// Audio files, or folders searched recursively (positional; instead of --data).
  std::vector<std::filesystem::path> inputs;
  /// The HDF5 file to write.
  std::filesystem::path out;
  /// Tiles per forward pass of a schema-1/2 split (a schema-3 split's whole clips are batched by length).
  int64_t batch_size = 1024;
  /// CPU threads for decoding and spectrograms of raw audio (0: all cores).
  int threads = 0;
  /// cpu, cuda or auto.
  std::string device = "auto";
  /// Read entries of input folders whose name starts with '.'.
  bool include_hidden = false;
  /// Embed each file as the mean of this many evenly spaced crops of the checkpoint's --crop-seconds
  /// (VerifyOptions::embed_crops); 0: the whole file.
  int64_t embed_crops = 0;
  /// Stop at the first raw audio input that cannot be embedded (AudioError naming it) instead of listing it as
  /// skipped.
  bool strict = false;

  /// Throws InvalidArgument naming the flag: no checkpoint or --out, both or neither of --data and inputs, a bad
  /// split, batch size, threads or device.
  void validate() const;
};

/// Registers --checkpoint --data --split --out --eval-batch-size --threads --device --embed-crops --include-hidden
/// --strict and the positional inputs.
void add_options(boost::program_options::options_description& desc, EmbedOptions& opts);
/// The positional-argument name of the inputs.
inline constexpr const char* kEmbedInputsName = "input";

/// What run_embed did.
struct EmbedSummary {
  /// Files embedded (rows of `embedding`).
  int64_t embedded = 0;
  /// Raw audio inputs that could not be embedded.
  int64_t skipped = 0;
};

/// Runs embed as the file comment says and says what it wrote on `out`. Throws FormatError when the checkpoint is
/// not a verification checkpoint or does not fit the dataset's mel parameters, AudioError when no raw audio input
/// could be embedded (or, with strict, at the first that cannot), IoError when the file cannot be written.
EmbedSummary run_embed(const EmbedOptions& opts, std::ostream& out, std::ostream& log);

}  // namespace melforge::trainer
