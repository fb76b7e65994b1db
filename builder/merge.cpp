#include "merge.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <variant>

#include "build_options.h"
#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/h5.h"
#include "melforge/common/timing.h"
#include "output_folder.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace melforge::builder {

namespace {

/// Root attributes of a split file that differ between the shards of one series, or that the merge rewrites.
const std::set<std::string> kPerShardAttributes = {"shard_index", "shard_count", "schema_version", "split",
                                                   "melforge_version", kBuildIdAttribute};

/// Bytes of frames the merge with --copy reads from a shard at a time (at least one clip).
constexpr int64_t kCopyBatchBytes = int64_t{32} << 20;

/// One shard folder and what its report says about it.
struct Shard {
  fs::path dir;
  json report;
  int index = 0;
  int count = 0;
  std::string fingerprint;
  int64_t corpus_entries = 0;
};

/// One shard's file of one split, opened and checked on its own.
struct ShardSplit {
  fs::path path;
  h5::File file;
  /// The shard's `frames` [N, M].
  h5::Dataset frames;
  std::vector<int64_t> dims;
  std::vector<int64_t> chunk;
  h5::Filters filters;
  std::map<std::string, h5::AttributeValue> attributes;
  std::vector<std::string> class_names;
  std::vector<int32_t> label;
  /// frame_offset, num_samples and clip_flags.
  ClipColumns clips;
  /// Empty when the shard has no `source_sample_rate` dataset (written before it existed).
  std::vector<int32_t> source_sample_rate;
  bool has_source_sample_rate = false;
  std::vector<std::string> path_values;
  /// The aug_* recipe datasets (a build with --augment-copies); empty when `augmented` is false.
  RecipeColumns recipes;
  bool augmented = false;
  /// `fold` and `group` (a build with folds or groups); empty when the shard has none.
  std::vector<int32_t> fold;
  std::vector<std::string> group;
  bool has_fold = false;
  bool has_group = false;
  /// `speed_speaker` (a build with --speed-speakers); empty when the shard has none.
  std::vector<float> speed_speaker;
  bool has_speed_speaker = false;
};

/// Reads the `fold` and `group` datasets of shard split `s` when present: as many entries as clips, folds within
/// [1, kMaxFolds]. Throws FormatError naming the file.
void read_fold_group(ShardSplit& s, std::size_t files, const std::string& where) {
  s.has_fold = h5::exists(s.file, "fold");
  s.has_group = h5::exists(s.file, "group");
  if (s.has_fold) s.fold = h5::read_int32(s.file, "fold");
  if (s.has_group) s.group = h5::read_strings(s.file, "group");
  if ((s.has_fold && s.fold.size() != files) || (s.has_group && s.group.size() != files))
    throw FormatError(where + ": fold or group does not hold one entry per clip (" + std::to_string(files) + ")");
  for (const int32_t f : s.fold)
    if (f < 1 || f > kMaxFolds)
      throw FormatError(where + ": fold " + std::to_string(f) + " is outside [1, " + std::to_string(kMaxFolds) + "]");
}

Shard read_shard(const fs::path& dir) {
  const fs::path report_path = dir / kReportName;
  std::ifstream in(report_path);
  if (!in)
    throw FormatError(report_path.string() + ": missing: '" + dir.string() +
                      "' is not the output folder of a finished `melforge-build --shard K/N`");
  Shard s;
  s.dir = dir;
  try {
    s.report = json::parse(in);
  } catch (const json::exception& e) {
    throw FormatError(report_path.string() + ": not valid JSON: " + e.what());
  }
  if (!s.report.contains("shard") || !s.report["shard"].is_object())
    throw FormatError(report_path.string() + ": no \"shard\" entry: '" + dir.string() +
                      "' was built without --shard K/N, so it cannot be merged");
  try {
    const json& sh = s.report.at("shard");
    s.index = sh.at("index").get<int>();
    s.count = sh.at("count").get<int>();
    s.fingerprint = sh.at("corpus_fingerprint").get<std::string>();
    s.corpus_entries = sh.at("corpus_entries").get<int64_t>();
    (void)s.report.at("files").at("scanned").get<int64_t>();
  } catch (const json::exception& e) {
    throw FormatError(report_path.string() + ": malformed report: " + e.what());
  }
  if (s.count < 1 || s.index < 1 || s.index > s.count)
    throw FormatError(report_path.string() + ": shard " + std::to_string(s.index) + "/" + std::to_string(s.count) +
                      " is not a valid K/N");
  return s;
}

/// Reads every shard's report and checks that together they are one complete series; returns them by index.
std::vector<Shard> read_series(const std::vector<fs::path>& dirs) {
  std::vector<Shard> shards;
  for (const auto& d : dirs) shards.push_back(read_shard(d));
  const Shard& first = shards.front();
  std::map<int, const Shard*> by_index;
  for (const Shard& s : shards) {
    const std::string where = (s.dir / kReportName).string();
    if (s.count != first.count)
      throw FormatError(where + ": shard " + std::to_string(s.index) + "/" + std::to_string(s.count) + ", but " +
                        (first.dir / kReportName).string() + " is shard " + std::to_string(first.index) + "/" +
                        std::to_string(first.count) + ": all shards must come from one series with the same N");
    if (const auto [it, inserted] = by_index.emplace(s.index, &s); !inserted)
      throw FormatError(where + ": shard " + std::to_string(s.index) + "/" + std::to_string(s.count) +
                        " is given twice (also " + it->second->dir.string() + ")");
    if (s.fingerprint != first.fingerprint || s.corpus_entries != first.corpus_entries)
      throw FormatError(where + ": built from a different corpus, seed or split than " +
                        (first.dir / kReportName).string() + " (corpus fingerprint " + s.fingerprint + " of " +
                        std::to_string(s.corpus_entries) + " entries vs " + first.fingerprint + " of " +
                        std::to_string(first.corpus_entries) + ")");
  }
  std::string missing;
  for (int k = 1; k <= first.count; ++k)
    if (!by_index.contains(k)) missing += (missing.empty() ? "" : ", ") + std::to_string(k) + "/" + std::to_string(first.count);
  if (!missing.empty())
    throw FormatError("shard" + std::string(missing.find(',') == std::string::npos ? " " : "s ") + missing +
                      " missing: merge needs all " + std::to_string(first.count) + " shard folders of the series");
  std::vector<Shard> ordered;
  for (const auto& [index, s] : by_index) ordered.push_back(*s);
  int64_t scanned = 0;
  for (const Shard& s : ordered) scanned += s.report["files"]["scanned"].get<int64_t>();
  if (scanned != first.corpus_entries)
    throw FormatError("the shards' reports account for " + std::to_string(scanned) + " scanned entries, but the "
                      "corpus has " + std::to_string(first.corpus_entries) + ": the shard folders are inconsistent");
  return ordered;
}

ShardSplit open_shard_split(const Shard& shard, const std::string& split) {
  ShardSplit s;
  s.path = shard.dir / (split + ".h5");
  std::error_code ec;
  if (!fs::is_regular_file(s.path, ec)) throw FormatError(s.path.string() + ": missing");
  const std::string where = s.path.string();
  s.file = h5::open_file(s.path);
  s.attributes = h5::read_attributes(s.file);
  const auto attribute = [&](const std::string& name) {
    const auto it = s.attributes.find(name);
    if (it == s.attributes.end()) throw FormatError(where + ": attribute '" + name + "' is missing");
    return it->second;
  };
  if (attribute("schema_version") != h5::AttributeValue{kSchemaVersion})
    throw FormatError(where + ": schema_version " + h5::to_string(attribute("schema_version")) +
                      ": this melforge-build merges shards of schema " + std::to_string(kSchemaVersion) +
                      " (whole clips) only; build the shards again with this melforge-build (older shards can be "
                      "merged by the melforge-build that wrote them)");
  if (attribute("split") != h5::AttributeValue{split})
    throw FormatError(where + ": its split attribute is " + h5::to_string(attribute("split")));
  if (attribute("shard_index") != h5::AttributeValue{int64_t{shard.index}} ||
      attribute("shard_count") != h5::AttributeValue{int64_t{shard.count}})
    throw FormatError(where + ": shard " + h5::to_string(attribute("shard_index")) + "/" +
                      h5::to_string(attribute("shard_count")) + ", but its build_report.json says " +
                      std::to_string(shard.index) + "/" + std::to_string(shard.count));
  s.frames = h5::open_dataset(s.file, "frames");
  if (h5::is_virtual(s.frames))
    throw FormatError(where + ": frames is a virtual dataset: a merged dataset is not a shard");
  s.dims = h5::dims(s.frames);
  if (s.dims.size() != 2) throw FormatError(where + ": frames has rank " + std::to_string(s.dims.size()) + ", not 2");
  s.chunk = h5::chunk_dims(s.frames);
  s.filters = h5::filters(s.frames);
  s.class_names = h5::read_strings(s.file, "class_names");
  s.label = h5::read_int32(s.file, "label");
  s.path_values = h5::read_strings(s.file, "path");
  if (h5::exists(s.file, "targets"))
    throw FormatError(where + ": holds a multi-label `targets` matrix; merging multi-label shards is not supported "
                      "yet: build a multi-label corpus without --shard");
  s.has_source_sample_rate = h5::exists(s.file, "source_sample_rate");
  if (s.has_source_sample_rate) s.source_sample_rate = h5::read_int32(s.file, "source_sample_rate");
  const auto files = s.label.size();
  if (s.path_values.size() != files)
    throw FormatError(where + ": label has " + std::to_string(files) + " entries but path " +
                      std::to_string(s.path_values.size()));
  if (s.has_source_sample_rate && s.source_sample_rate.size() != files)
    throw FormatError(where + ": source_sample_rate has " + std::to_string(s.source_sample_rate.size()) +
                      " entries for " + std::to_string(files) + " clips");
  s.clips = read_clip_columns(s.file, static_cast<int64_t>(files), s.dims[0], where);
  read_fold_group(s, files, where);
  s.augmented = read_recipe_columns(s.file, files, where, s.recipes);
  s.has_speed_speaker = h5::exists(s.file, kSpeedSpeakerDataset);
  if (s.has_speed_speaker) s.speed_speaker = h5::read_float(h5::open_dataset(s.file, kSpeedSpeakerDataset));
  if (s.has_speed_speaker && s.speed_speaker.size() != files)
    throw FormatError(where + ": " + kSpeedSpeakerDataset + " has " + std::to_string(s.speed_speaker.size()) +
                      " entries for " + std::to_string(files) + " clips");
  return s;
}

std::string shape_text(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

/// Throws FormatError when `s` disagrees with `ref` (the same split of the first shard) on anything a merged file
/// must have in common.
void check_agrees(const ShardSplit& s, const ShardSplit& ref) {
  const std::string here = s.path.string();
  const std::string there = ref.path.string();
  if (s.augmented != ref.augmented)
    throw FormatError(here + (s.augmented ? " was" : " was not") + " built with --augment-copies (it " +
                      (s.augmented ? "holds" : "lacks") + " the aug_* recipe datasets), " + there +
                      (ref.augmented ? " was" : " was not") + ": augmented and non-augmented shards cannot be "
                      "merged; build every shard with the same augmentation flags");
  if (s.has_speed_speaker != ref.has_speed_speaker)
    throw FormatError(here + (s.has_speed_speaker ? " was" : " was not") + " built with --speed-speakers (it " +
                      (s.has_speed_speaker ? "holds" : "lacks") + " the speed_speaker dataset and its classes), " +
                      there + (ref.has_speed_speaker ? " was" : " was not") + ": build every shard with the same "
                      "--speed-speakers");
  if (s.has_fold != ref.has_fold || s.has_group != ref.has_group)
    throw FormatError(here + " and " + there + " differ in their fold or group datasets: build every shard of one "
                      "corpus with the same --folds, --group-by and fold or group columns");
  const auto features = [](const ShardSplit& x) {
    const auto it = x.attributes.find("features");
    if (it == x.attributes.end()) return std::string("mel");
    const auto* text = std::get_if<std::string>(&it->second);
    return text != nullptr ? *text : h5::to_string(it->second);
  };
  if (features(s) != features(ref))
    throw FormatError(here + ": features " + features(s) + " but " + features(ref) + " in " + there +
                      ": mel and fbank shards cannot be merged; build every shard with the same --features");
  for (const auto& [name, value] : ref.attributes) {
    if (kPerShardAttributes.contains(name)) continue;
    const auto it = s.attributes.find(name);
    if (it == s.attributes.end()) throw FormatError(here + ": attribute '" + name + "' is missing (present in " + there + ")");
    if (it->second != value)
      throw FormatError(here + ": attribute '" + name + "' is " + h5::to_string(it->second) + " but " +
                        h5::to_string(value) + " in " + there);
  }
  for (const auto& [name, value] : s.attributes)
    if (!kPerShardAttributes.contains(name) && !ref.attributes.contains(name))
      throw FormatError(here + ": attribute '" + name + "' is not in " + there);
  if (s.attributes.at("melforge_version") != ref.attributes.at("melforge_version"))
    throw FormatError(here + ": written by melforge " + h5::to_string(s.attributes.at("melforge_version")) +
                      " but " + there + " by " + h5::to_string(ref.attributes.at("melforge_version")));
  if (s.class_names != ref.class_names) throw FormatError(here + ": class_names differ from " + there);
  if (s.dims[1] != ref.dims[1])
    throw FormatError(here + ": a frame has " + std::to_string(s.dims[1]) + " mel bands but " +
                      std::to_string(ref.dims[1]) + " in " + there);
  const h5::Datatype t = h5::dataset_type(s.frames);
  const h5::Datatype rt = h5::dataset_type(ref.frames);
  if (H5Tequal(t.id(), rt.id()) <= 0) throw FormatError(here + ": the element type of frames differs from " + there);
  if (s.chunk != ref.chunk || s.filters.shuffle != ref.filters.shuffle ||
      s.filters.deflate_level != ref.filters.deflate_level)
    throw FormatError(here + ": frames is stored with chunks " + shape_text(s.chunk) + ", deflate " +
                      std::to_string(s.filters.deflate_level) + ", shuffle " + (s.filters.shuffle ? "on" : "off") +
                      " but " + there + " with " + shape_text(ref.chunk) + ", deflate " +
                      std::to_string(ref.filters.deflate_level) + ", shuffle " + (ref.filters.shuffle ? "on" : "off"));
}

/// The root attributes of the merged file besides schema_version, split and melforge_version: the shards' common
/// ones, merged_shards and the merge's own `build_id`.
std::vector<Attribute> merged_attributes(const ShardSplit& ref, int shard_count, const std::string& build_id) {
  std::vector<Attribute> out;
  for (const auto& [name, value] : ref.attributes)
    if (!kPerShardAttributes.contains(name)) out.push_back({name, value});
  out.push_back({"merged_shards", int64_t{shard_count}});
  out.push_back({kBuildIdAttribute, build_id});
  return out;
}

/// `file` relative to the merged output folder (the report's record of each shard folder).
std::string relative_source(const fs::path& file, const fs::path& output) {
  return fs::weakly_canonical(file).lexically_relative(fs::weakly_canonical(output)).generic_string();
}

/// Puts the shard file `source` at `target` (in the staging folder's sources/) as a hard link, so that the merged
/// dataset holds its own sources; where a hard link is impossible (another file system, no hard links), copies it
/// and says so on stderr.
void place_source(const fs::path& source, const fs::path& target) {
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) throw IoError("cannot create '" + target.parent_path().string() + "': " + ec.message());
  fs::create_hard_link(source, target, ec);
  if (!ec) return;
  std::fprintf(stderr, "melforge-build merge: note: cannot hard-link %s into %s (%s); copying it instead\n",
               source.c_str(), target.parent_path().c_str(), ec.message().c_str());
  fs::copy_file(source, target, fs::copy_options::overwrite_existing, ec);
  if (ec) throw IoError("cannot copy '" + source.string() + "' to '" + target.string() + "': " + ec.message());
}

/// The end `last` of the clips [first, last) of `p` whose frames fit in `bytes` bytes at `frame_bytes` each (at
/// least one clip).
int64_t clips_within(const ShardSplit& p, int64_t first, int64_t frame_bytes, int64_t bytes) {
  const auto at = [&p](int64_t i) { return p.clips.frame_offset[static_cast<size_t>(i)]; };
  const auto clips = static_cast<int64_t>(p.clips.size());
  int64_t last = first + 1;
  while (last < clips && (at(last + 1) - at(first)) * frame_bytes <= bytes) ++last;
  return last;
}

/// Copies the frames of `parts` in shard order through a SplitWriter of `wc` (chunks cut as an unsharded build cuts
/// them), a run of whole clips of at most kCopyBatchBytes at a time. Returns the compressed bytes written.
int64_t copy_frames(const std::vector<ShardSplit>& parts, SplitWriterConfig wc, mel::DType dtype) {
  SplitWriter writer(std::move(wc));
  const int64_t frame_bytes = (dtype == mel::DType::float16 ? 2 : 4) * parts.front().dims[1];
  h5::Datatype f16 = h5::float16_type();
  const hid_t mem_type = dtype == mel::DType::float16 ? f16.id() : H5T_NATIVE_FLOAT;
  std::vector<unsigned char> buffer;
  for (const ShardSplit& p : parts) {
    const auto clips = static_cast<int64_t>(p.clips.size());
    for (int64_t first = 0; first < clips;) {
      const int64_t last = clips_within(p, first, frame_bytes, kCopyBatchBytes);
      const int64_t frame0 = p.clips.frame_offset[static_cast<size_t>(first)];
      const int64_t frames = p.clips.frame_offset[static_cast<size_t>(last)] - frame0;
      buffer.resize(static_cast<size_t>(frames * frame_bytes));
      h5::read_rows(p.frames, frame0, frames, mem_type, buffer.data());
      std::vector<FileRecord> records;
      for (int64_t i = first; i < last; ++i) {
        const auto k = static_cast<size_t>(i);
        records.push_back({p.label[k], p.path_values[k], p.clips.frame_offset[k + 1] - p.clips.frame_offset[k],
                           p.clips.num_samples[k], p.clips.clip_flags[k],
                           p.has_source_sample_rate ? p.source_sample_rate[k] : 0, {},
                           p.augmented ? p.recipes.row(k) : RowRecipe{}, p.has_fold ? p.fold[k] : 0,
                           p.has_group ? p.group[k] : std::string(),
                           p.has_speed_speaker ? p.speed_speaker[k] : 1.0f});
      }
      writer.append(buffer.data(), records);
      first = last;
    }
  }
  writer.finish();
  return writer.bytes_written();
}

/// Writes one merged split file at `target` (in the staging folder): the metadata concatenated in shard order
/// (frame_offset rebased), and frames either as a virtual dataset (one block per shard with frames, each shard's
/// file placed as sources/<split>-<K>of<N>.h5 beside `target` (place_source) and appended to `sources`) or copied
/// through SplitWriter. Returns the compressed bytes of frames written (0 for a virtual frames).
int64_t write_split(const std::vector<ShardSplit>& parts, const std::string& split, const fs::path& target,
                    const std::string& build_id, const MergeOptions& options, std::vector<fs::path>& sources) {
  const ShardSplit& ref = parts.front();
  const int shard_count = static_cast<int>(parts.size());
  std::vector<int32_t> labels, rates;
  std::vector<std::string> paths, groups;
  std::vector<int32_t> folds;
  std::vector<float> speed_speaker;
  ClipColumns clips;
  RecipeColumns recipes;
  bool have_rates = true;
  for (const ShardSplit& p : parts) {
    for (std::size_t i = 0; i < p.recipes.size(); ++i) recipes.push(p.recipes.row(i));
    labels.insert(labels.end(), p.label.begin(), p.label.end());
    clips.append(p.clips);
    rates.insert(rates.end(), p.source_sample_rate.begin(), p.source_sample_rate.end());
    have_rates = have_rates && p.has_source_sample_rate;
    paths.insert(paths.end(), p.path_values.begin(), p.path_values.end());
    folds.insert(folds.end(), p.fold.begin(), p.fold.end());
    groups.insert(groups.end(), p.group.begin(), p.group.end());
    speed_speaker.insert(speed_speaker.end(), p.speed_speaker.begin(), p.speed_speaker.end());
  }
  const int64_t n_mels = ref.dims[1];
  const mel::DType dtype =
      H5Tget_size(h5::dataset_type(ref.frames).id()) == 2 ? mel::DType::float16 : mel::DType::float32;
  const int64_t frames_per_chunk = ref.chunk.empty() ? 1 : ref.chunk[0];

  if (options.copy) {
    SplitWriterConfig wc;
    wc.final_path = target;
    wc.split = split;
    wc.n_mels = n_mels;
    wc.dtype = dtype;
    wc.compression_level = ref.filters.deflate_level;
    wc.shuffle = ref.filters.shuffle;
    wc.frames_per_chunk = frames_per_chunk;
    wc.threads = options.threads;
    wc.class_names = ref.class_names;
    wc.attributes = merged_attributes(ref, shard_count, build_id);
    wc.source_sample_rate = have_rates;
    wc.augmented = ref.augmented;
    wc.folds = ref.has_fold;
    wc.groups = ref.has_group;
    wc.speed_speakers = ref.has_speed_speaker;
    return copy_frames(parts, std::move(wc), dtype);
  }

  const fs::path partial = target.string() + ".partial";
  try {
    h5::File file = h5::create_file(partial);
    if (clips.total_frames() == 0) {
      create_frames_dataset(file, n_mels, dtype, frames_per_chunk, ref.filters.shuffle, ref.filters.deflate_level)
          .close();
    } else {
      std::vector<h5::VirtualBlock> blocks;
      int64_t first = 0;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        const ShardSplit& p = parts[k];
        if (p.dims[0] > 0) {
          const std::string name = std::string(kSourcesName) + "/" + split + "-" + std::to_string(k + 1) + "of" +
                                   std::to_string(parts.size()) + ".h5";
          place_source(p.path, target.parent_path() / name);
          sources.push_back(target.parent_path() / name);
          blocks.push_back({name, "/frames", first, p.dims[0]});
        }
        first += p.dims[0];
      }
      const h5::Datatype type = h5::dataset_type(ref.frames);
      h5::create_virtual_dataset(file, "frames", type.id(), {clips.total_frames(), n_mels}, blocks, std::nan(""))
          .close();
    }
    write_split_metadata(file, split, ref.class_names, merged_attributes(ref, shard_count, build_id), labels, paths,
                         clips,
                         have_rates ? &rates : nullptr);
    if (ref.augmented) write_recipe_columns(file, recipes);
    write_fold_group(file, ref.has_fold ? &folds : nullptr, ref.has_group ? &groups : nullptr);
    if (ref.has_speed_speaker) h5::write_float32(file, kSpeedSpeakerDataset, speed_speaker);
    file.close();
    std::error_code ec;
    fs::rename(partial, target, ec);
    if (ec) throw IoError("cannot rename " + partial.string() + " to " + target.string() + ": " + ec.message());
  } catch (...) {
    std::error_code ec;
    fs::remove(partial, ec);
    throw;
  }
  return 0;
}

