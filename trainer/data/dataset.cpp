#include "data/dataset.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>
#include <sstream>
#include <variant>

#include "melforge/common/errors.h"
#include "melforge/common/h5.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

/// One parameter attribute of MelInfo: its name and the member that holds it.
struct Field {
  const char* name;
  std::variant<int64_t MelInfo::*, double MelInfo::*, std::string MelInfo::*> member;
};

/// Every compared parameter attribute, in the order of docs/FORMAT.md.
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"sample_rate", &MelInfo::sample_rate},     {"n_fft", &MelInfo::n_fft},
      {"win_length", &MelInfo::win_length},       {"hop_length", &MelInfo::hop_length},
      {"window", &MelInfo::window},               {"center", &MelInfo::center},
      {"pad_mode", &MelInfo::pad_mode},           {"power", &MelInfo::power},
      {"n_mels", &MelInfo::n_mels},               {"f_min", &MelInfo::f_min},
      {"f_max", &MelInfo::f_max},                 {"mel_scale", &MelInfo::mel_scale},
      {"mel_norm", &MelInfo::mel_norm},           {"log", &MelInfo::log},
      {"amin", &MelInfo::amin},                   {"log_eps", &MelInfo::log_eps},
      {"dtype", &MelInfo::dtype},                 {"long_seconds", &MelInfo::long_seconds},
      {"short_seconds", &MelInfo::short_seconds}, {"long_samples", &MelInfo::long_samples},
      {"short_samples", &MelInfo::short_samples}, {"num_long", &MelInfo::num_long},
      {"num_short", &MelInfo::num_short},         {"n_frames", &MelInfo::n_frames},
      {"short_files", &MelInfo::short_files},     {"channel", &MelInfo::channel},
  };
  return f;
}

/// Attributes a file may lack (added after schema version 1 was first written); they keep their default.
bool optional_attribute(const std::string& name) { return name == "channel"; }

std::string value_text(const MelInfo& info, const Field& field) {
  std::ostringstream out;
  std::visit([&](auto member) { out << info.*member; }, field.member);
  return out.str();
}

/// Most class names a split may list; checked before they are read, so that a hostile length cannot make the reader
/// allocate without bound.
constexpr int64_t kMaxClasses = int64_t{1} << 20;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Reads and validates the parameter attributes of an open split file.
MelInfo read_info(const h5::File& file, const std::string& where) {
  MelInfo info;
  for (const auto& field : fields()) {
    if (!h5::has_attribute(file, field.name)) {
      if (optional_attribute(field.name)) continue;
      throw FormatError(where + ": missing attribute '" + field.name + "' (not a melforge-build dataset?)");
    }
    std::visit(
        [&](auto member) {
          using T = std::remove_reference_t<decltype(info.*member)>;
          if constexpr (std::is_same_v<T, int64_t>) info.*member = h5::read_attribute_int64(file, field.name);
          else if constexpr (std::is_same_v<T, double>) info.*member = h5::read_attribute_double(file, field.name);
          else info.*member = h5::read_attribute_string(file, field.name);
        },
        field.member);
  }
  if (h5::has_attribute(file, "melforge_version"))
    info.melforge_version = h5::read_attribute_string(file, "melforge_version");
  for (const auto& [name, value] : {std::pair{"sample_rate", info.sample_rate}, {"n_mels", info.n_mels},
                                    {"num_long", info.num_long}, {"num_short", info.num_short},
                                    {"n_frames", info.n_frames}, {"short_samples", info.short_samples}}) {
    if (value <= 0) throw FormatError(where + ": attribute " + name + " = " + std::to_string(value) + " must be > 0");
  }
  try {
    info.mel_args();
    info.segment_args();
  } catch (const FormatError& e) {
    throw FormatError(where + ": " + e.what());
  }
  return info;
}

template <typename Parse>
auto parse_attribute(const std::string& name, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const InvalidArgument& e) {
    throw FormatError("attribute " + name + " = '" + value + "' is not understood: " + e.what());
  }
}

at::Tensor int64_tensor(const std::vector<int32_t>& values) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  int64_t* p = t.data_ptr<int64_t>();
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

}  // namespace

