#pragma once
/// Options of melforge-build, registered once so that every binary spells a flag the same way.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "audio/decode.h"
#include "augment/augment.h"
#include "mel/mel_args.h"
#include "mel/mel_engine.h"
#include "split.h"

namespace boost::program_options {
class options_description;
}

namespace melforge::builder {

/// Names of the three splits, in the order they are processed and indexed (0 train, 1 val, 2 test).
inline const std::vector<std::string> kSplitNames = {"train", "val", "test"};

/// Name of the lock file a running build holds (flock, exclusive) in its output folder, and removes when it ends.
inline constexpr const char* kLockFileName = ".melforge-build.lock";
/// Name of the staging folder inside the output folder where a build writes its HDF5 files before moving them.
inline constexpr const char* kStagingName = ".partial";

/// Which part of the corpus a sharded build processes: shard `index` of `count`, 1-based as in `--shard K/N`
/// (coreutils `split -n K/N` counts the same way). count 0: not sharded, the whole corpus.
struct ShardSpec {
  /// 1..count; 0 when not sharded.
  int index = 0;
  /// Number of shards; 0 when not sharded.
  int count = 0;
  /// True for a `--shard K/N` build (also `1/1`).
  bool sharded() const { return count > 0; }
  /// "K/N", or "" when not sharded.
  std::string text() const;
};

/// Parses `--shard K/N`: integers with 1 <= K <= N <= 100000; "" gives an unsharded spec. Throws InvalidArgument
/// naming the flag and the value otherwise ("0/3", "4/3", "x", "1/0").
ShardSpec parse_shard(const std::string& text);

/// The half-open range [first, last) of the items 0..n-1 that shard `spec` owns: contiguous, in order, the shards'
/// ranges cover 0..n-1 once, sizes differ by at most one ([0, n) when not sharded). The builder applies it to the
/// scanned audio files (sorted by path) and, separately, to the entries the scan skipped.
std::pair<int64_t, int64_t> shard_range(int64_t n, const ShardSpec& spec);

/// How clips are stored (schema 3, docs/FORMAT.md): every clip whole, or cut at --max-seconds when asked; and the
/// default tile (the model input) readers cut clips into, stored as the short_seconds, short_samples and n_frames
/// attributes.
struct ClipOptions {
  /// --short-seconds: the default tile, seconds (> 0; it must hold one STFT frame at the build's parameters).
  double short_seconds = 0.25;
  /// --max-seconds: longest clip stored, seconds; a longer clip keeps its first max_seconds (clip_flags bit 1).
  /// 0: no cap (the default).
  double max_seconds = 0;

