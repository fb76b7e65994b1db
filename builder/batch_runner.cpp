#include "batch_runner.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <span>

#include "melforge/common/errors.h"
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
  /// Lists the rows a stage skipped and counts the others into the totals.
  KeptRows keep(std::size_t split, const std::vector<BatchFile>& batch);
  /// Lists row `b`, which a stage skipped (StrictError under --strict).
  void skip_row(const BatchFile& b);
  /// Stage "mel": the frames of the kept rows, in the output buffer the writer is not using.
  std::vector<uint8_t>& compute_mel(const KeptRows& kept);
  /// Stage "engine_check": compares the batch, whose frames `mel` holds, with the CPU twin; after a fallback the
  /// budget is that of the CPU engine.
  void check(std::vector<BatchFile>& batch, const KeptRows& kept, std::vector<uint8_t>& mel);
  /// The engines that computed the spectrograms (BatchTotals::engines).
  std::string engines() const;
  /// Stage "write_wait": waits for the previous write, then posts this batch's to the write queue.
  void write(SplitOutputs& out, const std::vector<uint8_t>& mel, std::vector<FileRecord> records);

  BuildState& state_;
  const std::vector<WriteTarget>& targets_;
  const RunOptions options_;
  StageTimes& times_;
  const int64_t frame_bytes_;
  int64_t budget_;
  EngineCheckSummary initial_check_;
  std::unique_ptr<EngineCheck> check_;
  int64_t check_budget_ = 0;
  const std::vector<Attribute> attributes_;
  BatchTotals totals_;
  std::vector<float> arena_;
  std::array<std::vector<uint8_t>, 2> out_buffers_;
  int out_slot_ = 0;
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
      frame_bytes_(state.frame_bytes()),
      budget_(runner_batch_budget(state)),
      initial_check_(initial_engine_check(state)),
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
  totals_.speakers.resize(state.speed_speakers.factors.size());
  if (initial_check_.result != "passed") return;
  if (!options.engine_check) {
    initial_check_.result = "skipped";
    initial_check_.reason = "this run of the batches does not check (the bench's stage runs)";
    return;
  }
  check_ = std::make_unique<EngineCheck>(state);
  check_budget_ = check_batch_budget(state.config.build.max_ram_bytes(), state.threads,
                                     largest_worker_bytes(state.audio_stages, state), state.held_bytes(),
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
  const auto bytes_of = [&](std::size_t i) { return batch_row_bytes(state_.audio_stages, rows[i], frame_bytes_); };
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
  KeptRows kept = keep(split, batch);
  std::vector<uint8_t>& mel = compute_mel(kept);
  if (compare) check(batch, kept, mel);
  write(out, mel, std::move(kept.records));
}

std::vector<BatchFile> BatchRunner::load(std::span<const PlannedCopy> rows, Progress& progress,
                                         const AudioStages& stages) {
  int64_t samples = 0;
  for (const PlannedCopy& r : rows) samples += r.plan.samples;
  resize_buffer(arena_, static_cast<std::size_t>(samples));
  std::vector<BatchFile> batch(rows.size());
  int64_t offset = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    batch[i].file = rows[i].file;
    batch[i].recipe = rows[i].recipe;
    batch[i].plan = rows[i].plan;
    batch[i].speaker_speed = rows[i].speaker_speed;
    batch[i].speaker = rows[i].speaker;
    batch[i].samples = std::span(arena_).subspan(static_cast<std::size_t>(offset),
                                                 static_cast<std::size_t>(rows[i].plan.samples));
    offset += rows[i].plan.samples;
  }
  run_audio_stages(stages, batch, state_.threads, times_, progress);
  return batch;
}

KeptRows BatchRunner::keep(std::size_t split, const std::vector<BatchFile>& batch) {
  KeptRows kept;
  for (const BatchFile& b : batch) {
    const PlannedFile& f = *b.file;
    const int copy = b.recipe.copy;
    if (!b.error.empty()) {
      skip_row(b);
      continue;
    }
    const int32_t label = state_.row_label(f, b.speaker);
    const std::string& name = state_.class_names[static_cast<std::size_t>(label)];
    FileRecord record{label, f.input->rel_path, b.plan.frames, b.plan.samples,
                      b.plan.flags, f.info.sample_rate, {}, row_recipe(state_, b.recipe), f.input->fold,
                      f.input->group, static_cast<float>(b.speaker_speed)};
    for (const auto& l : f.input->labels) record.targets.push_back(state_.class_index.at(l));
    kept.records.push_back(std::move(record));
    kept.starts.push_back(b.samples.data() - arena_.data());
    totals_.counts[split][name]++;
    totals_.copies[split][name][copy > 0 ? 1 : 0]++;
    totals_.stats.add_row(f.info, b.plan, b.speaker >= 0 ? 1 : copy, b.decoded_frames, state_.sample_rate);
    if (b.speaker >= 0)
      totals_.speakers[static_cast<std::size_t>(b.speaker)].add(copy, b.decoded_frames, state_.sample_rate);
  }
  return kept;
}