mel::MelArgs MelInfo::mel_args() const {
  mel::MelArgs a;
  a.sample_rate = static_cast<int>(sample_rate);
  a.n_fft = static_cast<int>(n_fft);
  a.win_length = static_cast<int>(win_length);
  a.hop_length = static_cast<int>(hop_length);
  a.window = parse_attribute("window", window, mel::parse_window);
  a.center = center != 0;
  a.pad_mode = parse_attribute("pad_mode", pad_mode, mel::parse_pad_mode);
  a.power = static_cast<float>(power);
  a.n_mels = static_cast<int>(n_mels);
  a.f_min = static_cast<float>(f_min);
  a.f_max = static_cast<float>(f_max);
  a.mel_scale = parse_attribute("mel_scale", mel_scale, mel::parse_mel_scale);
  a.mel_norm = parse_attribute("mel_norm", mel_norm, mel::parse_mel_norm);
  a.log = parse_attribute("log", log, mel::parse_log_mode);
  a.amin = static_cast<float>(amin);
  a.log_eps = static_cast<float>(log_eps);
  parse_attribute("dtype", dtype, mel::parse_dtype);
  return a;
}

segment::SegmentArgs MelInfo::segment_args() const {
  segment::SegmentArgs s;
  s.long_seconds = long_seconds;
  s.short_seconds = short_seconds;
  s.num_long = static_cast<int>(num_long);
  s.short_files = parse_attribute("short_files", short_files, segment::parse_short_file_policy);
  return s;
}

nlohmann::json MelInfo::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& field : fields()) std::visit([&](auto member) { j[field.name] = this->*member; }, field.member);
  j["melforge_version"] = melforge_version;
  return j;
}

MelInfo MelInfo::from_json(const nlohmann::json& j) {
  MelInfo info;
  for (const auto& field : fields()) {
    if (!j.is_object() || !j.contains(field.name))
      throw FormatError(std::string("mel parameters: missing field '") + field.name + "'");
    try {
      std::visit([&](auto member) { j.at(field.name).get_to(info.*member); }, field.member);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(std::string("mel parameters: field '") + field.name + "': " + e.what());
    }
  }
  if (j.contains("melforge_version") && j["melforge_version"].is_string())
    info.melforge_version = j["melforge_version"].get<std::string>();
  return info;
}

std::string MelInfo::first_difference(const MelInfo& other, const std::string& this_name,
                                      const std::string& other_name) const {
  for (const auto& field : fields()) {
    const bool equal = std::visit([&](auto member) { return this->*member == other.*member; }, field.member);
    if (!equal)
      return std::string(field.name) + " is " + value_text(*this, field) + " in " + this_name + " but " +
             value_text(other, field) + " in " + other_name;
  }
  return {};
}

int64_t Split::valid_segments() const {
  if (!num_valid_long.defined() || files() == 0) return 0;
  return num_valid_long.sum().item<int64_t>() * info.num_short;
}

struct MelReader::Impl {
  mutable std::mutex mutex;
  h5::File file;
  h5::Dataset mel;
  int64_t files_per_chunk = 1;
  int64_t cache_bytes = 0;
};

MelReader::MelReader(const fs::path& path, int64_t cache_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->file = h5::open_file(path);
  h5::Dataset probe = h5::open_dataset(impl_->file, "mel");
  const std::vector<int64_t> chunk = h5::chunk_dims(probe);
  size_t chunk_bytes = H5Tget_size(h5::dataset_type(probe).id());
  for (const int64_t c : chunk) chunk_bytes *= static_cast<size_t>(c);
  if (!chunk.empty()) impl_->files_per_chunk = std::max<int64_t>(chunk[0], 1);
  const size_t bytes = std::max(static_cast<size_t>(std::max<int64_t>(cache_bytes, 0)), chunk_bytes);
  probe.close();
  impl_->mel = h5::open_dataset(impl_->file, "mel", h5::ChunkCache::sized(bytes, chunk_bytes));
  impl_->cache_bytes = static_cast<int64_t>(bytes);
}

MelReader::~MelReader() = default;

void MelReader::read(int64_t first, int64_t count, float* out) const {
  std::lock_guard lock(impl_->mutex);
  h5::read_float(impl_->mel, first, count, out);
}

int64_t MelReader::files_per_chunk() const { return impl_->files_per_chunk; }

int64_t MelReader::cache_bytes() const { return impl_->cache_bytes; }

