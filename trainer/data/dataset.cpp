#include "data/dataset.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>
#include <thread>

#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "models/model.h"
#include "views/gather.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

at::Tensor int64_tensor(const std::vector<int64_t>& values) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::copy(values.begin(), values.end(), t.data_ptr<int64_t>());
  return t;
}

std::string range_text(int64_t first, int64_t end) {
  return "[" + std::to_string(first) + ", " + std::to_string(end) + ")";
}

}  // namespace

int64_t Split::clip_frames(int64_t c) const {
  if (c < 0 || c >= files())
    throw InvalidArgument("split '" + name + "': clip " + std::to_string(c) + " is outside " + range_text(0, files()));
  return meta.frame_offset[static_cast<std::size_t>(c + 1)] - meta.frame_offset[static_cast<std::size_t>(c)];
}

std::vector<int64_t> Split::clip_frame_counts() const {
  std::vector<int64_t> out(static_cast<std::size_t>(files()));
  for (std::size_t c = 0; c < out.size(); ++c) out[c] = meta.frame_offset[c + 1] - meta.frame_offset[c];
  return out;
}

int64_t Split::total_frames() const { return meta.frame_offset.empty() ? 0 : meta.frame_offset.back(); }

double Split::frame_bytes() const {
  return static_cast<double>(total_frames()) * static_cast<double>(info.n_mels) * sizeof(float);
}

at::Tensor Split::read_clips(int64_t first, int64_t count) const {
  if (first < 0 || count < 0 || first + count > files())
    throw InvalidArgument("split '" + name + "': clips " + range_text(first, first + count) + " are outside " +
                          range_text(0, files()));
  const int64_t begin = meta.frame_offset[static_cast<std::size_t>(first)];
  const int64_t frames_count = meta.frame_offset[static_cast<std::size_t>(first + count)] - begin;
  if (frames.defined()) return frames.narrow(0, begin, frames_count);
  if (!reader) throw InvalidArgument("split '" + name + "' (" + path.string() + ") was read without its frames");
  at::Tensor out = at::empty({frames_count, info.n_mels}, at::kFloat);
  if (count > 0) reader->read_clips(first, count, out.data_ptr<float>());
  return out;
}

float Split::pad_value() const { return mel::silence_value(info.mel_args()); }

void Split::check_finite(int64_t first, int64_t count, const float* data) const {
  const int64_t m = info.n_mels, base = meta.frame_offset[static_cast<std::size_t>(first)];
  const int64_t n = (meta.frame_offset[static_cast<std::size_t>(first + count)] - base) * m;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(data[i])) continue;
    const int64_t row = base + i / m;
    const auto it = std::upper_bound(meta.frame_offset.begin(), meta.frame_offset.end(), row);
    const auto clip = static_cast<int64_t>(it - meta.frame_offset.begin()) - 1;
    std::ostringstream msg;
    msg << path.string() << " (split '" << name << "'): clip " << clip << " ('" << paths[static_cast<std::size_t>(clip)]
        << "') holds " << (std::isnan(data[i]) ? "NaN" : "an infinity") << " at frame "
        << row - meta.frame_offset[static_cast<std::size_t>(clip)] << ", mel band " << i % m
        << "; the file is damaged or was not written by melforge-build (rebuild it)";
    throw FormatError(msg.str());
  }
}

void Split::check_all_finite() const {
  if (!streamed()) return;
  const int64_t block_frames = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * std::max<int64_t>(info.n_mels, 1)));
  for (int64_t c0 = 0; c0 < files();) {
    int64_t c1 = c0 + 1;
    while (c1 < files() && meta.frame_offset[static_cast<std::size_t>(c1 + 1)] -
                                   meta.frame_offset[static_cast<std::size_t>(c0)] <= block_frames)
      ++c1;
    read_clips(c0, c1 - c0);
    c0 = c1;
  }
}