  /// The default tile in samples at `sample_rate`: llround(short_seconds * sample_rate).
  int64_t short_samples(int sample_rate) const;
  /// The cap in samples at `sample_rate`: llround(max_seconds * sample_rate), at least 1; 0 without a cap.
  int64_t max_samples(int sample_rate) const;
  /// Frames of the default tile: llround(short_seconds * sample_rate / hop_length) (data::views::FrameRate::frames).
  int64_t tile_frames(int sample_rate, int hop_length) const;
  /// Throws InvalidArgument naming the flag: short_seconds not > 0 or shorter than one sample or one hop at
  /// `sample_rate` / `hop_length`, max_seconds negative, not finite or shorter than one sample.
  void validate(int sample_rate, int hop_length) const;
};

/// Registers --short-seconds and --max-seconds, and refuses the flags of the segment layout that schema 3 removed
/// (--num-long, --long-seconds, --short-files: InvalidArgument saying that clips are stored whole and naming
/// --max-seconds, whatever their value).
void add_options(boost::program_options::options_description& desc, ClipOptions& opts);

/// Output and running options of the build (the mel, clip and decode options are separate structs).
struct BuildOptions {
  /// Corpus root: `root/<class>/**/<file>` or `root/{train,val,test}/<class>/**/<file>`. Exclusive with `manifest`.
  std::filesystem::path input;
  /// CSV manifest with `path,label[,split]` (paths relative to the manifest's folder or absolute).
  std::filesystem::path manifest;
  /// Output folder for train.h5, val.h5, test.h5 and build_report.json.
  std::filesystem::path output;
  /// Split ratios "train,val,test" (or "train,val"); each >= 0, summing to 1.
  std::string split = "0.8,0.1,0.1";
  /// Seed of the split assignment.
  uint64_t seed = 42;
  /// What the split ratios divide: each class's files (file) or whole classes (class; open-set). See assign_splits.
  SplitBy split_by = SplitBy::file;
  /// Mel engine.
  mel::Device device = mel::Device::auto_select;
  /// Worker threads for decode, CPU mel and compression (0: all cores).
  int threads = 0;
  /// Memory budget for the audio arena and output buffers, e.g. "4G", "512M", "auto" (half of physical RAM).
  std::string max_ram = "auto";
  /// Any skipped file stops the build with a non-zero exit naming it.
  bool strict = false;
  /// Replace existing outputs in `output`.
  bool overwrite = false;
  /// No progress output (the final table is still printed).
  bool quiet = false;
  /// Stored element type of the spectrograms.
  mel::DType dtype = mel::DType::float16;
  /// Deflate level 0 (none) to 9.
  int compression_level = 4;
  /// HDF5 shuffle filter before deflate.
  bool shuffle = true;
  /// Frames per HDF5 chunk of `frames` (0: about 1 MiB uncompressed).
  int64_t frames_per_chunk = 0;
  /// Comma-separated file extensions treated as audio when scanning a folder (case-insensitive).
  std::string extensions = "wav,flac,ogg,oga,aif,aiff,aifc,au,snd,caf,w64,rf64,mp3,opus";
  /// Scan --input entries whose name starts with '.' (.DS_Store, ._x.wav, .git/); by default they are left unread
  /// and counted in the report as hidden.
  bool include_hidden = false;
  /// CUDA engine: segments of the default tile per device launch (device_batch * tile frames rows per cuFFT batch).
  int64_t device_batch = 4096;
  /// `K/N`: process only shard K of N (1-based) of the corpus into `output`; "" builds the whole corpus.
  std::string shard;
  /// --layout NAME: read `input` as that public dataset's own tree (builder/layouts/layout.h); "" for none.
  std::string layout;
  /// --columns `path=COL,label=COL[,split=COL][,fold=COL][,group=COL]` of the manifest's header (parse_columns);
  /// "" for none.
  std::string columns;
  /// --label-sep C: the separator of several labels in a manifest label field; "" for the default ';'.
  std::string label_sep;
  /// --audio-root DIR: folder a manifest's relative paths are resolved against (default: the manifest's folder).
  std::filesystem::path audio_root;
  /// --classes FILE: class order, one name a line or a vocabulary CSV (read_class_list); empty: sorted labels.
  std::filesystem::path classes;
  /// --group-by column|REGEX: a manifest header column, or a regular expression searched in each stored path (its
  /// first capture group, else the whole match, is the group); "" for none.
  std::string group_by;
  /// --folds K (2..100): assign folds 1..K, grouped and stratified, to the files that have none; 0: none.
  int folds = 0;
  /// True when --split was given (not defaulted): with folds, --split is not used and a warning says so.
  bool split_given = false;
  /// --speed-speakers LIST: speed factors (e.g. "0.9,1.1"); every train file gets one more utterance per factor,
  /// decoded at that speed, whose class is the new speaker `<class>_sp<factor>` (speed_speaker_factors); "" for none.
  std::string speed_speakers;
  /// --test-trials FILE: a VoxCeleb-style trial list (`<1|0> <enroll> <test>` a line) whose speakers (the classes of
  /// its paths) make the test split, with --split-by class; copied to OUT/trials.txt. Empty: none.
  std::filesystem::path test_trials;

