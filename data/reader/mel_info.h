#pragma once
/// The parameters of a melforge dataset split (the root attributes of docs/FORMAT.md) as a plain struct, with the
/// conversions the kernels and configs need. Torch-free (part of melforge_data).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "featurize/featurize.h"
#include "mel/mel_args.h"
#include "melforge/common/h5.h"
#include "segment/segment_args.h"

namespace melforge::data {

/// The newest dataset schema version this reader understands (docs/FORMAT.md, "Schema versioning"): 3, clips stored
/// whole (`frames`, `frame_offset`); 1 and 2 store the dense segment grid (`mel`).
inline constexpr int64_t kSupportedSchemaVersion = 3;
/// The first schema version that stores clips whole (no `mel`, no long/short segment grid).
inline constexpr int64_t kClipSchemaVersion = 3;
/// The oldest dataset schema version this reader still reads (version 1: no `targets` matrix).
inline constexpr int64_t kOldestSchemaVersion = 1;

/// Split names in order (0 train, 1 val, 2 test); split `s` is stored in `<dir>/<s>.h5`.
inline const std::vector<std::string> kSplitNames = {"train", "val", "test"};

/// The parameters that produced a split: the root attributes of docs/FORMAT.md, named as there. A schema-3 file has no
/// long/short segment grid: long_seconds, long_samples, num_long, num_short are 0 and short_files is "" for it, and
/// short_seconds, short_samples and n_frames describe its default tile (the model input).
struct MelInfo {
  /// Sample rate of the analysed audio, Hz.
  int64_t sample_rate = 0;
  /// FFT size, samples.
  int64_t n_fft = 0;
  /// Effective window length, samples.
  int64_t win_length = 0;
  /// Effective hop, samples.
  int64_t hop_length = 0;
  /// `hann` or `hamming`.
  std::string window;
  /// 1: frames centred (segment padded by n_fft/2 on both sides); 0: not.
  int64_t center = 0;
  /// `reflect` or `constant`.
  std::string pad_mode;
  /// Exponent of the magnitude spectrogram.
  double power = 0;
  /// Mel bands (M).
  int64_t n_mels = 0;
  /// Lowest filter edge, Hz.
  double f_min = 0;
  /// Effective highest filter edge, Hz.
  double f_max = 0;
  /// `htk` or `slaney`.
  std::string mel_scale;
  /// `none` or `slaney`.
  std::string mel_norm;
  /// `db`, `ln` or `none`.
  std::string log;
  /// Floor for `log db`.
  double amin = 0;
  /// Offset for `log ln`.
  double log_eps = 0;
  /// Stored element type of `mel` (schema 1/2) or `frames` (schema 3): `float16` or `float32`.
  std::string dtype;
  /// Long segment length, seconds (schema 1/2; 0 in schema 3).
  double long_seconds = 0;
  /// Short segment length, seconds (schema 3: the default tile).
  double short_seconds = 0;
  /// Long segment length, samples at sample_rate (schema 1/2; 0 in schema 3).
  int64_t long_samples = 0;
  /// Short segment length, samples at sample_rate (schema 3: the default tile).
  int64_t short_samples = 0;
  /// Long segments per file (L; schema 1/2, 0 in schema 3).
  int64_t num_long = 0;
  /// Short segments per long segment (S; schema 1/2, 0 in schema 3).
  int64_t num_short = 0;
  /// Frames per short segment (T; schema 3: frames of the default tile, the model input width).
  int64_t n_frames = 0;
  /// `pad` or `skip` (schema 1/2; "" in schema 3).
  std::string short_files;
  /// Cap on a stored clip's length the build used, seconds; 0 = none (schema 3's `max_seconds`; 0 when absent, as
  /// in every schema 1/2 file and in configs written before it existed).
  double max_seconds = 0;
  /// Input channel used, -1 for a mix to mono (-1 when the file has no `channel` attribute).
  int64_t channel = -1;
  /// Version of melforge that wrote the file (informational: not compared between splits).
  std::string melforge_version;
  /// Feature front-end, the `features` attribute: "mel" (torchaudio's MelSpectrogram; also when the attribute is
  /// absent, as in every file written before it existed) or "fbank" (Kaldi's filterbank; `fbank` holds it).
  std::string features = "mel";
  /// Kaldi filterbank parameters, the root attributes named as torchaudio.compliance.kaldi.fbank's keywords
  /// (num_mel_bins, frame_length, ..., subtract_mean, dither_seed); read only for features "fbank", defaults
  /// otherwise. n_fft, win_length, hop_length and n_mels then hold the values MelArgs::use_fbank derives.
  fbank::FbankArgs fbank;

