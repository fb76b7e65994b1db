#include "plan.h"

#include <cstdio>
#include <set>

#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "melforge/common/progress.h"
#include "split.h"
#include "stop.h"

namespace melforge::builder {

namespace {

/// Whether probe_files reads the header of scan.files[i].
bool probed(const BuildState& state, int64_t i) {
  return state.config.segment.num_long <= 0 || (i >= state.files_range.first && i < state.files_range.second);
}

}  // namespace

void skip_file(std::vector<SkippedFile>& skipped, bool strict, SkippedFile file) {
  if (strict) throw StrictError("--strict: " + file.path + ": " + file.reason);
  skipped.push_back(std::move(file));
}

void scan_corpus(BuildState& state) {
  const BuildOptions& bo = state.config.build;
  state.scan = bo.input.empty() ? scan_manifest(bo.manifest) : scan_folder(bo.input, bo.extension_list());
}

void accept_scan(BuildState& state, std::pair<int64_t, int64_t> skipped) {
  const BuildOptions& bo = state.config.build;
  for (int64_t j = skipped.first; j < skipped.second; ++j)
    skip_file(state.skipped, bo.strict, state.scan.skipped[static_cast<std::size_t>(j)]);
  if (state.scan.files.empty())
    throw InvalidArgument("no audio files found in " + (bo.input.empty() ? bo.manifest : bo.input).string());
}

void select_shard(BuildState& state) {
  const ShardSpec shard = state.config.build.shard_spec();
  state.files_range = shard_range(static_cast<int64_t>(state.scan.files.size()), shard);
  state.skipped_range = shard_range(static_cast<int64_t>(state.scan.skipped.size()), shard);
  state.scanned = (state.files_range.second - state.files_range.first) +
                  (state.skipped_range.second - state.skipped_range.first);
  accept_scan(state, state.skipped_range);
}

void label_files(BuildState& state) {
  std::set<std::string> labels;
  for (const auto& f : state.scan.files) labels.insert(f.label);
  state.class_names.assign(labels.begin(), labels.end());
  state.class_index.clear();
  for (std::size_t i = 0; i < state.class_names.size(); ++i)
    state.class_index[state.class_names[i]] = static_cast<int32_t>(i);
  assign_splits(state.scan.files, state.config.build.split_ratios(), state.config.build.seed);
}

void probe_files(BuildState& state, bool show_progress) {
  const auto n = static_cast<int64_t>(state.scan.files.size());
  state.planned.assign(static_cast<std::size_t>(n), {});
  state.probe_error.assign(static_cast<std::size_t>(n), {});
  Progress progress("probe", n, "files", state.config.build.quiet || !show_progress);
  parallel_for(n, state.threads, [&](int64_t i) {
    PlannedFile& p = state.planned[static_cast<std::size_t>(i)];
    p.input = &state.scan.files[static_cast<std::size_t>(i)];
    if (!probed(state, i)) {
      progress.advance();
      return;
    }
    check_stop();
    try {
      p.info = audio::probe(p.input->path);
      p.frames = audio::output_frames(p.info, state.sample_rate);
    } catch (const AudioError& e) {
      state.probe_error[static_cast<std::size_t>(i)] = e.what();
    }
    progress.advance();
  }, 16);
}

void plan_segments(BuildState& state) {
  const BuildConfig& c = state.config;
  const int sr = state.sample_rate;
  std::vector<int64_t> lengths;
  for (std::size_t i = 0; i < state.planned.size(); ++i)
    if (probed(state, static_cast<int64_t>(i)) && state.probe_error[i].empty())
      lengths.push_back(state.planned[i].frames);
  state.num_long = segment::resolve_num_long(lengths, c.segment, sr);
  state.num_short = c.segment.num_short(sr);
  state.usable.clear();
  const auto [first, last] = state.files_range;
  for (auto i = static_cast<std::size_t>(first); i < static_cast<std::size_t>(last); ++i) {
    const InputFile& in = state.scan.files[i];
    if (!state.probe_error[i].empty()) {
      skip_file(state.skipped, c.build.strict, {in.rel_path, state.probe_error[i], "probe"});
      continue;
    }
    PlannedFile& p = state.planned[i];
    p.plan = segment::plan_file(p.frames, c.segment, sr, state.num_long);
    if (!p.plan.skip_reason.empty()) {
      skip_file(state.skipped, c.build.strict, {in.rel_path, in.path.string() + ": " + p.plan.skip_reason, "segment"});
      continue;
    }
    state.usable.push_back(p);
  }
}

std::string corpus_fingerprint(const ScanResult& scan) {
  uint64_t h = 0xCBF29CE484222325ULL;
  const auto mix = [&h](const std::string& text) {
    for (const unsigned char c : text) {
      h ^= c;
      h *= 0x100000001B3ULL;
    }
    h ^= 0xFF;
    h *= 0x100000001B3ULL;
  };
  for (const auto& f : scan.files) {
    mix(f.rel_path);
    mix(f.label);
    mix(std::to_string(f.split));
  }
  for (const auto& f : scan.skipped) mix(f.path);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace melforge::builder