void BatchRunner::skip_row(const BatchFile& b) {
  const int copy = b.recipe.copy;
  std::string reason = copy > 0 ? "augmented copy " + std::to_string(copy) + ": " + b.error : b.error;
  if (b.speaker >= 0) reason = "speed speaker " + speed_text(b.speaker_speed) + ": " + reason;
  skip_file(totals_.skipped, state_.config.build.strict,
            {b.file->input->rel_path, reason, b.error_stage, copy, b.speaker >= 0});
}

std::vector<uint8_t>& BatchRunner::compute_mel(const KeptRows& kept) {
  std::vector<uint8_t>& out = out_buffers_[out_slot_];
  out_slot_ ^= 1;
  resize_buffer(out, static_cast<std::size_t>(kept.total_frames() * frame_bytes_));
  check_stop();
  ScopedStage stage(times_, "mel");
  compute_rows(*state_.engine, state_.config.mel, state_.config.build.dtype, arena_.data(), kept, out.data());
  return out;
}

void BatchRunner::check(std::vector<BatchFile>& batch, const KeptRows& kept, std::vector<uint8_t>& mel) {
  ScopedStage stage(times_, "engine_check");
  check_->compare({batch, kept, arena_.data()}, mel);
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

int64_t batch_row_bytes(const AudioStages& stages, const PlannedCopy& row, int64_t frame_bytes) {
  int64_t bytes = 2 * row.plan.frames * frame_bytes;
  for (const auto& stage : stages) bytes += stage->batch_bytes(row);
  return bytes;
}

std::vector<PlannedCopy> memory_rows(const BuildState& state) {
  std::vector<PlannedCopy> rows;
  const std::vector<double> speeds = state.row_speeds();
  const std::vector<double>& factors = state.speed_speakers.factors;
  for (const PlannedFile& f : state.usable)
    for (const double speed : speeds) {
      augment::Recipe recipe;
      recipe.speed = speed;
      rows.push_back({&f, recipe, state.row_plan(f, speed)});
      if (factors.empty() || f.input->split != 0) continue;
      for (std::size_t i = 0; i < factors.size(); ++i)
        rows.push_back({&f, recipe, state.row_plan(f, speed * factors[i]), factors[i], static_cast<int>(i)});
    }
  return rows;
}

int64_t largest_worker_bytes(const AudioStages& stages, const BuildState& state) {
  int64_t largest = 0;
  for (const PlannedCopy& row : memory_rows(state))
    for (const auto& stage : stages) largest = std::max(largest, stage->worker_bytes(row));
  return largest;
}

int64_t runner_batch_budget(const BuildState& state) {
  return batch_budget(state.config.build.max_ram_bytes(), state.threads,
                      largest_worker_bytes(state.audio_stages, state), state.held_bytes());
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

void check_row_memory(BuildState& state) {
  const BuildConfig& c = state.config;
  const int64_t reserve =
      batch_reserve(state.threads, largest_worker_bytes(state.audio_stages, state), state.held_bytes());
  const int64_t room = c.build.max_ram_bytes() - (reserve - kFixedReserveBytes);
  int64_t over = 0, largest = 0;
  const PlannedCopy* worst = nullptr;
  const std::vector<PlannedCopy> rows = memory_rows(state);
  for (const PlannedCopy& row : rows) {
    const int64_t bytes = batch_row_bytes(state.audio_stages, row, state.frame_bytes());
    if (bytes <= room) continue;
    ++over;
    if (bytes > largest) {
      largest = bytes;
      worst = &row;
    }
  }
  if (worst == nullptr) return;
  const auto mib = [](int64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; };
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s", static_cast<double>(worst->plan.samples) / state.sample_rate);
  const std::string text = std::to_string(over) + (over == 1 ? " clip needs" : " clips need") +
                           " more memory than --max-ram " + c.build.max_ram + " leaves (" +
                           mib(std::max<int64_t>(room, 0)) +
                           " after the per-thread and engine buffers); the largest, '" +
                           worst->file->input->rel_path + "' (" + seconds + "), needs " + mib(largest) +
                           ". A batch always takes one clip, so the build will use more than --max-ram; "
                           "--max-seconds S caps clips";
  std::fprintf(stderr, "melforge-build: warning: %s\n", text.c_str());
  state.scan.warnings.push_back(text);
}

mel::EngineConfig engine_config(const BuildState& state) {
  const BuildConfig& c = state.config;
  mel::EngineConfig config;
  config.mel = c.mel;
  config.segment_samples = c.clips.short_samples(state.sample_rate);
  config.dtype = c.build.dtype;
  config.threads = state.threads;
  config.device_batch = c.build.device_batch;
  return config;
}

void init_engine(BuildState& state) {
  state.engine.reset();
  state.engine = mel::make_engine(state.config.build.device, engine_config(state), &state.engine_plan);
  check_row_memory(state);
}

BatchTotals run_batches(BuildState& state, const std::vector<WriteTarget>& targets, const RunOptions& options,
                        StageTimes& times) {
  return BatchRunner(state, targets, options, times).run();
}

}  // namespace melforge::builder