  /// Whether the front-end is Kaldi's filterbank.
  bool is_fbank() const { return features == "fbank"; }

  /// Shape of one file's spectrograms in schema 1/2: [num_long, num_short, n_mels, n_frames] (zeros in schema 3).
  std::vector<int64_t> file_shape() const { return {num_long, num_short, n_mels, n_frames}; }
  /// The spectrogram parameters as the kernels take them (enums parsed; features "fbank": MelArgs::use_fbank with
  /// `fbank`). Throws FormatError on an unknown spelling, on fbank parameters FbankArgs::validate refuses, and when
  /// n_fft, win_length, hop_length or n_mels differ from what the fbank parameters give.
  mel::MelArgs mel_args() const;
  /// The segmentation parameters (num_long fixed to this dataset's). Throws FormatError on an unknown spelling (also
  /// for a schema-3 MelInfo, whose short_files is "": it has no segment grid).
  segment::SegmentArgs segment_args() const;
  /// Everything the featurizer needs to compute a file's features as this dataset stores them (melforge-train
  /// predict and melforge.predict). Throws FormatError on an unknown spelling.
  featurize::DatasetParams dataset_params() const;
  /// Every parameter above as a JSON object keyed by attribute name (for configs and checkpoints).
  nlohmann::json to_json() const;
  /// The inverse of to_json(). Throws FormatError naming the first missing or mistyped field; max_seconds may be
  /// missing (configs written before schema 3), then 0; features may be missing (configs written before it
  /// existed), then "mel"; with features "fbank" every fbank field is required and bounded as read_mel_info does.
  static MelInfo from_json(const nlohmann::json& j);
  /// "NAME is A in THIS but B in OTHER" for the first parameter that differs from `other` (melforge_version
  /// excluded; `features` first, then the parameters above, then the fbank parameters), with `this_name` and
  /// `other_name` naming the two sides; empty when every parameter is equal.
  std::string first_difference(const MelInfo& other, const std::string& this_name,
                               const std::string& other_name) const;

 private:
  /// MelArgs::use_fbank(fbank) on `a`, then n_fft, win_length, hop_length and n_mels checked against it. Throws
  /// FormatError naming the attribute.
  void use_fbank_checked(mel::MelArgs& a) const;
};

/// Reads and validates the parameter attributes of an open split file of its `schema_version` (1 when the attribute
/// is missing): every attribute of MelInfo present and well formed (channel and max_seconds optional; in schema 3
/// long_seconds, long_samples, num_long, num_short and short_files optional, 0 or "" when absent), sample_rate,
/// n_mels, n_frames, short_samples > 0 (schema 1/2 also num_long, num_short), max_seconds >= 0 and finite, the
/// spellings understood. `features` is optional ("mel" when absent); with "fbank" every fbank attribute is required,
/// integers within int range, booleans 0 or 1, reals finite, dither_seed >= 0, and FbankArgs::validate passes
/// before anything is sized from them. `where` (the file's path) starts every message, the attribute follows.
/// Throws FormatError.
MelInfo read_mel_info(const h5::File& file, const std::string& where);

/// The fbank parameters as root attributes and JSON fields: (torchaudio's name, value) in the order of
/// docs/FORMAT.md; integers and booleans (0/1) as int64, reals as double, window_type as its string.
std::vector<std::pair<std::string, h5::AttributeValue>> fbank_attributes(const fbank::FbankArgs& f);

}  // namespace melforge::data
