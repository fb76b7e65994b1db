#include "batch_runner.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <numeric>
#include <span>

#include "featurize/featurize.h"
#include "melforge/common/progress.h"
#include "plan.h"
#include "stop.h"
#include "write_queue.h"

namespace melforge::builder {

namespace {

/// Resizes `v` to `n` elements. Growing past its capacity frees the old buffer first, so that the old and the new
/// one (which std::vector would size up to twice the old) are never held at once.
template <class T>
void resize_buffer(std::vector<T>& v, std::size_t n) {
  if (n > v.capacity()) std::vector<T>().swap(v);
  v.resize(n);
}

/// The files of a batch that every audio stage kept, as mel and the writer take them.
struct KeptFiles {
  /// Metadata of each kept file, in batch order.
  std::vector<FileRecord> records;
  /// Where each kept file starts in the arena, samples.
  std::vector<int64_t> offsets;
  /// Long segments of each kept file that hold audio.
  std::vector<int> valid_long;
};

/// One run of the batches of a build: the arena, the spectrogram buffers, the writers and the write queue.
class BatchRunner {
 public:
  /// Plans the --max-ram budget, sets up the engine check (RunOptions::engine_check) and starts the write queue;
  /// nothing is written until run().
  BatchRunner(BuildState& state, const std::vector<WriteTarget>& targets, const RunOptions& options,
              StageTimes& times);
  /// Runs every split and waits for the last write.
  BatchTotals run();

 private:
  /// Opens the split's writers, runs its batches and posts its finish().
  void run_split(std::size_t split);
  /// The end of the batch that starts at rows[begin]: that row, then as many as fit in the budget (the check's
  /// budget when the engine check would compare the batch).
  std::size_t batch_end(const std::vector<PlannedCopy>& rows, std::size_t begin) const;
  /// The end of the batch that starts at rows[begin] within `budget` bytes of batch_file_bytes (at least one row).
  std::size_t batch_end_within(const std::vector<PlannedCopy>& rows, std::size_t begin, int64_t budget) const;
  /// Load, keep, compute_mel, the engine check when it compares the batch, and write one batch.
  void run_batch(std::size_t split, std::span<const PlannedCopy> rows, SplitOutputs& out, Progress& progress);
  /// The batch's slices of the arena, filled by `stages`.
  std::vector<BatchFile> load(std::span<const PlannedCopy> rows, Progress& progress, const AudioStages& stages);
  /// Lists the files a stage skipped and counts the others into the totals.
  KeptFiles keep(std::size_t split, const std::vector<BatchFile>& batch);
  /// Stage "mel": the spectrograms of the kept files, in the output buffer the writer is not using.
  std::vector<uint8_t>& compute_mel(const KeptFiles& kept);
  /// Stage "engine_check": compares the batch, whose spectrograms `mel` holds, with the CPU twin; after a fallback
  /// the budget is that of the CPU engine.
  void check(std::vector<BatchFile>& batch, const KeptFiles& kept, std::vector<uint8_t>& mel);
  /// The engines that computed the spectrograms (BatchTotals::engines).
  std::string engines() const;
  /// Stage "write_wait": waits for the previous write, then posts this batch's to the write queue.
  void write(SplitOutputs& out, const std::vector<uint8_t>& mel, std::vector<FileRecord> records);