/// Adds every number of `from` into `into`, recursively through objects (the count tables of the reports).
void add_numbers(json& into, const json& from) {
  for (const auto& [key, value] : from.items()) {
    if (value.is_object()) {
      add_numbers(into[key], value);
    } else if (value.is_number_integer()) {
      into[key] = (into.contains(key) ? into[key].get<int64_t>() : 0) + value.get<int64_t>();
    } else if (value.is_number()) {
      into[key] = (into.contains(key) ? into[key].get<double>() : 0.0) + value.get<double>();
    }
  }
}

/// The distinct engines of the shards' reports in shard order, joined by " + " ("cpu-fftw + cuda-cufft"), so that a
/// merged dataset whose shards were computed by different engines says so.
std::string shard_engines(const std::vector<Shard>& shards) {
  std::vector<std::string> engines;
  for (const Shard& s : shards) {
    const std::string engine = s.report.value("engine", "");
    if (std::find(engines.begin(), engines.end(), engine) == engines.end()) engines.push_back(engine);
  }
  std::string joined;
  for (const auto& e : engines) joined += (joined.empty() ? "" : " + ") + e;
  return joined;
}

/// The merged report's "augmentation": the first shard's settings and banks, the copies written and skipped summed.
json merged_augmentation(const std::vector<Shard>& shards) {
  json copies = json::object();
  int64_t skipped_copies = 0;
  for (const Shard& s : shards) {
    const json a = s.report.value("augmentation", json::object());
    add_numbers(copies, a.value("copies", json::object()));
    skipped_copies += a.value("skipped_copies", int64_t{0});
  }
  json merged = shards.front().report["augmentation"];
  merged["copies"] = copies;
  merged["skipped_copies"] = skipped_copies;
  return merged;
}