at::Tensor Split::read_files(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > files())
    throw InvalidArgument("split '" + name + "': files [" + std::to_string(first) + ", " +
                          std::to_string(first + count) + ") are outside [0, " + std::to_string(files()) + ")");
  if (mel.defined()) return mel.narrow(0, first, count);
  if (!reader) throw InvalidArgument("split '" + name + "' (" + path.string() + ") was read without its spectrograms");
  std::vector<int64_t> shape = info.file_shape();
  shape.insert(shape.begin(), count);
  at::Tensor out = at::empty(shape, at::kFloat);
  if (count > 0) reader->read(first, count, out.data_ptr<float>());
  check_finite(first, count, out.data_ptr<float>());
  return out;
}

void Split::check_finite(int64_t first, int64_t count, const float* data) const {
  int64_t per_file = 1;
  for (const int64_t d : info.file_shape()) per_file *= d;
  const int64_t n = count * per_file;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= !(data[i] - data[i] == 0.0f);
  if (!bad) return;
  int64_t i = 0;
  while (data[i] - data[i] == 0.0f) ++i;
  const int64_t row = first + i / per_file, segment = i % per_file / (info.n_mels * info.n_frames);
  throw FormatError(path.string() + ": split '" + name + "', row " + std::to_string(row) + " (file " +
                    paths[static_cast<std::size_t>(row)] + "): the spectrogram holds " +
                    (std::isnan(data[i]) ? "NaN" : "an infinite value") + " (long segment " +
                    std::to_string(segment / info.num_short) + ", short segment " +
                    std::to_string(segment % info.num_short) + "); rebuild the dataset, or remove the file");
}

void Split::check_all_finite() const {
  if (!streamed()) return;
  const int64_t block = std::max<int64_t>(files_per_chunk(), 1);
  for (int64_t f0 = 0; f0 < files(); f0 += block) read_files(f0, std::min(block, files() - f0));
}

namespace {

/// Reads the spectrograms of a split read_split has checked, as float32 [F, L, S, M, T], in blocks of whole chunks
/// of about `block_bytes` (at least one chunk); calls `poll` (when set) before each block.
void read_mel(Split& s, const std::function<void()>& poll = {}, int64_t block_bytes = int64_t{64} << 20) {
  auto file = h5::open_file(s.path);
  auto mel = h5::open_dataset(file, "mel");
  std::vector<int64_t> shape = s.info.file_shape();
  int64_t per_file = 1;
  for (const int64_t x : shape) per_file *= x;
  shape.insert(shape.begin(), s.files());
  s.mel = at::empty(shape, at::kFloat);
  const auto chunk = h5::chunk_dims(mel);
  const int64_t chunk_files = chunk.empty() ? 1 : std::max<int64_t>(chunk[0], 1);
  const int64_t block_chunks = std::max<int64_t>(1, block_bytes / std::max<int64_t>(chunk_files * per_file * 4, 1));
  const int64_t block = chunk_files * block_chunks;
  for (int64_t first = 0; first < s.files(); first += block) {
    if (poll) poll();
    const int64_t count = std::min(block, s.files() - first);
    float* dst = s.mel.data_ptr<float>() + first * per_file;
    h5::read_float(mel, first, count, dst);
    s.check_finite(first, count, dst);
  }
}

/// Float32 bytes of a split's spectrograms.
double mel_bytes(const Split& s) {
  double bytes = static_cast<double>(s.files()) * sizeof(float);
  for (const int64_t dim : s.info.file_shape()) bytes *= static_cast<double>(dim);
  return bytes;
}

/// Whether spectrograms of `need` float32 bytes are streamed under `stream` (`auto`: when they do not fit
/// `ram_budget_bytes`, -1: MemAvailable). Throws Error naming `what` and `detail` when `off` and they do not fit.
bool streams(const StreamOptions& stream, double need, const std::string& what, const std::string& detail,
             int64_t ram_budget_bytes) {
  const int64_t budget = ram_budget_bytes >= 0 ? ram_budget_bytes : available_memory_bytes();
  const bool fits = budget < 0 || need <= static_cast<double>(budget);
  if (stream.stream == "off" && !fits)
    throw Error(what + " needs " + std::to_string(static_cast<int64_t>(need / (1 << 20))) + " MiB as float32 in RAM" +
                detail + " but only " + std::to_string(budget >> 20) +
                " MiB are available; use --stream on (or auto) to stream it from the files");
  return stream.stream == "on" || (stream.stream == "auto" && !fits);
}

}  // namespace