  BuildState& state_;
  const std::vector<WriteTarget>& targets_;
  const RunOptions options_;
  StageTimes& times_;
  const int64_t out_bytes_per_file_;
  int64_t budget_;
  EngineCheckSummary initial_check_;
  std::unique_ptr<EngineCheck> check_;
  int64_t check_budget_ = 0;
  const float silence_;
  const featurize::BatchLayout layout_;
  const std::vector<Attribute> attributes_;
  BatchTotals totals_;
  std::vector<float> arena_;
  std::array<std::vector<uint8_t>, 2> out_buffers_;
  int out_slot_ = 0;
  std::vector<uint8_t> compact_;
  std::vector<std::unique_ptr<SplitOutputs>> outputs_;
  /// Declared last, so destroyed first: it waits for the write in flight, which uses the buffers and writers.
  WriteQueue queue_;
};

BatchRunner::BatchRunner(BuildState& state, const std::vector<WriteTarget>& targets, const RunOptions& options,
                         StageTimes& times)
    : state_(state),
      targets_(targets),
      options_(options),
      times_(times),
      out_bytes_per_file_(state.out_bytes_per_file()),
      budget_(runner_batch_budget(state)),
      initial_check_(initial_engine_check(state)),
      silence_(mel::silence_value(state.config.mel)),
      layout_(state.batch_layout()),
      attributes_(dataset_attributes(state)),
      queue_(options.background_writes) {
  totals_.counts.resize(kSplitNames.size());
  totals_.copies.resize(kSplitNames.size());
  for (std::size_t s = 0; s < kSplitNames.size(); ++s)
    for (const auto& name : state.class_names) {
      totals_.counts[s][name] = 0;
      totals_.copies[s][name] = {0, 0};
    }
  totals_.writes.resize(targets.size());
  if (initial_check_.result != "passed") return;
  if (!options.engine_check) {
    initial_check_.result = "skipped";
    initial_check_.reason = "this run of the batches does not check (the bench's stage runs)";
    return;
  }
  check_ = std::make_unique<EngineCheck>(state);
  check_budget_ = check_batch_budget(state.config.build.max_ram_bytes(), state.threads,
                                     largest_worker_bytes(state.audio_stages, state.usable), state.held_bytes(),
                                     check_->held_bytes());
}

BatchTotals BatchRunner::run() {
  for (std::size_t split = 0; split < kSplitNames.size(); ++split) run_split(split);
  {
    ScopedStage stage(times_, "write_wait");
    queue_.wait();
  }
  for (const auto& out : outputs_) out->add_to(totals_.writes);
  totals_.engine_check = check_ ? check_->summary() : initial_check_;
  totals_.engines = engines();
  if (check_) {
    totals_.replaced_times = check_->replaced_times();
    totals_.replaced_device_bytes = check_->replaced_device_bytes();
  }
  return std::move(totals_);
}

void BatchRunner::run_split(std::size_t split) {
  const std::vector<PlannedCopy> rows = split_copies(state_, split);
  outputs_.push_back(std::make_unique<SplitOutputs>(state_, split, targets_, attributes_));
  SplitOutputs& out = *outputs_.back();
  Progress progress(kSplitNames[split], static_cast<int64_t>(rows.size()), state_.augment ? "rows" : "files",
                    state_.config.build.quiet || !options_.show_progress);
  for (std::size_t next = 0; next < rows.size();) {
    const std::size_t end = batch_end(rows, next);
    run_batch(split, std::span(rows).subspan(next, end - next), out, progress);
    next = end;
  }
  progress.finish();
  ScopedStage stage(times_, "write_wait");
  queue_.post([&out] { out.finish(); });
}

std::size_t BatchRunner::batch_end(const std::vector<PlannedCopy>& rows, std::size_t begin) const {
  const std::size_t end = batch_end_within(rows, begin, budget_);
  if (!check_ || !check_->wants(std::span(rows).subspan(begin, end - begin))) return end;
  return batch_end_within(rows, begin, check_budget_);
}

std::size_t BatchRunner::batch_end_within(const std::vector<PlannedCopy>& rows, std::size_t begin,
                                          int64_t budget) const {
  const auto bytes_of = [&](std::size_t i) {
    return batch_file_bytes(state_.audio_stages, *rows[i].file, out_bytes_per_file_);
  };
  int64_t bytes = bytes_of(begin);
  std::size_t end = begin + 1;
  for (; end < rows.size(); ++end) {
    const int64_t next = bytes_of(end);
    if (bytes + next > budget) break;
    bytes += next;
  }
  return end;
}

void BatchRunner::run_batch(std::size_t split, std::span<const PlannedCopy> rows, SplitOutputs& out,
                            Progress& progress) {
  totals_.stats.batches++;
  const bool compare = check_ && check_->wants(rows);
  std::vector<BatchFile> batch =
      load(rows, progress, compare ? check_->stages(totals_.stats.batches, split) : state_.audio_stages);
  KeptFiles kept = keep(split, batch);
  std::vector<uint8_t>& mel = compute_mel(kept);
  if (compare) check(batch, kept, mel);
  totals_.stats.segments +=
      std::accumulate(kept.valid_long.begin(), kept.valid_long.end(), int64_t{0}) * state_.num_short;
  write(out, mel, std::move(kept.records));
}

std::vector<BatchFile> BatchRunner::load(std::span<const PlannedCopy> rows, Progress& progress,
                                         const AudioStages& stages) {
  int64_t samples = 0;
  for (const PlannedCopy& r : rows) samples += r.file->plan.arena_samples;
  resize_buffer(arena_, static_cast<std::size_t>(samples));
  std::vector<BatchFile> batch(rows.size());
  int64_t offset = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    batch[i].file = rows[i].file;
    batch[i].recipe = rows[i].recipe;
    batch[i].samples = std::span(arena_).subspan(static_cast<std::size_t>(offset),
                                                 static_cast<std::size_t>(rows[i].file->plan.arena_samples));
    offset += rows[i].file->plan.arena_samples;
  }
  run_audio_stages(stages, batch, state_.threads, times_, progress);
  return batch;
}

KeptFiles BatchRunner::keep(std::size_t split, const std::vector<BatchFile>& batch) {
  KeptFiles kept;
  for (const BatchFile& b : batch) {
    const PlannedFile& f = *b.file;
    const int copy = b.recipe.copy;
    if (!b.error.empty()) {
      const std::string reason = copy > 0 ? "augmented copy " + std::to_string(copy) + ": " + b.error : b.error;
      skip_file(totals_.skipped, state_.config.build.strict, {f.input->rel_path, reason, b.error_stage, copy});
      continue;
    }
    kept.records.push_back({state_.class_index.at(f.input->label), f.input->rel_path, f.plan.num_valid_long,
                            f.info.sample_rate, {}, row_recipe(state_, b.recipe)});
    for (const auto& l : f.input->labels) kept.records.back().targets.push_back(state_.class_index.at(l));
    kept.offsets.push_back(b.samples.data() - arena_.data());
    kept.valid_long.push_back(f.plan.num_valid_long);
    totals_.counts[split][f.input->label]++;
    totals_.copies[split][f.input->label][copy > 0 ? 1 : 0]++;
    totals_.stats.add_file(f.info, f.plan, b.decoded_frames, state_.sample_rate);
    if (f.plan.num_valid_long < state_.num_long) totals_.stats.partial++;
  }
  return kept;
}

std::vector<uint8_t>& BatchRunner::compute_mel(const KeptFiles& kept) {
  std::vector<uint8_t>& out = out_buffers_[out_slot_];
  out_slot_ ^= 1;
  resize_buffer(out, static_cast<std::size_t>(static_cast<int64_t>(kept.records.size()) * out_bytes_per_file_));
  check_stop();
  ScopedStage stage(times_, "mel");
  featurize::compute_files(*state_.engine, arena_.data(), kept.offsets, kept.valid_long, layout_,
                           state_.config.build.dtype, silence_, out.data(), compact_);
  return out;
}

void BatchRunner::check(std::vector<BatchFile>& batch, const KeptFiles& kept, std::vector<uint8_t>& mel) {
  ScopedStage stage(times_, "engine_check");
  check_->compare({batch, kept.records, kept.offsets, kept.valid_long, arena_.data()}, mel);
  if (check_->fell_back()) budget_ = runner_batch_budget(state_);
}

std::string BatchRunner::engines() const {
  const std::string now = state_.engine->name();
  if (!check_ || !check_->fell_back()) return now;
  const EngineCheckSummary s = check_->summary();
  return s.fallback_batch > 1 && s.engine != now ? s.engine + " + " + now : now;
}

void BatchRunner::write(SplitOutputs& out, const std::vector<uint8_t>& mel, std::vector<FileRecord> records) {
  ScopedStage stage(times_, "write_wait");
  queue_.post([&out, &mel, records = std::move(records)] { out.append(mel.data(), records); });
}

}  // namespace

