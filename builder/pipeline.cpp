#include "pipeline.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include "featurize/featurize.h"
#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/parallel.h"
#include "melforge/common/progress.h"
#include "melforge/common/timing.h"
#include "output_folder.h"
#include "report.h"
#include "scan.h"
#include "split.h"

namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

/// Signal number given to request_stop(), -1 for a request without one, 0 while none was made.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

/// A file that passed scan and probe, with its plan.
struct PlannedFile {
  const InputFile* input = nullptr;
  audio::AudioInfo info;
  int64_t frames = 0;
  segment::FilePlan plan;
};

/// Root attributes describing every parameter of the build.
std::vector<Attribute> dataset_attributes(const BuildConfig& c, int num_long, int num_short, int n_frames) {
  const auto& m = c.mel;
  const auto& s = c.segment;
  return {
      {"sample_rate", int64_t{m.sample_rate}},
      {"n_fft", int64_t{m.n_fft}},
      {"win_length", int64_t{m.win()}},
      {"hop_length", int64_t{m.hop()}},
      {"window", mel::to_string(m.window)},
      {"center", int64_t{m.center ? 1 : 0}},
      {"pad_mode", mel::to_string(m.pad_mode)},
      {"power", double{m.power}},
      {"n_mels", int64_t{m.n_mels}},
      {"f_min", double{m.f_min}},
      {"f_max", double{m.fmax()}},
      {"mel_scale", mel::to_string(m.mel_scale)},
      {"mel_norm", mel::to_string(m.mel_norm)},
      {"log", mel::to_string(m.log)},
      {"amin", double{m.amin}},
      {"log_eps", double{m.log_eps}},
      {"dtype", mel::to_string(c.build.dtype)},
      {"long_seconds", s.long_seconds},
      {"short_seconds", s.short_seconds},
      {"long_samples", s.long_samples(m.sample_rate)},
      {"short_samples", s.short_samples(m.sample_rate)},
      {"num_long", int64_t{num_long}},
      {"num_short", int64_t{num_short}},
      {"n_frames", int64_t{n_frames}},
      {"short_files", segment::to_string(s.short_files)},
      {"channel", int64_t{c.decode.channel}},
  };
}

/// Runs writer tasks in order on one background thread, so that compressing and writing one batch overlaps the
/// decoding and mel computation of the next. At most one task is in flight: post() waits for the previous one.
/// With `background` false (--threads 1, so that a build uses one core) post() runs the task itself, at once.
class WriteQueue {
 public:
  explicit WriteQueue(bool background) {
    if (background) thread_ = std::thread([this] { loop(); });
  }
  ~WriteQueue() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  /// Waits for the previous task (rethrowing its error), then starts `task` (runs it, without a background thread).
  void post(std::function<void()> task) {
    wait();
    if (!thread_.joinable()) {
      task();
      return;
    }
    {
      std::lock_guard lock(mutex_);
      task_ = std::move(task);
    }
    cv_.notify_all();
  }
  /// Waits until no task is in flight; rethrows the error of the last task, if any.
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return !task_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || task_; });
      if (!task_) return;
      lock.unlock();
      std::exception_ptr error;
      try {
        task_();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      task_ = nullptr;
      error_ = error;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

/// Records a skipped file, or throws StrictError under --strict.
void skip(std::vector<SkippedFile>& skipped, bool strict, SkippedFile f) {
  if (strict) throw StrictError("--strict: " + f.path + ": " + f.reason);
  skipped.push_back(std::move(f));
}

/// FNV-1a (64 bit, hex) over every scanned audio file's path, label and split and every skipped entry's path, in
/// scan order: shards of one build agree on it, shards of different corpora, seeds or split ratios do not.
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

/// batch_file_bytes of `f`.
int64_t batch_bytes(const PlannedFile& f, int64_t out_bytes_per_file) {
  return batch_file_bytes(f.plan.arena_samples, out_bytes_per_file);
}

}  // namespace

int64_t batch_file_bytes(int64_t arena_samples, int64_t out_bytes_per_file) {
  return arena_samples * static_cast<int64_t>(sizeof(float)) + 2 * out_bytes_per_file;
}

int64_t batch_budget(int64_t max_ram, int threads, int64_t largest_decode) {
  const int64_t reserve = (int64_t{64} << 20) + int64_t{threads} * largest_decode;
  return std::min(std::max<int64_t>(max_ram - reserve, 1), kPipelineBatchBytes);
}