Split read_split(const fs::path& path, const std::string& expected_split, bool load_mel) {
  const std::string where = path.string();
  auto file = h5::open_file(path);
  if (!h5::has_attribute(file, "schema_version"))
    throw FormatError(where + ": no schema_version attribute (not a melforge-build dataset?)");
  const int64_t version = h5::read_attribute_int64(file, "schema_version");
  if (version != kSupportedSchemaVersion)
    throw FormatError(where + ": schema_version " + std::to_string(version) +
                      " is not supported (this melforge-train reads schema_version " +
                      std::to_string(kSupportedSchemaVersion) + "); rebuild the dataset with a matching melforge-build");
  const std::string split_attr = h5::read_attribute_string(file, "split");
  if (split_attr != expected_split)
    throw FormatError(where + ": holds split '" + split_attr + "', expected '" + expected_split + "'");

  Split s;
  s.name = expected_split;
  s.path = path;
  s.info = read_info(file, where);
  const auto name_dims = h5::dims(h5::open_dataset(file, "class_names"));
  if (name_dims.size() == 1 && name_dims[0] > kMaxClasses)
    throw FormatError(where + ": class_names has " + std::to_string(name_dims[0]) + " entries, more than " +
                      std::to_string(kMaxClasses));
  s.class_names = h5::read_strings(file, "class_names");
  if (s.class_names.empty()) throw FormatError(where + ": class_names is empty");

  auto mel = h5::open_dataset(file, "mel");
  h5::check_virtual_sources(mel);
  const auto dims = h5::dims(mel);
  std::vector<int64_t> expect = s.info.file_shape();
  if (dims.size() != 5 || !std::equal(expect.begin(), expect.end(), dims.begin() + 1)) {
    expect.insert(expect.begin(), dims.empty() ? 0 : dims[0]);
    throw FormatError(where + ": mel has shape " + shape_text(dims) + ", but the attributes say " +
                      shape_text(expect) + " [files, num_long, num_short, n_mels, n_frames]");
  }
  const int64_t files = dims[0];
  for (const char* name : {"label", "num_valid_long", "path"}) {
    const auto d = h5::dims(h5::open_dataset(file, name));
    if (d.size() != 1 || d[0] != files)
      throw FormatError(where + ": " + name + " has shape " + shape_text(d) + " but mel has " +
                        std::to_string(files) + " files");
  }
  constexpr int64_t kMetadataBytesPerFile = 64;
  if (const int64_t available = available_memory_bytes(); available >= 0 && files > available / kMetadataBytesPerFile)
    throw FormatError(where + ": mel, label, num_valid_long and path claim " + std::to_string(files) +
                      " files, whose per-file metadata alone needs at least " +
                      std::to_string(files / (int64_t{1} << 20) * kMetadataBytesPerFile) + " MiB, more than the " +
                      std::to_string(available >> 20) + " MiB of memory available");
  const auto labels = h5::read_int32(file, "label");
  const auto valid = h5::read_int32(file, "num_valid_long");
  s.paths = h5::read_strings(file, "path");
  for (const auto& [name, size] : {std::pair{"label", labels.size()}, {"num_valid_long", valid.size()},
                                   {"path", s.paths.size()}}) {
    if (static_cast<int64_t>(size) != files)
      throw FormatError(where + ": " + name + " has " + std::to_string(size) + " entries but mel has " +
                        std::to_string(files) + " files");
  }
  const auto classes = static_cast<int32_t>(s.class_names.size());
  for (int64_t f = 0; f < files; ++f) {
    if (labels[f] < 0 || labels[f] >= classes)
      throw FormatError(where + ": label[" + std::to_string(f) + "] = " + std::to_string(labels[f]) +
                        " is outside the " + std::to_string(classes) + " class names (file " + s.paths[f] + ")");
    if (valid[f] < 1 || valid[f] > s.info.num_long)
      throw FormatError(where + ": num_valid_long[" + std::to_string(f) + "] = " + std::to_string(valid[f]) +
                        " is outside [1, num_long = " + std::to_string(s.info.num_long) + "] (file " +
                        s.paths[f] + ")");
  }
  s.label = int64_tensor(labels);
  s.num_valid_long = int64_tensor(valid);
  if (load_mel) read_mel(s);
  return s;
}

Split open_split_streamed(const fs::path& path, const std::string& expected_split, int64_t cache_bytes) {
  Split s = read_split(path, expected_split, /*load_mel=*/false);
  s.reader = std::make_shared<const MelReader>(path, cache_bytes);
  return s;
}