ExampleBatch gather_examples(const Split& split, std::span<const data::views::Example> examples, int64_t out_length) {
  int64_t longest = 0;
  for (const auto& e : examples) {
    if (e.clip < 0 || e.clip >= split.files())
      throw InvalidArgument("gather_examples: clip " + std::to_string(e.clip) + " is outside split '" + split.name +
                            "' " + range_text(0, split.files()));
    longest = std::max(longest, e.length);
  }
  const int64_t t = out_length > 0 ? out_length : longest;
  if (longest > t)
    throw InvalidArgument("gather_examples: an example of " + std::to_string(longest) + " frames does not fit " +
                          std::to_string(t) + " frames");
  const auto b = static_cast<int64_t>(examples.size()), m = split.info.n_mels;
  ExampleBatch out{at::empty({b, m, t}, at::kFloat), at::empty({b}, at::kLong), at::empty({b}, at::kLong)};
  const float pad = split.pad_value();
  std::map<int64_t, at::Tensor> clips;
  for (int64_t i = 0; i < b; ++i) {
    const auto& e = examples[static_cast<std::size_t>(i)];
    auto it = clips.find(e.clip);
    if (it == clips.end()) it = clips.emplace(e.clip, split.read_clips(e.clip, 1).contiguous()).first;
    out.lengths.data_ptr<int64_t>()[i] = data::views::gather_example(
        e, it->second.data_ptr<float>(), m, t, pad, out.x.data_ptr<float>() + i * m * t);
    out.clip.data_ptr<int64_t>()[i] = e.clip;
  }
  return out;
}

data::views::FrameRate frame_rate(const MelInfo& info) { return {info.sample_rate, info.hop_length}; }

namespace {

bool legacy(const Split& split) { return split.meta.schema_version < 3; }

/// Whether the view field of flag `flag` (equal to its default when `at_default`) was left unset by the user.
bool unset(const std::set<std::string>& given, const std::string& flag, bool at_default) {
  return given.empty() ? at_default : given.count(flag) == 0;
}

}  // namespace

data::views::ViewOptions resolve_view_options(const data::views::ViewOptions& options, const Split& split,
                                              const std::string& model, const std::set<std::string>& given) {
  const data::views::ViewOptions defaults;
  data::views::ViewOptions o = options;
  if (unset(given, "view", o.view == defaults.view))
    o.view = is_speaker_model(model) && !legacy(split) ? "crops" : "tiles";
  if (unset(given, "tile-seconds", o.tile_seconds == defaults.tile_seconds)) o.tile_seconds = split.info.short_seconds;
  return o;
}

std::unique_ptr<data::views::View> split_view(const Split& split, const data::views::ViewOptions& options,
                                              bool evaluation) {
  const data::views::FrameRate rate = frame_rate(split.info);
  if (legacy(split)) {
    if (options.view != "tiles")
      throw InvalidArgument("--view " + options.view + ": " + split.path.string() + " is a schema-" +
                            std::to_string(split.meta.schema_version) + " dataset, read as tiles of its stored " +
                            "short segments only (rebuild it with this melforge-build for --view crops or clips)");
    return data::views::make_tiles_view_frames(split.info.n_frames, split.info.n_frames, 0.0);
  }
  data::views::ViewOptions o = options;
  if (evaluation) o.min_real = 0.0;
  return data::views::make_view(o, rate);
}

int64_t example_frames(const data::views::ViewOptions& options, const Split& split) {
  if (legacy(split)) return split.info.n_frames;
  const data::views::FrameRate rate = frame_rate(split.info);
  options.validate(rate);
  if (options.view == "tiles") return rate.frames(options.tile_seconds);
  if (options.view == "crops") return rate.frames(options.crop_seconds);
  throw InvalidArgument("--view " + options.view + " has examples of every length (whole clips); a model trains on " +
                        "examples of one length: --view tiles or crops");
}