/// The merged report's "speed_speakers": the first shard's factors and classes, the rows, utterances and seconds
/// added summed over the shards (in all and per factor).
json merged_speed_speakers(const std::vector<Shard>& shards) {
  json merged = shards.front().report["speed_speakers"];
  json added = json::object();
  for (const Shard& s : shards) {
    json part = s.report.value("speed_speakers", json::object());
    for (const char* kept : {"factors", "original_classes", "classes_added"}) part.erase(kept);
    for (auto& [factor, figures] : part["per_factor"].items()) figures.erase("classes_added");
    add_numbers(added, part);
  }
  for (const char* key : {"rows_added", "utterances_added", "seconds_added"}) merged[key] = added.value(key, json(0));
  const json per_factor = added.value("per_factor", json::object());
  for (auto& [factor, figures] : merged["per_factor"].items()) {
    const json sums = per_factor.value(factor, json::object());
    for (const char* key : {"rows_added", "utterances_added", "seconds_added"}) figures[key] = sums.value(key, json(0));
  }
  return merged;
}

json merged_report(const std::vector<Shard>& shards, const MergeOptions& options, int64_t mel_bytes, double seconds,
                   const std::string& build_id) {
  const json& first = shards.front().report;
  json r;
  r["melforge_version"] = MELFORGE_VERSION;
  r["build_id"] = build_id;
  r["engine"] = shard_engines(shards);
  r["config"] = first.value("config", json::object());
  r["config"]["output"] = options.output.string();
  r["classes"] = first.value("classes", json::array());
  json counts = json::object();
  json files = json::object();
  json totals = json::object();
  json skipped = json::array();
  json shard_list = json::array();
  json clip_totals = json::object();
  for (const Shard& s : shards) {
    add_numbers(counts, s.report.value("counts", json::object()));
    add_numbers(files, s.report.value("files", json::object()));
    json t;
    for (const char* key : {"audio_seconds", "dropped_seconds", "batches", "frame_bytes_compressed"})
      t[key] = s.report.value(key, json(0));
    json c = s.report.value("clips", json::object());
    c.erase("stored_fraction");
    add_numbers(clip_totals, c);
    add_numbers(totals, t);
    for (const auto& e : s.report.value("skipped", json::array())) skipped.push_back(e);
    shard_list.push_back({{"index", s.index},
                          {"folder", relative_source(s.dir, options.output)},
                          {"engine", s.report.value("engine", "")},
                          {"total_s", s.report.value("total_s", 0.0)}});
  }
  r["counts"] = counts;
  r["files"] = files;
  const double seconds_in = clip_totals.value("seconds_in", 0.0);
  clip_totals["stored_fraction"] =
      seconds_in > 0 ? json(clip_totals.value("seconds_stored", 0.0) / seconds_in) : json();
  r["clips"] = clip_totals;
  if (first.contains("augmentation")) r["augmentation"] = merged_augmentation(shards);
  if (first.contains("speed_speakers")) r["speed_speakers"] = merged_speed_speakers(shards);
  if (first.contains("protocol")) r["protocol"] = first["protocol"];
  r["skipped"] = skipped;
  for (const auto& [key, value] : totals.items()) r[key] = value;
  if (options.copy) r["frame_bytes_compressed"] = mel_bytes;
  r["merge"] = {{"mode", options.copy ? "copy" : "virtual"},
                {"shard_count", shards.front().count},
                {"corpus_fingerprint", shards.front().fingerprint},
                {"shards", shard_list},
                {"seconds", seconds}};
  r["total_s"] = seconds;
  return r;
}

}  // namespace