Split load_split(const fs::path& path, const std::string& expected_split, const StreamOptions& stream,
                 int64_t ram_budget_bytes) {
  stream.validate();
  Split s = read_split(path, expected_split, /*load_mel=*/false);
  if (streams(stream, mel_bytes(s), path.string(), "", ram_budget_bytes))
    s.reader = std::make_shared<const MelReader>(path, stream.h5_cache << 20);
  else
    read_mel(s);
  return s;
}

const Split& Dataset::split(const std::string& name) const {
  if (name == "train") return train;
  if (name == "val") return val;
  if (name == "test") return test;
  throw InvalidArgument("unknown split '" + name + "' (use train, val or test)");
}

void Dataset::require_files(const std::string& name) const {
  const Split& s = split(name);
  if (s.files() == 0)
    throw FormatError("split '" + name + "' of " + dir.string() + " is empty (" + s.path.filename().string() +
                      " has no files); rebuild the dataset with a --split that gives it files");
}

int64_t Dataset::class_index(const std::string& name, const std::string& flag) const {
  for (std::size_t i = 0; i < class_names.size(); ++i)
    if (class_names[i] == name) return static_cast<int64_t>(i);
  std::string list;
  for (const auto& c : class_names) list += (list.empty() ? "" : ", ") + c;
  throw InvalidArgument(flag + ": '" + name + "' is not a class of " + dir.string() + " (classes: " + list + ")");
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

namespace {

/// Reads and checks the metadata of the three splits of `dir` (no spectrograms).
Dataset read_metadata(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw IoError("dataset folder " + dir.string() + " does not exist");
  for (const auto& name : kSplitNames) {
    const fs::path p = dir / (name + ".h5");
    if (!fs::exists(p, ec))
      throw FormatError("dataset folder " + dir.string() + " has no " + name + ".h5 (melforge-build writes " +
                        "train.h5, val.h5 and test.h5; is this an output folder of a complete build?)");
  }
  Dataset d;
  d.dir = dir;
  d.train = read_split(dir / "train.h5", "train", false);
  d.val = read_split(dir / "val.h5", "val", false);
  d.test = read_split(dir / "test.h5", "test", false);
  for (const Split* s : {&d.val, &d.test}) {
    const std::string diff = d.train.info.first_difference(s->info, "train.h5", s->name + ".h5");
    if (!diff.empty())
      throw FormatError(s->path.string() + " does not match train.h5: " + diff +
                        "; all three splits must come from one melforge-build run");
    if (s->class_names != d.train.class_names) {
      auto list = [](const std::vector<std::string>& v) {
        std::string out;
        for (const auto& c : v) out += (out.empty() ? "" : ", ") + c;
        return "[" + out + "]";
      };
      throw FormatError(s->path.string() + " does not match train.h5: class names " + list(s->class_names) +
                        " vs " + list(d.train.class_names) + " in train.h5; all three splits must come from one " +
                        "melforge-build run");
    }
  }
  d.info = d.train.info;
  d.class_names = d.train.class_names;
  return d;
}

/// The float32 bytes of the three splits' spectrograms, and "train N MiB, val N MiB, test N MiB".
std::pair<double, std::string> dataset_mel_bytes(const Dataset& d) {
  double need = 0;
  std::string sizes;
  for (const Split* s : {&d.train, &d.val, &d.test}) {
    const double bytes = mel_bytes(*s);
    need += bytes;
    sizes += (sizes.empty() ? "" : ", ") + s->name + " " +
             std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB";
  }
  return {need, sizes};
}

}  // namespace

Dataset load_dataset(const fs::path& dir, bool load_mel, int64_t ram_budget_bytes) {
  StreamOptions off;
  off.stream = "off";
  if (!load_mel) return read_metadata(dir);
  return load_dataset(dir, off, ram_budget_bytes);
}

Dataset load_dataset(const fs::path& dir, const StreamOptions& stream, int64_t ram_budget_bytes,
                     const std::function<void()>& poll, int64_t block_bytes) {
  stream.validate();
  Dataset d = read_metadata(dir);
  const auto [need, sizes] = dataset_mel_bytes(d);
  if (streams(stream, need, "dataset " + dir.string(), " (" + sizes + ")", ram_budget_bytes)) {
    const int64_t cache = stream.h5_cache << 20;
    for (Split* s : {&d.train, &d.val, &d.test}) s->reader = std::make_shared<const MelReader>(s->path, cache);
    return d;
  }
  for (Split* s : {&d.train, &d.val, &d.test}) read_mel(*s, poll, block_bytes);
  return d;
}

}  // namespace melforge::trainer
