#include "reader/split_info.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>
#include <utility>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::data {

namespace {

/// Most class names a split may list; checked before they are read, so that a hostile length cannot make the reader
/// allocate without bound.
constexpr int64_t kMaxClasses = int64_t{1} << 20;

/// Root attribute naming the build a split file comes from (melforge-build's kBuildIdAttribute).
constexpr const char* kBuildIdName = "build_id";

/// Times read_split_info reads a split again when its folder holds splits of different builds (an install of
/// `--overwrite` in progress) before it refuses the mix.
constexpr int kBuildIdRetries = 2;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Reads and checks the `targets` matrix of `file` into `s` (labels already read): shape [files, classes], values
/// 0 or 1, a 1 at each file's label. Throws FormatError naming `where`, the row and the file.
void read_targets(const h5::File& file, const std::string& where, SplitInfo& s) {
  const auto classes = static_cast<int64_t>(s.class_names.size());
  const auto d = h5::dims(h5::open_dataset(file, "targets"));
  if (d.size() != 2 || d[0] != s.files() || d[1] != classes)
    throw FormatError(where + ": targets has shape " + shape_text(d) + ", expected [" + std::to_string(s.files()) +
                      ", " + std::to_string(classes) + "] [files, classes]");
  const double bytes = static_cast<double>(s.files()) * static_cast<double>(classes);
  if (const int64_t available = available_memory_bytes(); available >= 0 && bytes > static_cast<double>(available))
    throw FormatError(where + ": targets [" + std::to_string(s.files()) + ", " + std::to_string(classes) +
                      "] needs " + std::to_string(static_cast<int64_t>(bytes) >> 20) + " MiB, more than the " +
                      std::to_string(available >> 20) + " MiB of memory available");
  std::vector<int64_t> dims;
  s.targets = h5::read_uint8_matrix(file, "targets", dims);
  s.has_targets_dataset = true;
  for (int64_t f = 0; f < s.files(); ++f) {
    const uint8_t* row = s.targets.data() + f * classes;
    for (int64_t c = 0; c < classes; ++c)
      if (row[c] > 1)
        throw FormatError(where + ": targets[" + std::to_string(f) + ", " + std::to_string(c) + "] = " +
                          std::to_string(row[c]) + " is not 0 or 1 (file " + utf8::for_terminal(s.paths[f]) + ")");
    if (row[s.labels[f]] != 1)
      throw FormatError(where + ": targets row " + std::to_string(f) + " lacks the file's label " +
                        std::to_string(s.labels[f]) + " (file " + utf8::for_terminal(s.paths[f]) + ")");
  }
}

}  // namespace

std::vector<int64_t> SplitInfo::segment_offsets() const {
  std::vector<int64_t> offsets(num_valid_long.size() + 1, 0);
  for (std::size_t f = 0; f < num_valid_long.size(); ++f)
    offsets[f + 1] = offsets[f] + num_valid_long[f] * info.num_short;
  return offsets;
}

int64_t SplitInfo::clip_frames(int64_t f) const {
  if (f < 0 || f >= files())
    throw InvalidArgument(path.string() + ": clip " + std::to_string(f) + " is outside [0, " +
                          std::to_string(files()) + ")");
  return frame_offset[static_cast<std::size_t>(f) + 1] - frame_offset[static_cast<std::size_t>(f)];
}

std::vector<int64_t> SplitInfo::clip_frame_counts() const {
  std::vector<int64_t> counts(static_cast<std::size_t>(files()));
  for (std::size_t f = 0; f < counts.size(); ++f) counts[f] = frame_offset[f + 1] - frame_offset[f];
  return counts;
}

std::vector<int64_t> SplitInfo::group_offsets() const {
  if (!aug_copy.empty() && aug_copy.size() != paths.size())
    throw InvalidArgument(path.string() + ": aug_copy has " + std::to_string(aug_copy.size()) + " entries for " +
                          std::to_string(files()) + " files");
  std::vector<int64_t> offsets;
  offsets.reserve(paths.size() + 1);
  for (int64_t f = 0; f < files(); ++f)
    if (f == 0 || aug_copy.empty() || aug_copy[static_cast<std::size_t>(f)] == 0) offsets.push_back(f);
  offsets.push_back(files());
  return offsets;
}