namespace {

/// Reads the frames of a split read_split has checked into `s.frames` (float32 [N, M]) in blocks of whole clips of
/// about `block_bytes` (at least one clip); calls `poll` (when set) before each block.
void read_frames(Split& s, const std::function<void()>& poll = {}, int64_t block_bytes = int64_t{64} << 20) {
  const data::ClipReader reader(s.meta, int64_t{16} << 20);
  const int64_t m = s.info.n_mels;
  s.frames = at::empty({s.total_frames(), m}, at::kFloat);
  const int64_t block_frames = std::max<int64_t>(1, block_bytes / (4 * std::max<int64_t>(m, 1)));
  const auto& off = s.meta.frame_offset;
  for (int64_t c0 = 0; c0 < s.files();) {
    if (poll) poll();
    int64_t c1 = c0 + 1;
    while (c1 < s.files() && off[static_cast<std::size_t>(c1 + 1)] - off[static_cast<std::size_t>(c0)] <= block_frames)
      ++c1;
    float* dst = s.frames.data_ptr<float>() + off[static_cast<std::size_t>(c0)] * m;
    reader.read_clips(c0, c1 - c0, dst);
    c0 = c1;
  }
}

/// Whether frames of `need` float32 bytes are streamed under `stream` (`auto`: when they do not fit
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

Split read_split(const fs::path& path, const std::string& expected_split, bool load_frames) {
  data::SplitInfo info = data::read_split_info(path, expected_split);
  Split s;
  s.name = info.name;
  s.path = info.path;
  s.info = info.info;
  s.class_names = info.class_names;
  s.paths = info.paths;
  s.label = int64_tensor(info.labels);
  if (info.multilabel())
    s.targets = at::from_blob(info.targets.data(), {s.files(), static_cast<int64_t>(s.class_names.size())}, at::kByte)
                    .to(at::kFloat);
  s.meta = std::move(info);
  if (load_frames) read_frames(s);
  return s;
}

Split open_split_streamed(const fs::path& path, const std::string& expected_split, int64_t cache_bytes) {
  Split s = read_split(path, expected_split, /*load_frames=*/false);
  s.reader = std::make_shared<const data::ClipReader>(s.meta, cache_bytes);
  return s;
}

Split load_split(const fs::path& path, const std::string& expected_split, const StreamOptions& stream,
                 int64_t ram_budget_bytes) {
  stream.validate();
  Split s = read_split(path, expected_split, /*load_frames=*/false);
  if (streams(stream, s.frame_bytes(), path.string(), "", ram_budget_bytes))
    s.reader = std::make_shared<const data::ClipReader>(s.meta, stream.h5_cache << 20);
  else
    read_frames(s);
  return s;
}

namespace {

/// Appends row `row` of `from` to the per-clip fields of `to` (frame_offset grows by the clip's frames); groups when
/// `groups` ("" for a source without them).
void append_row(const data::SplitInfo& from, int64_t row, int64_t frames, bool groups, data::SplitInfo& to) {
  const auto u = static_cast<std::size_t>(row);
  to.labels.push_back(from.labels[u]);
  to.paths.push_back(from.paths[u]);
  if (!from.num_valid_long.empty()) to.num_valid_long.push_back(from.num_valid_long[u]);
  to.num_samples.push_back(from.num_samples[u]);
  to.clip_flags.push_back(from.clip_flags[u]);
  to.frame_offset.push_back(to.frame_offset.back() + frames);
  const std::size_t classes = from.class_names.size();
  if (from.has_targets_dataset)
    to.targets.insert(to.targets.end(), from.targets.begin() + static_cast<std::ptrdiff_t>(u * classes),
                      from.targets.begin() + static_cast<std::ptrdiff_t>((u + 1) * classes));
  if (!from.folds.empty()) to.folds.push_back(from.folds[u]);
  if (groups) to.groups.push_back(from.groups.empty() ? std::string() : from.groups[u]);
}

}  // namespace

Split subset_split(const std::vector<const Split*>& sources, const std::vector<std::pair<int, int64_t>>& rows,
                   const std::string& name, const fs::path& path) {
  if (sources.empty()) throw InvalidArgument("subset_split: no source split");
  const data::SplitInfo& first = sources[0]->meta;
  bool groups = false;
  for (const Split* src : sources) groups |= !src->meta.groups.empty();
  Split s;
  data::SplitInfo& m = s.meta;
  m.name = name;
  m.path = path;
  m.schema_version = first.schema_version;
  m.info = first.info;
  m.class_names = first.class_names;
  m.build_id = first.build_id;
  m.has_targets_dataset = first.has_targets_dataset;
  m.num_folds = first.num_folds;
  m.frame_offset.assign(1, 0);
  for (const auto& [source, row] : rows) {
    if (source < 0 || static_cast<std::size_t>(source) >= sources.size())
      throw InvalidArgument("subset_split: source " + std::to_string(source) + " is outside the " +
                            std::to_string(sources.size()) + " splits");
    const Split& from = *sources[static_cast<std::size_t>(source)];
    append_row(from.meta, row, from.clip_frames(row), groups, m);
  }
  s.name = name;
  s.path = path;
  s.info = m.info;
  s.class_names = m.class_names;
  s.paths = m.paths;
  s.label = int64_tensor(m.labels);
  if (m.has_targets_dataset)
    s.targets = at::from_blob(m.targets.data(), {s.files(), static_cast<int64_t>(m.class_names.size())}, at::kByte)
                    .to(at::kFloat);
  s.frames = at::empty({s.total_frames(), s.info.n_mels}, at::kFloat);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto [source, row] = rows[i];
    const int64_t begin = m.frame_offset[i], count = m.frame_offset[i + 1] - begin;
    s.frames.narrow(0, begin, count).copy_(sources[static_cast<std::size_t>(source)]->read_clips(row, 1));
  }
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
                      " has no clips); rebuild the dataset with a --split that gives it files");
}