int64_t batch_file_bytes(const AudioStages& stages, const PlannedFile& file, int64_t out_bytes_per_file) {
  int64_t bytes = 2 * out_bytes_per_file;
  for (const auto& stage : stages) bytes += stage->batch_bytes(file);
  return bytes;
}

int64_t largest_worker_bytes(const AudioStages& stages, const std::vector<PlannedFile>& files) {
  int64_t largest = 0;
  for (const auto& f : files)
    for (const auto& stage : stages) largest = std::max(largest, stage->worker_bytes(f));
  return largest;
}

int64_t runner_batch_budget(const BuildState& state) {
  return batch_budget(state.config.build.max_ram_bytes(), state.threads,
                      largest_worker_bytes(state.audio_stages, state.usable), state.held_bytes());
}

int64_t check_batch_budget(int64_t max_ram, int threads, int64_t worker_bytes, int64_t engine_bytes,
                           int64_t check_bytes) {
  const int64_t room = max_ram - batch_reserve(threads, worker_bytes, engine_bytes) - check_bytes;
  return std::clamp<int64_t>(room / 2, 1, kPipelineBatchBytes);
}

int64_t batch_reserve(int threads, int64_t worker_bytes, int64_t engine_bytes) {
  return kFixedReserveBytes + int64_t{threads} * worker_bytes + engine_bytes;
}