int64_t SplitInfo::valid_segments() const {
  int64_t n = 0;
  for (const int64_t v : num_valid_long) n += v;
  return n * info.num_short;
}

SegmentRef segment_at(const std::vector<int64_t>& offsets, int64_t num_short, int64_t position) {
  if (offsets.empty() || position < 0 || position >= offsets.back())
    throw InvalidArgument("segment " + std::to_string(position) + " is outside [0, " +
                          std::to_string(offsets.empty() ? 0 : offsets.back()) + ")");
  const auto it = std::upper_bound(offsets.begin(), offsets.end(), position);
  const auto file = static_cast<int64_t>(it - offsets.begin()) - 1;
  const int64_t within = position - offsets[static_cast<std::size_t>(file)];
  return {file, within / num_short, within % num_short};
}

void SplitInfo::check_finite(int64_t first, int64_t count, const float* data) const {
  data::check_finite(path, name, info, paths, first, count, data);
}

void SplitInfo::check_finite_segment(const SegmentRef& ref, const float* data) const {
  if (first_non_finite(data, info.n_mels * info.n_frames) < 0) return;
  throw FormatError(path.string() + ": split '" + name + "', row " + std::to_string(ref.file) + " (file " +
                    utf8::for_terminal(paths[static_cast<std::size_t>(ref.file)]) +
                    "): the spectrogram holds NaN or an infinite value (long segment " + std::to_string(ref.long_index) + ", short segment " +
                    std::to_string(ref.short_index) + "); rebuild the dataset, or remove the file");
}

int64_t first_non_finite(const float* data, int64_t n) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= !(data[i] - data[i] == 0.0f);
  if (!bad) return -1;
  int64_t i = 0;
  while (data[i] - data[i] == 0.0f) ++i;
  return i;
}

void check_finite(const fs::path& path, const std::string& name, const MelInfo& info,
                  const std::vector<std::string>& paths, int64_t first, int64_t count, const float* data) {
  int64_t per_file = 1;
  for (const int64_t d : info.file_shape()) per_file *= d;
  const int64_t i = first_non_finite(data, count * per_file);
  if (i < 0) return;
  const int64_t row = first + i / per_file, segment = i % per_file / (info.n_mels * info.n_frames);
  throw FormatError(path.string() + ": split '" + name + "', row " + std::to_string(row) + " (file " +
                    utf8::for_terminal(paths[static_cast<std::size_t>(row)]) + "): the spectrogram holds " +
                    (std::isnan(data[i]) ? "NaN" : "an infinite value") + " (long segment " +
                    std::to_string(segment / info.num_short) + ", short segment " +
                    std::to_string(segment % info.num_short) + "); rebuild the dataset, or remove the file");
}