void request_stop(int signal) { g_stop_signal.store(signal > 0 ? signal : -1, std::memory_order_relaxed); }

void check_stop() {
  const int sig = g_stop_signal.load(std::memory_order_relaxed);
  if (sig == 0) return;
  const std::string name = sig == SIGINT    ? "SIGINT"
                           : sig == SIGTERM ? "SIGTERM"
                           : sig > 0        ? "signal " + std::to_string(sig)
                                            : "a stop request";
  throw Interrupted("interrupted by " + name, std::max(sig, 0));
}

BuildResult run_build(const BuildConfig& config) {
  config.validate();
  if (config.build.device == mel::Device::cuda) {
    if (const mel::EnginePlan plan = mel::choose_engines(config.build.device); !plan.error.empty())
      throw CudaError(plan.error);
  }
  const auto& bo = config.build;
  const auto& mel_args = config.mel;
  const int sr = mel_args.sample_rate;
  const int threads = resolve_threads(bo.threads);
  const auto ratios = bo.split_ratios();
  const int64_t max_ram = bo.max_ram_bytes();
  audio::DecodeOptions decode_options = config.decode;
  decode_options.sample_rate = sr;

  Stopwatch total;
  StageTimes times;
  std::vector<SkippedFile> skipped;
  OutputFolder output(bo.output);

  ScanResult scan;
  {
    ScopedStage stage(times, "scan");
    scan = bo.input.empty() ? scan_manifest(bo.manifest) : scan_folder(bo.input, bo.extension_list());
  }
  const ShardSpec shard = bo.shard_spec();
  const auto [file_first, file_last] = shard_range(static_cast<int64_t>(scan.files.size()), shard);
  const auto [skip_first, skip_last] = shard_range(static_cast<int64_t>(scan.skipped.size()), shard);
  const int64_t scanned = (file_last - file_first) + (skip_last - skip_first);
  for (int64_t j = skip_first; j < skip_last; ++j) skip(skipped, bo.strict, scan.skipped[static_cast<size_t>(j)]);
  if (scan.files.empty()) throw InvalidArgument("no audio files found in " + (bo.input.empty() ? bo.manifest : bo.input).string());

  std::vector<std::string> class_names;
  {
    std::set<std::string> labels;
    for (const auto& f : scan.files) labels.insert(f.label);
    class_names.assign(labels.begin(), labels.end());
  }
  std::map<std::string, int32_t> class_index;
  for (std::size_t i = 0; i < class_names.size(); ++i) class_index[class_names[i]] = static_cast<int32_t>(i);
  assign_splits(scan.files, ratios, bo.seed);

  const bool probe_all = config.segment.num_long <= 0;
  const auto probed = [&, first = file_first, last = file_last](int64_t i) {
    return probe_all || (i >= first && i < last);
  };
  std::vector<PlannedFile> planned(scan.files.size());
  std::vector<std::string> probe_error(scan.files.size());
  {
    ScopedStage stage(times, "probe");
    Progress progress("probe", static_cast<int64_t>(scan.files.size()), "files", bo.quiet);
    parallel_for(static_cast<int64_t>(scan.files.size()), threads, [&](int64_t i) {
      planned[i].input = &scan.files[i];
      if (!probed(i)) {
        progress.advance();
        return;
      }
      check_stop();
      try {
        planned[i].info = audio::probe(scan.files[i].path);
        planned[i].frames = audio::output_frames(planned[i].info, sr);
      } catch (const AudioError& e) {
        probe_error[i] = e.what();
      }
      progress.advance();
    }, 16);
  }

  std::vector<int64_t> lengths;
  for (std::size_t i = 0; i < planned.size(); ++i)
    if (probed(static_cast<int64_t>(i)) && probe_error[i].empty()) lengths.push_back(planned[i].frames);
  const int num_long = segment::resolve_num_long(lengths, config.segment, sr);
  const int num_short = config.segment.num_short(sr);
  const int64_t L = config.segment.long_samples(sr);
  const int64_t S = config.segment.short_samples(sr);

  BuildStats stats;
  std::vector<PlannedFile> usable;
  for (auto i = static_cast<std::size_t>(file_first); i < static_cast<std::size_t>(file_last); ++i) {
    const auto& in = scan.files[i];
    if (!probe_error[i].empty()) {
      skip(skipped, bo.strict, {in.rel_path, probe_error[i], "probe"});
      continue;
    }
    planned[i].plan = segment::plan_file(planned[i].frames, config.segment, sr, num_long);
    if (!planned[i].plan.skip_reason.empty()) {
      skip(skipped, bo.strict, {in.rel_path, in.path.string() + ": " + planned[i].plan.skip_reason, "segment"});
      continue;
    }
    usable.push_back(planned[i]);
  }

  mel::EngineConfig engine_config;
  engine_config.mel = mel_args;
  engine_config.segment_samples = S;
  engine_config.dtype = bo.dtype;
  engine_config.threads = threads;
  engine_config.device_batch = bo.device_batch;
  std::unique_ptr<mel::MelEngine> engine;
  mel::EnginePlan engine_plan;
  {
    ScopedStage stage(times, "engine_init");
    engine = mel::make_engine(bo.device, engine_config, &engine_plan);
  }
  if (const std::string line = engine_choice_message(bo.device, engine_plan, engine->name()); !line.empty())
    std::fprintf(stderr, "melforge-build: %s\n", line.c_str());
  const mel::MelLayout layout = engine->layout();
  const int64_t segs_per_file = static_cast<int64_t>(num_long) * num_short;
  const int64_t out_bytes_per_file = segs_per_file * layout.out_bytes_per_segment();
  const float silence = mel::silence_value(mel_args);

  const fs::path staging = output.fresh_staging();

  int64_t largest_decode = 0;
  for (const auto& f : usable)
    largest_decode = std::max(largest_decode, audio::decode_bytes(f.info, decode_options, f.plan.arena_samples));
  const int64_t budget = batch_budget(max_ram, threads, largest_decode);

  std::vector<std::map<std::string, int64_t>> counts(kSplitNames.size());
  for (auto& c : counts)
    for (const auto& name : class_names) c[name] = 0;

  double h5_compress_s = 0;
  double h5_write_s = 0;
  int64_t h5_bytes = 0;
  std::vector<float> arena;
  std::array<std::vector<uint8_t>, 2> out_buffers;
  int out_slot = 0;
  std::vector<uint8_t> compact;
  std::vector<int64_t> file_offsets;
  std::vector<int> file_valid_long;
  const featurize::BatchLayout batch_layout{num_long, num_short, L, S};
  std::vector<fs::path> staged;
  std::vector<std::unique_ptr<SplitWriter>> writers;
  WriteQueue write_queue(threads > 1);

  for (std::size_t split = 0; split < kSplitNames.size(); ++split) {
    std::vector<const PlannedFile*> files;
    for (const auto& f : usable)
      if (f.input->split == static_cast<int>(split)) files.push_back(&f);

    SplitWriterConfig wc;
    wc.final_path = staging / (kSplitNames[split] + ".h5");
    wc.split = kSplitNames[split];
    wc.file_shape = {num_long, num_short, layout.n_mels, layout.n_frames};
    wc.dtype = bo.dtype;
    wc.compression_level = bo.compression_level;
    wc.shuffle = bo.shuffle;
    wc.files_per_chunk = bo.files_per_chunk;
    wc.threads = threads;
    wc.class_names = class_names;
    wc.attributes = dataset_attributes(config, num_long, num_short, layout.n_frames);
    if (shard.sharded()) {
      wc.attributes.push_back({"shard_index", int64_t{shard.index}});
      wc.attributes.push_back({"shard_count", int64_t{shard.count}});
    }
    writers.push_back(std::make_unique<SplitWriter>(wc));
    SplitWriter& writer = *writers.back();

    Progress progress(kSplitNames[split], static_cast<int64_t>(files.size()), "files", bo.quiet);
    std::size_t next = 0;
    while (next < files.size()) {
      std::size_t end = next;
      int64_t bytes = 0;
      do {
        bytes += batch_bytes(*files[end], out_bytes_per_file);
        ++end;
      } while (end < files.size() && bytes + batch_bytes(*files[end], out_bytes_per_file) <= budget);
      const std::size_t n = end - next;
      stats.batches++;

      std::vector<int64_t> arena_offset(n + 1, 0);
      for (std::size_t i = 0; i < n; ++i) arena_offset[i + 1] = arena_offset[i] + files[next + i]->plan.arena_samples;
      std::vector<std::string> decode_error(n);
      std::vector<int64_t> decoded_frames(n, 0);
      {
        ScopedStage stage(times, "decode");
        arena.assign(static_cast<std::size_t>(arena_offset[n]), 0.0f);
        parallel_for(static_cast<int64_t>(n), threads, [&](int64_t i) {
          const PlannedFile& f = *files[next + i];
          check_stop();
          try {
            audio::DecodedAudio a = audio::decode(f.input->path, decode_options, f.plan.arena_samples);
            const int64_t take = std::min<int64_t>(static_cast<int64_t>(a.samples.size()), f.plan.arena_samples);
            std::memcpy(arena.data() + arena_offset[i], a.samples.data(), static_cast<std::size_t>(take) * sizeof(float));
            decoded_frames[i] = take < f.plan.arena_samples ? take : std::max(take, f.frames);
          } catch (const AudioError& e) {
            decode_error[i] = e.what();
          }
          progress.advance();
        });
      }

      std::vector<FileRecord> records;
      std::vector<std::size_t> kept;
      for (std::size_t i = 0; i < n; ++i) {
        const PlannedFile& f = *files[next + i];
        if (!decode_error[i].empty()) {
          skip(skipped, bo.strict, {f.input->rel_path, decode_error[i], "decode"});
          continue;
        }
        kept.push_back(i);
        records.push_back({class_index.at(f.input->label), f.input->rel_path, f.plan.num_valid_long});
        counts[split][f.input->label]++;
        stats.add_file(f.info, f.plan, decoded_frames[i], sr);
        if (f.plan.num_valid_long < num_long) stats.partial++;
      }

      file_offsets.clear();
      file_valid_long.clear();
      for (std::size_t i : kept) {
        file_offsets.push_back(arena_offset[i]);
        file_valid_long.push_back(files[next + i]->plan.num_valid_long);
      }
      std::vector<uint8_t>& out = out_buffers[out_slot];
      out_slot ^= 1;
      out.resize(static_cast<std::size_t>(records.size() * out_bytes_per_file));
      check_stop();
      {
        ScopedStage stage(times, "mel");
        featurize::compute_files(*engine, arena.data(), file_offsets, file_valid_long, batch_layout, bo.dtype, silence,
                                 out.data(), compact);
      }
      stats.segments += std::accumulate(file_valid_long.begin(), file_valid_long.end(), int64_t{0}) * num_short;
      {
        ScopedStage stage(times, "write_wait");
        write_queue.post([&writer, &out, records = std::move(records)] { writer.append(out.data(), records); });
      }
      next = end;
    }
    progress.finish();
    {
      ScopedStage stage(times, "write_wait");
      write_queue.post([&writer] { writer.finish(); });
    }
    staged.push_back(wc.final_path);
  }
  {
    ScopedStage stage(times, "write_wait");
    write_queue.wait();
  }
  for (const auto& w : writers) {
    h5_compress_s += w->compress_seconds();
    h5_write_s += w->write_seconds();
    h5_bytes += w->bytes_written();
  }

  check_stop();
  const fs::path report_path = output.install(staged);

  const mel::EngineTimes et = engine->times();
  times.add("mel.h2d", et.h2d_s);
  times.add("mel.compute", et.compute_s);
  times.add("mel.d2h", et.d2h_s);
  times.add("compress", h5_compress_s);
  times.add("write", h5_write_s);

  ReportInputs ri{config, class_names, counts, skipped, scanned, stats, times, total.seconds(), *engine,
                  num_long, num_short, layout, h5_bytes, engine_plan};
  BuildResult result;
  result.report = make_report(ri);
  if (shard.sharded()) {
    result.report["shard"] = {{"index", shard.index},
                              {"count", shard.count},
                              {"audio_files", {file_first, file_last}},
                              {"scan_skipped", {skip_first, skip_last}},
                              {"corpus_entries", scan.files.size() + scan.skipped.size()},
                              {"corpus_fingerprint", corpus_fingerprint(scan)}};
  }
  result.timing_table = times.table(total.seconds());
  write_json_atomically(report_path, result.report);
  return result;
}

}  // namespace melforge::builder