int64_t batch_budget(int64_t max_ram, int threads, int64_t worker_bytes, int64_t engine_bytes) {
  const int64_t reserve = batch_reserve(threads, worker_bytes, engine_bytes);
  return std::min(std::max<int64_t>(max_ram - reserve, 1), kPipelineBatchBytes);
}

int num_long_cap(int64_t file_budget, int64_t long_segment_bytes) {
  if (long_segment_bytes <= 0) return std::numeric_limits<int>::max();
  return static_cast<int>(std::clamp<int64_t>(file_budget / long_segment_bytes, 1, std::numeric_limits<int>::max()));
}

int64_t long_segment_bytes(const BuildState& state) {
  const int64_t spectrograms = int64_t{state.num_short} * state.engine->layout().out_bytes_per_segment();
  return state.config.segment.long_samples(state.sample_rate) * static_cast<int64_t>(sizeof(float)) + 4 * spectrograms;
}

void fit_num_long(BuildState& state) {
  const BuildConfig& c = state.config;
  const int64_t max_ram = c.build.max_ram_bytes();
  const int64_t held = batch_reserve(state.threads, largest_worker_bytes(state.audio_stages, state.usable),
                                     state.held_bytes()) - kFixedReserveBytes;
  const int64_t per_long = long_segment_bytes(state);
  const int cap = num_long_cap(max_ram - held, per_long);
  if (state.num_long <= cap) return;
  const auto mib = [](int64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; };
  const int64_t room = std::max<int64_t>(max_ram - held, 0);
  const std::string need = "one file of " + std::to_string(state.num_long) + " long segments needs " +
                           mib(per_long * state.num_long) + ", more than the " + mib(room) + " that --max-ram " +
                           c.build.max_ram + " leaves after " + mib(held) +
                           " of per-thread, engine and augmentation bank buffers";
  if (c.segment.num_long > 0) {
    std::fprintf(stderr, "melforge-build: warning: --num-long %d: %s; the build will use more memory than --max-ram\n",
                 state.num_long, need.c_str());
    return;
  }
  std::fprintf(stderr,
               "melforge-build: warning: --num-long auto would be %d, but %s: using %d long segments per file (longer "
               "files are cut); choose --num-long to set it\n",
               state.num_long, need.c_str(), cap);
  state.num_long = cap;
  for (PlannedFile& f : state.usable) f.plan = segment::plan_file(f.frames, c.segment, state.sample_rate, cap);
}

mel::EngineConfig engine_config(const BuildState& state) {
  const BuildConfig& c = state.config;
  mel::EngineConfig config;
  config.mel = c.mel;
  config.segment_samples = c.segment.short_samples(state.sample_rate);
  config.dtype = c.build.dtype;
  config.threads = state.threads;
  config.device_batch = c.build.device_batch;
  return config;
}

void init_engine(BuildState& state) {
  state.engine.reset();
  state.engine = mel::make_engine(state.config.build.device, engine_config(state), &state.engine_plan);
  fit_num_long(state);
}

BatchTotals run_batches(BuildState& state, const std::vector<WriteTarget>& targets, const RunOptions& options,
                        StageTimes& times) {
  return BatchRunner(state, targets, options, times).run();
}

}  // namespace melforge::builder