  /// Parsed `split`: three ratios (a missing test ratio is 0). Throws InvalidArgument.
  std::vector<double> split_ratios() const;
  /// Parsed `max_ram` in bytes. Throws InvalidArgument.
  int64_t max_ram_bytes() const;
  /// Parsed `shard`. Throws InvalidArgument.
  ShardSpec shard_spec() const { return parse_shard(shard); }
  /// Parsed `extensions`, lower case, without dots.
  std::vector<std::string> extension_list() const;
  /// Parsed `speed_speakers`: the factors in the order given (empty when not given). Each in the range --speed
  /// accepts ([0.5, 2]) and not 1, no two alike as %g prints them, at most kMaxSpeedSpeakers. Throws
  /// InvalidArgument naming --speed-speakers.
  std::vector<double> speed_speaker_factors() const;
  /// The label separator: label_sep's character, ';' when not given.
  char label_separator() const { return label_sep.empty() ? ';' : label_sep[0]; }
  /// Checks every field and the folders (input exists; output absent, empty or --overwrite, where the lock file
  /// and staging folder a killed build leaves behind do not count as content), and the protocol flags: --layout
  /// (a known name, with --input, not with --manifest, --columns, --label-sep or --audio-root), --columns,
  /// --label-sep and --audio-root (with --manifest), --classes (a regular file), --folds (0 or 2..100), --group-by
  /// (not with --columns group=; a regular expression that compiles, unless a manifest header may name it),
  /// --speed-speakers (speed_speaker_factors) and --test-trials (a regular file, with --split-by class, not with
  /// --layout or --folds, a train or val ratio > 0). Throws InvalidArgument.
  void validate() const;
};

/// Most factors --speed-speakers takes (each adds as many speakers as the corpus has training classes).
inline constexpr std::size_t kMaxSpeedSpeakers = 8;

/// A speed factor as class names and messages print it: %g ("0.9", "1.1").
std::string speed_text(double factor);

/// Registers --input --manifest --output --split --seed --split-by --device --threads --max-ram --strict --overwrite
/// --quiet --dtype --compression-level --shuffle --frames-per-chunk --extensions --include-hidden --device-batch
/// --shard --layout --columns --label-sep --audio-root --classes --group-by --folds --speed-speakers --test-trials.
void add_options(boost::program_options::options_description& desc, BuildOptions& opts);

/// A deliberate error in the device side of the engine check (EngineCheckOptions::fault), for tests: no flag sets
/// it. With it a machine without a GPU runs the check as a CUDA build does, the CPU engine and the CPU augmenter
/// acting as the device, and the offsets make the device's result wrong on purpose, so that the tests see the check
/// fail.
struct EngineCheckFault {
  /// mel::Device::cpu (the default): off. auto or cuda: a --device cpu build runs the engine check with its CPU
  /// engine (and CPU augmenter) in the device's place, and treats a mismatch as `--device <cpu_acts_as>` does
  /// (cuda: EngineCheckError; auto: the fallback to the CPU twin).
  mel::Device cpu_acts_as = mel::Device::cpu;
  /// Added to one element of the device's spectrograms of the first batch compared (0: none).
  float mel_offset = 0;
  /// Which element: flat index into that batch's spectrograms [rows][L][S][n_mels][n_frames], modulo their count.
  int64_t mel_element = 0;
  /// Added to one sample of the device's waveform of the first augmented row compared (0: none).
  float augment_offset = 0;
  /// Which sample of that row's arena slice, modulo the slice's length.
  int64_t augment_sample = 0;
};

/// Options of the engine check (builder/engine_check.h): a build with the CUDA engine computes its first batch, and
/// its first augmented batch, with the CPU engine too and compares them.
struct EngineCheckOptions {
  /// --no-engine-check: skip the comparison (the report records it as skipped).
  bool skip = false;
  /// Test hook; see EngineCheckFault.
  EngineCheckFault fault;
  /// Checks the hook against the build's `device`: cpu_acts_as only with --device cpu, offsets finite, indices
  /// >= 0. Throws InvalidArgument.
  void validate(mel::Device device) const;
};

/// Registers --no-engine-check.
void add_options(boost::program_options::options_description& desc, EngineCheckOptions& opts);

/// Everything melforge-build is configured with.
struct BuildConfig {
  /// Output and running options.
  BuildOptions build;
  /// Spectrogram parameters.
  mel::MelArgs mel;
  /// How clips are stored and the default tile.
  ClipOptions clips;
  /// Decoding (channel choice; the sample rate is mel.sample_rate).
  audio::DecodeOptions decode;
  /// Waveform augmentation (--augment-copies and its flags; off by default).
  augment::AugmentArgs augment;
  /// The engine check of a CUDA build (--no-engine-check).
  EngineCheckOptions engine_check;
  /// Validates every part, in the order a user would fix them, then the combinations (--log none with
  /// --dtype float16 is refused: linear power above 65504 would be stored as +Inf). With --layout and
  /// --augment-copies but no --noise, the augmentation is checked as if the layout offered a noise bank (the build
  /// checks it again after the scan). Throws InvalidArgument.
  void validate() const;
};

/// Registers the front-end flags: --features mel|fbank (bound to mel.features) and the Kaldi filterbank's flags
/// (fbank::add_options, bound to mel.fbank; dashed or torchaudio's underscore spellings).
void add_front_end_options(boost::program_options::options_description& desc, mel::MelArgs& mel);

/// After parsing, with `given_flags` the flags given on the command line or in the --config file (canonical names,
/// without dashes): refuses a mel-only flag with --features fbank ("--n-mels does not apply to --features fbank: use
/// --num-mel-bins") and an fbank flag without --features fbank, naming both flags; then, for fbank, derives the FFT
/// geometry from the fbank flags (MelArgs::use_fbank, which validates them at --sample-rate). Throws InvalidArgument,
/// before any work.
void apply_front_end(mel::MelArgs& mel, const std::vector<std::string>& given_flags);

/// Parses a byte size such as "1024", "512K", "64M", "4G", "1.5G" (binary units). Throws InvalidArgument.
int64_t parse_byte_size(const std::string& text, const std::string& flag);

}  // namespace melforge::builder