void MergeOptions::validate() const {
  if (shards.empty())
    throw InvalidArgument("give the shard folders to merge: melforge-build merge --output DIR SHARD_DIR...");
  check_output_folder(output, overwrite, "--output");
  if (threads < 0) throw InvalidArgument("--threads must be >= 0 (0: all cores)");
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(output, ec);
  std::set<fs::path> seen;
  for (const auto& d : shards) {
    if (!fs::is_directory(d, ec)) throw InvalidArgument("shard folder '" + d.string() + "' is not a folder");
    const fs::path c = fs::weakly_canonical(d, ec);
    if (!seen.insert(c).second) throw InvalidArgument("shard folder '" + d.string() + "' is given twice");
    if (c == out) throw InvalidArgument("--output '" + output.string() + "' is one of the shard folders");
  }
}

void add_options(po::options_description& desc, MergeOptions& o) {
  desc.add_options()
    ("output", po::value<fs::path>(&o.output), "output folder for the merged train.h5, val.h5, test.h5")
    ("copy", po::bool_switch(&o.copy),
     "recompress the spectrograms into the merged files instead of virtual datasets over the shard files (which "
     "merge hard-links, or copies, into --output's sources/ folder, so that the merged folder holds all it reads)")
    ("overwrite", po::bool_switch(&o.overwrite), "replace existing outputs in --output")
    ("threads", po::value<int>(&o.threads)->default_value(o.threads),
     "threads that recompress with --copy (0: all cores)")
    ("shards", po::value<std::vector<fs::path>>(&o.shards)->composing(),
     "shard output folders (positional: SHARD_DIR...)");
}