namespace {

/// Bytes of per-file metadata a split holds at least (labels, paths, clip table): the bound of the memory check.
constexpr int64_t kMetadataBytesPerFile = 64;

/// Throws FormatError naming `where` and `name` unless dataset `name` of `file` is 1-D of `length` entries.
void check_length(const h5::File& file, const std::string& where, const char* name, int64_t length,
                  const std::string& whose) {
  const auto d = h5::dims(h5::open_dataset(file, name));
  if (d.size() != 1 || d[0] != length)
    throw FormatError(where + ": " + name + " has shape " + shape_text(d) + " but " + whose + " [" +
                      std::to_string(length) + "]");
}

/// Throws FormatError unless dataset `name` of `file` stores integers.
void check_integer(const h5::File& file, const std::string& where, const char* name) {
  if (H5Tget_class(h5::dataset_type(h5::open_dataset(file, name)).id()) != H5T_INTEGER)
    throw FormatError(where + ": " + name + " is not an integer dataset");
}

/// The whole 1-D integer dataset `name` (length already checked) as int64.
std::vector<int64_t> read_int64(const h5::File& file, const std::string& where, const char* name, int64_t length) {
  check_integer(file, where, name);
  std::vector<int64_t> v(static_cast<std::size_t>(length));
  if (length > 0) h5::read_rows(h5::open_dataset(file, name), 0, length, H5T_NATIVE_INT64, v.data());
  return v;
}

/// Throws FormatError when `files` rows of per-file metadata would not fit in MemAvailable; `what` names the
/// datasets that claim them.
void check_metadata_fits(const std::string& where, const std::string& what, int64_t files) {
  if (const int64_t available = available_memory_bytes(); available >= 0 && files > available / kMetadataBytesPerFile)
    throw FormatError(where + ": " + what + " claim " + std::to_string(files) +
                      " files, whose per-file metadata alone needs at least " +
                      std::to_string(files / (int64_t{1} << 20) * kMetadataBytesPerFile) + " MiB, more than the " +
                      std::to_string(available >> 20) + " MiB of memory available");
}

/// Schema 1/2: checks the shape of `mel` and `num_valid_long`; returns F.
int64_t grid_files(const h5::File& file, const std::string& where, const SplitInfo& s) {
  auto mel = h5::open_dataset(file, "mel");
  h5::check_virtual_sources(mel);
  const auto dims = h5::dims(mel);
  std::vector<int64_t> expect = s.info.file_shape();
  if (dims.size() != 5 || !std::equal(expect.begin(), expect.end(), dims.begin() + 1)) {
    expect.insert(expect.begin(), dims.empty() ? 0 : dims[0]);
    throw FormatError(where + ": mel has shape " + shape_text(dims) + ", but the attributes say " +
                      shape_text(expect) + " [files, num_long, num_short, n_mels, n_frames]");
  }
  check_length(file, where, "num_valid_long", dims[0], "mel has files");
  return dims[0];
}

/// Schema 1/2: reads num_valid_long and fills the clip table (valid segments side by side).
void read_grid_clips(const h5::File& file, const std::string& where, SplitInfo& s) {
  const auto valid = h5::read_int32(file, "num_valid_long");
  if (static_cast<int64_t>(valid.size()) != s.files())
    throw FormatError(where + ": num_valid_long has " + std::to_string(valid.size()) + " entries but mel has " +
                      std::to_string(s.files()) + " files");
  const int64_t per_long = s.info.num_short * s.info.n_frames;
  s.frame_offset.assign(1, 0);
  for (int64_t f = 0; f < s.files(); ++f) {
    const int32_t v = valid[static_cast<std::size_t>(f)];
    if (v < 1 || v > s.info.num_long)
      throw FormatError(where + ": num_valid_long[" + std::to_string(f) + "] = " + std::to_string(v) +
                        " is outside [1, num_long = " + std::to_string(s.info.num_long) + "] (file " +
                        utf8::for_terminal(s.paths[static_cast<std::size_t>(f)]) + ")");
    if (s.info.long_samples > std::numeric_limits<int64_t>::max() / v)
      throw FormatError(where + ": attribute long_samples = " + std::to_string(s.info.long_samples) + " times " +
                        "num_valid_long[" + std::to_string(f) + "] = " + std::to_string(v) + " overflows");
    s.num_valid_long.push_back(v);
    s.frame_offset.push_back(s.frame_offset.back() + v * per_long);
    s.num_samples.push_back(v * s.info.long_samples);
  }
  s.clip_flags.assign(static_cast<std::size_t>(s.files()), 0);
}

/// Schema 3: checks `frames` ([N, n_mels], float16 or float32) and the lengths of `frame_offset`, `num_samples` and
/// `clip_flags`; returns F, checked <= N (every clip holds a frame) before anything sized by it is read.
int64_t clip_files(const h5::File& file, const std::string& where, const SplitInfo& s) {
  auto frames = h5::open_dataset(file, "frames");
  h5::check_virtual_sources(frames);
  const auto dims = h5::dims(frames);
  if (dims.size() != 2 || dims[1] != s.info.n_mels)
    throw FormatError(where + ": frames has shape " + shape_text(dims) + ", expected [frames, n_mels = " +
                      std::to_string(s.info.n_mels) + "]");
  const h5::Datatype type = h5::dataset_type(frames);
  const std::size_t size = H5Tget_size(type.id());
  if (H5Tget_class(type.id()) != H5T_FLOAT || (size != 2 && size != 4))
    throw FormatError(where + ": frames is not a float16 or float32 dataset");
  const auto offset_dims = h5::dims(h5::open_dataset(file, "frame_offset"));
  if (offset_dims.size() != 1 || offset_dims[0] < 1)
    throw FormatError(where + ": frame_offset has shape " + shape_text(offset_dims) + ", expected [clips + 1]");
  const int64_t files = offset_dims[0] - 1;
  if (files > dims[0])
    throw FormatError(where + ": frame_offset has shape " + shape_text(offset_dims) + " for " +
                      std::to_string(files) + " clips, more than the " + std::to_string(dims[0]) +
                      " rows of frames (every clip holds at least one frame)");
  check_length(file, where, "num_samples", files, "frame_offset says clips");
  check_length(file, where, "clip_flags", files, "frame_offset says clips");
  return files;
}

/// Schema 3: reads and checks frame_offset, num_samples and clip_flags (lengths already checked).
void read_clip_table(const h5::File& file, const std::string& where, SplitInfo& s) {
  const int64_t files = s.files(), total = h5::dims(h5::open_dataset(file, "frames"))[0];
  s.frame_offset = read_int64(file, where, "frame_offset", files + 1);
  for (int64_t f = 0; f <= files; ++f) {
    const int64_t o = s.frame_offset[static_cast<std::size_t>(f)];
    const int64_t before = f == 0 ? -1 : s.frame_offset[static_cast<std::size_t>(f) - 1];
    if ((f == 0 && o != 0) || (f > 0 && o <= before))
      throw FormatError(where + ": frame_offset[" + std::to_string(f) + "] = " + std::to_string(o) +
                        (f == 0 ? " must be 0" : " is not above frame_offset[" + std::to_string(f - 1) + "] = " +
                                                     std::to_string(before) + " (every clip holds a frame)"));
  }
  if (s.frame_offset.back() != total)
    throw FormatError(where + ": frame_offset[" + std::to_string(files) + "] = " +
                      std::to_string(s.frame_offset.back()) + " is not the " + std::to_string(total) +
                      " rows of frames");
  s.num_samples = read_int64(file, where, "num_samples", files);
  const auto flags = read_int64(file, where, "clip_flags", files);
  for (int64_t f = 0; f < files; ++f) {
    const auto i = static_cast<std::size_t>(f);
    if (s.num_samples[i] < 1)
      throw FormatError(where + ": num_samples[" + std::to_string(f) + "] = " + std::to_string(s.num_samples[i]) +
                        " must be >= 1 (file " + utf8::for_terminal(s.paths[i]) + ")");
    if (flags[i] < 0 || (flags[i] & ~int64_t{kClipFlagsKnown}) != 0)
      throw FormatError(where + ": clip_flags[" + std::to_string(f) + "] = " + std::to_string(flags[i]) +
                        " holds bits other than 1 (padded) and 2 (capped) (file " + utf8::for_terminal(s.paths[i]) +
                        ")");
    s.clip_flags.push_back(static_cast<uint8_t>(flags[i]));
  }
}

/// Reads the optional cross-validation fields into `s` (paths already read): the root attribute `folds` (K) with
/// the `fold` dataset [F] in [1, K], and the `group` dataset [F]. Throws FormatError naming `where` and the field.
void read_folds_and_groups(const h5::File& file, const std::string& where, const std::string& whose, SplitInfo& s) {
  const bool attribute = h5::has_attribute(file, "folds"), dataset = h5::exists(file, "fold");
  if (dataset && !attribute)
    throw FormatError(where + ": holds a fold dataset but no root attribute folds (the number of folds)");
  if (attribute && !dataset && s.files() > 0)
    throw FormatError(where + ": has the root attribute folds but no fold dataset for its " +
                      std::to_string(s.files()) + " files");
  if (attribute) {
    s.num_folds = h5::read_attribute_int64(file, "folds");
    if (s.num_folds < kMinFolds || s.num_folds > kMaxFolds)
      throw FormatError(where + ": attribute folds = " + std::to_string(s.num_folds) + " is outside [" +
                        std::to_string(kMinFolds) + ", " + std::to_string(kMaxFolds) + "]");
  }
  if (dataset) {
    check_length(file, where, "fold", s.files(), whose);
    const auto folds = read_int64(file, where, "fold", s.files());
    for (std::size_t f = 0; f < folds.size(); ++f) {
      if (folds[f] < 1 || folds[f] > s.num_folds)
        throw FormatError(where + ": fold[" + std::to_string(f) + "] = " + std::to_string(folds[f]) +
                          " is outside [1, folds = " + std::to_string(s.num_folds) + "] (file " +
                          utf8::for_terminal(s.paths[f]) + ")");
      s.folds.push_back(static_cast<int32_t>(folds[f]));
    }
  }
  if (h5::exists(file, "group")) {
    check_length(file, where, "group", s.files(), whose);
    s.groups = h5::read_strings(file, "group");
    if (s.groups.size() != s.paths.size())
      throw FormatError(where + ": group has " + std::to_string(s.groups.size()) + " entries but the split has " +
                        std::to_string(s.files()) + " files");
  }
}

/// Reads the optional `aug_copy` dataset into `s` (paths already read): [F], each in [0, kMaxAugCopy], row 0 clean,
/// an augmented row above the augmented row before it, and on the path of its group's clean row. Throws FormatError
/// naming `where`, the field, the row and the file.
void read_aug_copy(const h5::File& file, const std::string& where, const std::string& whose, SplitInfo& s) {
  if (!h5::exists(file, "aug_copy")) return;
  check_length(file, where, "aug_copy", s.files(), whose);
  const auto copies = read_int64(file, where, "aug_copy", s.files());
  std::size_t clean = 0;
  for (std::size_t f = 0; f < copies.size(); ++f) {
    const int64_t k = copies[f];
    const auto bad = [&](const std::string& why) {
      return FormatError(where + ": aug_copy[" + std::to_string(f) + "] = " + std::to_string(k) + " " + why +
                         " (file " + utf8::for_terminal(s.paths[f]) + ")");
    };
    if (k < 0 || k > kMaxAugCopy)
      throw bad("is outside [0, " + std::to_string(kMaxAugCopy) + "] (0: the clean copy, k: augmented copy k)");
    if (k == 0) {
      clean = f;
    } else if (f == 0) {
      throw bad("is an augmented copy in the first row: a group of copies starts with its clean row (aug_copy 0)");
    } else if (copies[f - 1] >= k) {
      throw bad("does not follow aug_copy[" + std::to_string(f - 1) + "] = " + std::to_string(copies[f - 1]) +
                ": a clean row's copies follow it in increasing order");
    } else if (s.paths[f] != s.paths[clean]) {
      throw bad("is a copy of row " + std::to_string(clean) + " (file " + utf8::for_terminal(s.paths[clean]) +
                ") but has another path");
    }
    s.aug_copy.push_back(static_cast<int32_t>(k));
  }
}

/// The checked schema_version of `file`.
int64_t read_schema_version(const h5::File& file, const std::string& where) {
  if (!h5::has_attribute(file, "schema_version"))
    throw FormatError(where + ": no schema_version attribute (not a melforge-build dataset?)");
  const int64_t version = h5::read_attribute_int64(file, "schema_version");
  if (version < kOldestSchemaVersion || version > kSupportedSchemaVersion)
    throw FormatError(where + ": schema_version " + std::to_string(version) +
                      " is not supported (this melforge-train reads schema_version " +
                      std::to_string(kOldestSchemaVersion) + " to " + std::to_string(kSupportedSchemaVersion) +
                      "); rebuild the dataset with a matching melforge-build");
  return version;
}

/// Reads `label` and `path` (lengths checked) into `s` and checks the labels against the class names.
void read_labels_and_paths(const h5::File& file, const std::string& where, int64_t files, SplitInfo& s) {
  const auto labels = h5::read_int32(file, "label");
  s.paths = h5::read_strings(file, "path");
  for (const auto& [name, size] : {std::pair{"label", labels.size()}, {"path", s.paths.size()}}) {
    if (static_cast<int64_t>(size) != files)
      throw FormatError(where + ": " + name + " has " + std::to_string(size) + " entries but the split has " +
                        std::to_string(files) + " files");
  }
  const auto classes = static_cast<int32_t>(s.class_names.size());
  for (int64_t f = 0; f < files; ++f) {
    const int32_t label = labels[static_cast<std::size_t>(f)];
    if (label < 0 || label >= classes)
      throw FormatError(where + ": label[" + std::to_string(f) + "] = " + std::to_string(label) +
                        " is outside the " + std::to_string(classes) + " class names (file " +
                        utf8::for_terminal(s.paths[static_cast<std::size_t>(f)]) + ")");
  }
  s.labels.assign(labels.begin(), labels.end());
}

/// read_split_info without the check of the sibling splits' build_id.
SplitInfo read_one_split(const fs::path& path, const std::string& expected_split) {
  const std::string where = path.string();
  auto file = h5::open_file(path);
  SplitInfo s;
  s.schema_version = read_schema_version(file, where);
  s.build_id = h5::has_attribute(file, kBuildIdName) ? h5::read_attribute_string(file, kBuildIdName) : "";
  const std::string split_attr = h5::read_attribute_string(file, "split");
  if (split_attr != expected_split)
    throw FormatError(where + ": holds split '" + utf8::for_terminal(split_attr) + "', expected '" + expected_split +
                      "'");
  s.name = expected_split;
  s.path = path;
  s.info = read_mel_info(file, where);
  const auto name_dims = h5::dims(h5::open_dataset(file, "class_names"));
  if (name_dims.size() == 1 && name_dims[0] > kMaxClasses)
    throw FormatError(where + ": class_names has " + std::to_string(name_dims[0]) + " entries, more than " +
                      std::to_string(kMaxClasses));
  s.class_names = h5::read_strings(file, "class_names");
  if (s.class_names.empty()) throw FormatError(where + ": class_names is empty");

  const bool clips = s.schema_version >= kClipSchemaVersion;
  const int64_t files = clips ? clip_files(file, where, s) : grid_files(file, where, s);
  const std::string whose = clips ? "frame_offset says clips" : "mel has files";
  for (const char* name : {"label", "path"}) check_length(file, where, name, files, whose);
  check_metadata_fits(where, clips ? "frame_offset, label and path" : "mel, label, num_valid_long and path", files);
  read_labels_and_paths(file, where, files, s);
  if (clips) read_clip_table(file, where, s);
  else read_grid_clips(file, where, s);
  if (h5::exists(file, "targets")) read_targets(file, where, s);
  read_folds_and_groups(file, where, whose, s);
  read_aug_copy(file, where, whose, s);
  return s;
}

/// "" when every split file beside `s` (train.h5, val.h5, test.h5 of its folder, when `s` is one of them) that has a
/// build_id has the one of `s`; else the FormatError text naming both files and both identifiers. A sibling that
/// cannot be read is left to its own reader.
std::string build_id_mix(const SplitInfo& s) {
  const std::string own = s.path.filename().string();
  if (s.build_id.empty() || (own != "train.h5" && own != "val.h5" && own != "test.h5")) return "";
  for (const char* name : {"train.h5", "val.h5", "test.h5"}) {
    const fs::path other = s.path.parent_path() / name;
    std::error_code ec;
    if (name == own || !fs::is_regular_file(other, ec)) continue;
    std::string id;
    try {
      id = read_build_id(other);
    } catch (const Error&) {
      continue;
    }
    if (!id.empty() && id != s.build_id)
      return s.path.string() + " (build_id '" + utf8::for_terminal(s.build_id) + "') and " + other.string() +
             " (build_id '" + utf8::for_terminal(id) + "') come from different melforge-build runs; every split of "
             "a dataset folder must come from one build: rebuild the folder, or copy all of its files together";
  }
  return "";
}

}  // namespace

std::string read_build_id(const fs::path& path) {
  const auto file = h5::open_file(path);
  return h5::has_attribute(file, kBuildIdName) ? h5::read_attribute_string(file, kBuildIdName) : "";
}

SplitInfo read_split_info(const fs::path& path, const std::string& expected_split) {
  for (int attempt = 0;; ++attempt) {
    SplitInfo s = read_one_split(path, expected_split);
    const std::string mix = build_id_mix(s);
    if (mix.empty()) return s;
    if (attempt == kBuildIdRetries) throw FormatError(mix);
    std::this_thread::sleep_for(std::chrono::milliseconds(100 * (attempt + 1)));
  }
}

fs::path split_file(const fs::path& folder, const std::string& split) {
  if (split != "train" && split != "val" && split != "test")
    throw InvalidArgument("unknown split '" + split + "' (use train, val or test)");
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) throw IoError("dataset folder " + folder.string() + " does not exist");
  const fs::path p = folder / (split + ".h5");
  if (!fs::exists(p, ec))
    throw IoError("dataset folder " + folder.string() + " has no " + split + ".h5 (melforge-build writes " +
                  "train.h5, val.h5 and test.h5; is this an output folder of a complete build?)");
  return p;
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

}  // namespace melforge::data
