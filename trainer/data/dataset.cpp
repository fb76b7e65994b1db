#include "data/dataset.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

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

at::Tensor int64_tensor(const std::vector<int64_t>& values) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  int64_t* p = t.data_ptr<int64_t>();
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

}  // namespace

int64_t Split::valid_segments() const {
  if (!num_valid_long.defined() || files() == 0) return 0;
  return num_valid_long.sum().item<int64_t>() * info.num_short;
}

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
  data::check_finite(path, name, info, paths, first, count, data);
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
  data::SplitInfo info = data::read_split_info(path, expected_split);
  Split s;
  s.name = std::move(info.name);
  s.path = std::move(info.path);
  s.info = std::move(info.info);
  s.class_names = std::move(info.class_names);
  s.paths = std::move(info.paths);
  s.label = int64_tensor(info.labels);
  s.num_valid_long = int64_tensor(info.num_valid_long);
  if (info.multilabel())
    s.targets = at::from_blob(info.targets.data(), {s.files(), static_cast<int64_t>(s.class_names.size())}, at::kByte)
                    .to(at::kFloat);
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
    if (s->multilabel() != d.train.multilabel())
      throw FormatError(s->path.string() + " does not match train.h5: " +
                        (s->multilabel() ? "it has a multi-label targets matrix and train.h5 has none"
                                         : "train.h5 has a multi-label targets matrix and it has none") +
                        "; all three splits must come from one melforge-build run");
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