/// The trial list the shards carry (OUT/trials.txt of a layout build such as voxceleb1), staged as the merge's own
/// when every shard has the same one; nothing when none has one. FormatError naming the shard when only some have one
/// or two differ.
std::vector<fs::path> stage_shard_trials(const std::vector<Shard>& shards, const fs::path& staging) {
  std::vector<std::string> texts;
  for (const Shard& s : shards) {
    const fs::path list = s.dir / kTrialsName;
    std::error_code ec;
    texts.push_back(fs::exists(list, ec) ? read_regular_file(list, "trial list", std::uintmax_t{256} << 20) : "");
    if (texts.back() != texts.front())
      throw FormatError("shard " + s.dir.string() + ": its " + kTrialsName + " differs from that of shard " +
                        shards.front().dir.string() + " (or only one of them has one): shards of one build carry "
                        "the same trial list");
  }
  if (texts.front().empty()) return {};
  write_file_atomically(staging / kTrialsName, texts.front());
  return {staging / kTrialsName};
}

json run_merge(const MergeOptions& options) {
  options.validate();
  const Stopwatch watch;
  const std::vector<Shard> shards = read_series(options.shards);
  std::vector<std::vector<ShardSplit>> splits;
  for (const std::string& split : kSplitNames) {
    std::vector<ShardSplit> parts;
    for (const Shard& s : shards) {
      parts.push_back(open_shard_split(s, split));
      check_agrees(parts.back(), parts.front());
    }
    if (!splits.empty()) {
      const ShardSplit& other = splits.front().front();
      if (parts.front().class_names != other.class_names)
        throw FormatError(parts.front().path.string() + ": class_names differ from " + other.path.string());
    }
    splits.push_back(std::move(parts));
  }

  OutputFolder output(options.output);
  const fs::path staging = output.fresh_staging();
  std::vector<std::string> identity = {"merge", options.copy ? "copy" : "virtual", shards.front().fingerprint};
  for (const auto& parts : splits)
    for (const ShardSplit& p : parts) {
      const auto id = p.attributes.find(kBuildIdAttribute);
      identity.push_back(p.path.filename().string() + "=" +
                         (id == p.attributes.end() ? "none" : h5::to_string(id->second)) + " " +
                         std::to_string(p.dims[0]) + " " + std::to_string(p.label.size()));
    }
  const std::string build_id = identity_hash(identity);
  std::vector<fs::path> staged, sources;
  int64_t mel_bytes = 0;
  for (size_t i = 0; i < kSplitNames.size(); ++i) {
    staged.push_back(staging / (kSplitNames[i] + ".h5"));
    mel_bytes += write_split(splits[i], kSplitNames[i], staged.back(), build_id, options, sources);
  }
  splits.clear();
  staged.insert(staged.begin(), sources.begin(), sources.end());
  const std::vector<fs::path> trials = stage_shard_trials(shards, staging);
  staged.insert(staged.end(), trials.begin(), trials.end());
  json report = merged_report(shards, options, mel_bytes, watch.seconds(), build_id);
  output.install(staged, report);
  return report;
}

}  // namespace melforge::builder