int64_t Dataset::class_index(const std::string& name, const std::string& flag) const {
  for (std::size_t i = 0; i < class_names.size(); ++i)
    if (class_names[i] == name) return static_cast<int64_t>(i);
  std::string list;
  for (const auto& c : class_names) list += (list.empty() ? "" : ", ") + c;
  throw InvalidArgument(flag + ": '" + name + "' is not a class of " + dir.string() + " (classes: " + list + ")");
}


namespace {

/// "" when the splits of `d` that carry a build_id all carry the same one; otherwise a message naming two files and
/// their identifiers (an `--overwrite` install between two of the reads, or splits of two builds).
std::string build_id_mix(const Dataset& d) {
  for (const Split* s : {&d.val, &d.test}) {
    const std::string& a = d.train.meta.build_id;
    const std::string& b = s->meta.build_id;
    if (!a.empty() && !b.empty() && a != b)
      return utf8::for_terminal(s->path.string()) + " has build_id '" + utf8::for_terminal(b) + "' and " +
             utf8::for_terminal(d.train.path.string()) + " has '" + utf8::for_terminal(a) +
             "': the splits come from different melforge-build runs; build them again together";
  }
  return {};
}

/// Reads and checks the metadata of the three splits of `dir` (no spectrograms); a build_id mix is read again
/// twice (100 ms, then 200 ms later) before it is refused.
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
  std::string mix;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
    d.train = read_split(dir / "train.h5", "train", false);
    d.val = read_split(dir / "val.h5", "val", false);
    d.test = read_split(dir / "test.h5", "test", false);
    mix = build_id_mix(d);
    if (mix.empty()) break;
  }
  if (!mix.empty()) throw FormatError(mix);
  for (const Split* s : {&d.val, &d.test}) {
    const std::string diff = d.train.info.first_difference(s->info, "train.h5", s->name + ".h5");
    if (!diff.empty())
      throw FormatError(s->path.string() + " does not match train.h5: " + diff +
                        "; all three splits must come from one melforge-build run");
    if (s->class_names != d.train.class_names) {
      auto list = [](const std::vector<std::string>& v) {
        std::string out;
        for (const auto& c : v) out += (out.empty() ? "" : ", ") + c;
        return utf8::for_terminal("[" + out + "]", 400);
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

/// The float32 bytes of the three splits' frames, and "train N MiB, val N MiB, test N MiB".
std::pair<double, std::string> dataset_mel_bytes(const Dataset& d) {
  double need = 0;
  std::string sizes;
  for (const Split* s : {&d.train, &d.val, &d.test}) {
    const double bytes = s->frame_bytes();
    need += bytes;
    sizes += (sizes.empty() ? "" : ", ") + s->name + " " +
             std::to_string(static_cast<int64_t>(bytes / (1 << 20))) + " MiB";
  }
  return {need, sizes};
}

}  // namespace

Dataset load_dataset(const fs::path& dir, bool load_frames, int64_t ram_budget_bytes) {
  StreamOptions off;
  off.stream = "off";
  if (!load_frames) return read_metadata(dir);
  return load_dataset(dir, off, ram_budget_bytes);
}

Dataset load_dataset(const fs::path& dir, const StreamOptions& stream, int64_t ram_budget_bytes,
                     const std::function<void()>& poll, int64_t block_bytes) {
  stream.validate();
  Dataset d = read_metadata(dir);
  const auto [need, sizes] = dataset_mel_bytes(d);
  if (streams(stream, need, "dataset " + dir.string(), " (" + sizes + ")", ram_budget_bytes)) {
    const int64_t cache = stream.h5_cache << 20;
    for (Split* s : {&d.train, &d.val, &d.test}) s->reader = std::make_shared<const data::ClipReader>(s->meta, cache);
    return d;
  }
  for (Split* s : {&d.train, &d.val, &d.test}) read_frames(*s, poll, block_bytes);
  return d;
}

}  // namespace melforge::trainer
