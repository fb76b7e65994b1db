#include "engine_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "augment/augment_math.h"
#include "augment_stage.h"
#include "batch_runner.h"
#include "build_state.h"
#include "mel/half.h"
#include "mel/mel_cpu.h"
#include "melforge/common/parallel.h"
#include "melforge/common/progress.h"
#include "melforge/common/utf8.h"

namespace melforge::builder {

namespace {

/// `v` as JSON: null when negative (nothing compared) or not finite.
nlohmann::json figure(double v) { return v >= 0 && std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

/// `v` as text with 6 significant digits.
std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

/// The device mode a mismatch is handled in: the hook's cpu_acts_as, else --device.
mel::Device check_mode(const BuildConfig& c) {
  const mel::Device hook = c.engine_check.fault.cpu_acts_as;
  return hook != mel::Device::cpu ? hook : c.build.device;
}

/// What compare_row found in one augmented row.
struct RowDiff {
  /// Samples outside the bound, and the largest difference.
  int64_t outside = 0;
  double max_abs_diff = 0;
  /// The sample reported.
  mel::WorstElement worst;
};

/// Compares one row's device waveform with the CPU augmenter's: each sample within kCudaAbsTolerance times the
/// largest |cpu| sample of the row. A NaN or infinity on one side only is outside.
RowDiff compare_row(std::span<const float> cpu, std::span<const float> device) {
  RowDiff d;
  double peak = 0;
  for (const float v : cpu)
    if (std::isfinite(v)) peak = std::max(peak, static_cast<double>(std::abs(v)));
  const double bound = augment::kCudaAbsTolerance * peak;
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    const double diff = mel::element_diff(cpu[j], device[j]);
    d.max_abs_diff = std::max(d.max_abs_diff, diff);
    if (diff > bound) ++d.outside;
    d.worst.offer(static_cast<int64_t>(j), cpu[j], device[j], diff, bound, diff > bound);
  }
  return d;
}

/// Adds `offset` to element `index` (modulo the count) of `count` elements of `dtype` at `data`.
void perturb(uint8_t* data, int64_t count, mel::DType dtype, int64_t index, float offset) {
  if (count < 1 || offset == 0) return;
  uint8_t* p = data + (index % count) * (dtype == mel::DType::float16 ? 2 : 4);
  if (dtype == mel::DType::float16) {
    uint16_t h = 0;
    std::memcpy(&h, p, 2);
    h = mel::float_to_half_bits(mel::half_bits_to_float(h) + offset);
    std::memcpy(p, &h, 2);
    return;
  }
  float v = 0;
  std::memcpy(&v, p, 4);
  v += offset;
  std::memcpy(p, &v, 4);
}

}  // namespace

nlohmann::json EngineCheckSummary::to_json() const {
  const auto text_or_null = [](const std::string& t) { return t.empty() ? nlohmann::json() : nlohmann::json(t); };
  return {{"ran", ran},
          {"engine", engine},
          {"augmenter", text_or_null(augmenter)},
          {"result", result},
          {"reason", reason},
          {"fallback", fallback},
          {"fallback_batch", fallback ? nlohmann::json(fallback_batch) : nlohmann::json()},
          {"batches_compared", batches_compared},
          {"frames_compared", frames_compared},
          {"augmented_compared", augmented_compared},
          {"max_abs_diff", figure(max_abs_diff)},
          {"augment_max_abs_diff", figure(augment_max_abs_diff)},
          {"tolerance",
           {{"mel", {{"rel", tolerance.rel}, {"abs", tolerance.abs}, {"frame_power", tolerance.frame_power},
                     {"text", tolerance.text()}}},
            {"augment", {{"rel_to_peak", std::strtod(num(augment::kCudaAbsTolerance).c_str(), nullptr)},
                         {"text", "|device - cpu| <= " + num(augment::kCudaAbsTolerance) +
                                      " max |cpu| over the row"}}}}},
          {"where", where}};
}

EngineCheckSummary initial_engine_check(const BuildState& state) {
  const BuildConfig& c = state.config;
  EngineCheckSummary s;
  s.engine = state.engine->name();
  const bool device = state.engine_plan.cuda || c.engine_check.fault.cpu_acts_as != mel::Device::cpu;
  s.tolerance = mel::mel_tolerance(c.build.dtype, c.mel.log, 0);
  if (!device) {
    s.reason = "the CPU engine computed the build: there is no device result to compare";
    return s;
  }
  if (c.engine_check.skip) {
    s.result = "skipped";
    s.reason = "--no-engine-check";
    return s;
  }
  s.result = "passed";
  if (state.augment) s.augmenter = state.augment->augmenter()->name();
  return s;
}

/// The check's state: what is pending, the rows the stages kept, the summary and the fallback.
struct EngineCheck::Impl {
  explicit Impl(BuildState& s) : state(s), mode(check_mode(s.config)), summary(initial_engine_check(s)) {
    augment_pending = state.augment != nullptr;
  }

  /// A row whose augmented waveform is compared: its index in the batch, and its decoded samples, then the CPU
  /// augmenter's result.
  struct Row {
    std::size_t index = 0;
    std::vector<float> cpu;
  };

  BuildState& state;
  mel::Device mode;
  EngineCheckSummary summary;
  bool mel_pending = true;
  bool augment_pending = false;
  bool fallback = false;
  bool mel_fault_used = false;
  bool augment_fault_used = false;
  int64_t batch_number = 0;
  std::size_t batch_split = 0;
  std::vector<Row> rows;
  bool rows_in_arena = false;
  bool augment_failed = false;
  std::string failure;
  mel::EngineTimes replaced_times;
  int64_t replaced_device_bytes = 0;
  std::vector<uint8_t> twin_out;

  /// Index of the augment stage in state.audio_stages (size() when there is none).
  std::size_t augment_index() const {
    std::size_t k = 0;
    while (k < state.audio_stages.size() && state.audio_stages[k].get() != state.augment.get()) ++k;
    return k;
  }

  void capture(std::span<BatchFile> files);
  void compare_mel(const Batch& b, std::vector<uint8_t>& device_out, mel::MelEngine& twin);
  void rerun_after_augment(std::span<BatchFile> files) const;
  void compare_rows(std::span<BatchFile> files);
  void fail(const std::string& message, const nlohmann::json& where);
  void rows_into_arena(std::span<BatchFile> files);
  void fall_back(std::unique_ptr<mel::MelEngine> twin);
};

namespace {

/// A batched stage "engine_check" of a compared batch: before "augment" it keeps the decoded samples of the
/// augmenting rows (Impl::capture), after it applies the CPU augmenter to them and compares (Impl::compare_rows).
class CheckStage final : public AudioStage {
 public:
  CheckStage(EngineCheck::Impl& check, void (EngineCheck::Impl::*step)(std::span<BatchFile>))
      : check_(check), step_(step) {}
  std::string name() const override { return "engine_check"; }
  void run(BatchFile& /*file*/) const override {}
  bool batched() const override { return true; }
  void run_batch(std::span<BatchFile> files) const override { (check_.*step_)(files); }

 private:
  EngineCheck::Impl& check_;
  void (EngineCheck::Impl::*step_)(std::span<BatchFile>);
};

}  // namespace

void EngineCheck::Impl::capture(std::span<BatchFile> files) {
  rows.clear();
  rows_in_arena = false;
  for (std::size_t i = 0; i < files.size(); ++i)
    if (files[i].error.empty() && files[i].recipe.augments())
      rows.push_back({i, std::vector<float>(files[i].samples.begin(), files[i].samples.end())});
}

void EngineCheck::Impl::compare_rows(std::span<BatchFile> files) {
  if (rows.empty()) return;
  const EngineCheckFault& fault = state.config.engine_check.fault;
  if (!augment_fault_used && fault.augment_offset != 0) {
    std::span<float> s = files[rows.front().index].samples;
    if (!s.empty()) s[static_cast<std::size_t>(fault.augment_sample % std::ssize(s))] += fault.augment_offset;
    augment_fault_used = true;
  }
  augment::Augmenter& cpu = *state.augment->cpu_augmenter();
  parallel_for(static_cast<int64_t>(rows.size()), state.threads, [&](int64_t r) {
    Row& row = rows[static_cast<std::size_t>(r)];
    const BatchFile& f = files[row.index];
    augment::Augmenter::Item item{f.recipe, row.cpu,
                                  std::min(f.decoded_frames, static_cast<int64_t>(row.cpu.size()))};
    cpu.apply(std::span(&item, 1));
  });
  mel::WorstElement worst;
  std::size_t worst_row = 0;
  int64_t outside = 0, samples = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const RowDiff d = compare_row(rows[r].cpu, files[rows[r].index].samples);
    outside += d.outside;
    samples += std::ssize(rows[r].cpu);
    summary.augment_max_abs_diff = std::max(summary.augment_max_abs_diff, d.max_abs_diff);
    if (worst.offer(d.worst.index, d.worst.cpu, d.worst.device, d.worst.diff, d.worst.bound, d.worst.outside))
      worst_row = r;
  }
  summary.augmented_compared += std::ssize(rows);
  augment_pending = false;
  if (outside == 0) return;
  const BatchFile& f = files[rows[worst_row].index];
  const std::string path = utf8::escape(f.file->input->rel_path);
  const double seconds = static_cast<double>(worst.index) / state.sample_rate;
  const nlohmann::json where = {{"stage", "augment"}, {"split", kSplitNames[batch_split]}, {"batch", batch_number},
                                {"path", f.file->input->rel_path}, {"copy", f.recipe.copy}, {"sample", worst.index},
                                {"seconds", seconds}, {"cpu", worst.cpu}, {"device", worst.device},
                                {"abs_diff", figure(worst.diff)}, {"bound", worst.bound}};
  augment_failed = true;
  fail("the augmented waveforms of batch " + std::to_string(batch_number) + " (" + kSplitNames[batch_split] +
           ") computed by " + summary.augmenter + " differ from the CPU augmenter's beyond the tolerance (|device - "
           "cpu| <= " + num(augment::kCudaAbsTolerance) + " max |cpu| of the row): " + std::to_string(outside) +
           " of " + std::to_string(samples) + " samples outside; the largest: " + path + " (copy " +
           std::to_string(f.recipe.copy) + "), sample " + std::to_string(worst.index) + " (" + num(seconds) +
           " s): device " + num(worst.device) + ", cpu " + num(worst.cpu) + " (bound " + num(worst.bound) + ")",
       where);
  rows_into_arena(files);
}

void EngineCheck::Impl::compare_mel(const Batch& b, std::vector<uint8_t>& device_out, mel::MelEngine& twin) {
  const BuildConfig& cfg = state.config;
  const int n_mels = cfg.mel.n_mels;
  const int64_t count = std::ssize(device_out) / (cfg.build.dtype == mel::DType::float16 ? 2 : 4);
  if (!mel_fault_used && cfg.engine_check.fault.mel_offset != 0) {
    perturb(device_out.data(), count, cfg.build.dtype, cfg.engine_check.fault.mel_element,
            cfg.engine_check.fault.mel_offset);
    mel_fault_used = true;
  }
  twin_out.resize(device_out.size());
  compute_rows(twin, cfg.mel, cfg.build.dtype, b.arena, b.kept, twin_out.data());
  const mel::MelDiff d =
      mel::compare_mel(twin_out.data(), device_out.data(), count / n_mels, n_mels, 1, cfg.build.dtype, cfg.mel);
  summary.ran = true;
  summary.batches_compared++;
  summary.frames_compared += count / n_mels;
  summary.tolerance = d.tolerance;
  mel_pending = false;
  const int64_t batch_frame = d.worst.index / n_mels;
  std::size_t r = 0;
  int64_t first = 0;
  while (r + 1 < b.kept.records.size() && first + b.kept.records[r].frames <= batch_frame)
    first += b.kept.records[r++].frames;
  const FileRecord& row = b.kept.records[r];
  const int64_t frame = batch_frame - first;
  const int64_t band = d.worst.index % n_mels;
  const double seconds = static_cast<double>(frame) * cfg.mel.hop() / state.sample_rate;
  const nlohmann::json where = {
      {"stage", "mel"}, {"split", kSplitNames[batch_split]}, {"batch", batch_number}, {"path", row.path},
      {"copy", row.recipe.copy}, {"frame", frame}, {"seconds", seconds}, {"mel_band", band},
      {"cpu", d.worst.cpu}, {"device", d.worst.device}, {"abs_diff", figure(d.worst.diff)}, {"bound", d.worst.bound}};
  if (!augment_failed && d.max_abs_diff > summary.max_abs_diff) summary.where = where;
  summary.max_abs_diff = std::max(summary.max_abs_diff, d.max_abs_diff);
  if (d.passed()) return;
  fail("the spectrograms of batch " + std::to_string(batch_number) + " (" + kSplitNames[batch_split] +
           ") computed by " + summary.engine + " differ from the CPU engine's beyond the tolerance (" +
           d.tolerance.text() + "): " + std::to_string(d.outside) + " of " + std::to_string(d.elements) +
           " elements outside; the largest: " + utf8::escape(row.path) + " (copy " +
           std::to_string(row.recipe.copy) + "), frame " + std::to_string(frame) + ", mel band " +
           std::to_string(band) + ": device " + num(d.worst.device) + ", cpu " + num(d.worst.cpu) +
           " (bound " + num(d.worst.bound) + ")",
       where);
}

void EngineCheck::Impl::rerun_after_augment(std::span<BatchFile> files) const {
  const std::size_t k = augment_index();
  if (k + 1 >= state.audio_stages.size()) return;
  const AudioStages after(state.audio_stages.begin() + static_cast<std::ptrdiff_t>(k) + 1, state.audio_stages.end());
  std::vector<BatchFile> redo;
  for (const Row& row : rows) redo.push_back(files[row.index]);
  StageTimes times;
  Progress quiet("engine check", std::ssize(redo), "rows", true);
  run_audio_stages(after, redo, state.threads, times, quiet);
  for (const BatchFile& f : redo)
    if (!f.error.empty())
      throw Error("engine check: on the fallback to the CPU, stage '" + f.error_stage + "' rejected " +
                  utf8::escape(f.file->input->rel_path) + " (copy " + std::to_string(f.recipe.copy) +
                  "), which it had kept after the device's augmenter: " + f.error);
}

void EngineCheck::Impl::fail(const std::string& message, const nlohmann::json& where) {
  if (summary.result != "failed") summary.where = where;
  summary.result = "failed";
  failure = failure.empty() ? message : failure + "; " + message;
  summary.reason = failure;
  if (mode == mel::Device::cuda)
    throw EngineCheckError("engine check failed: " + message +
                           " (--device auto falls back to the CPU engine; --no-engine-check skips the check)");
}

void EngineCheck::Impl::rows_into_arena(std::span<BatchFile> files) {
  for (const Row& row : rows) std::copy(row.cpu.begin(), row.cpu.end(), files[row.index].samples.begin());
  rows_in_arena = true;
}

void EngineCheck::Impl::fall_back(std::unique_ptr<mel::MelEngine> twin) {
  replaced_times = state.engine->times();
  replaced_device_bytes = state.engine->device_bytes();
  const std::string device = state.engine->name();
  state.engine = std::move(twin);
  if (state.augment) state.augment->use_cpu();
  fallback = true;
  summary.fallback = true;
  summary.fallback_batch = batch_number;
  std::fprintf(stderr,
               "melforge-build: --device %s: engine check failed: %s; the build goes on with the CPU engine (%s) "
               "instead of %s from batch %lld (%s) on\n",
               mel::to_string(mode).c_str(), utf8::escape(failure).c_str(),
               state.engine->name().c_str(), device.c_str(), static_cast<long long>(batch_number),
               kSplitNames[batch_split].c_str());
}

EngineCheck::EngineCheck(BuildState& state) : impl_(std::make_unique<Impl>(state)) {}

EngineCheck::~EngineCheck() = default;

bool EngineCheck::wants(std::span<const PlannedCopy> rows) const {
  if (impl_->fallback) return false;
  if (impl_->mel_pending) return true;
  return impl_->augment_pending &&
         std::any_of(rows.begin(), rows.end(), [](const PlannedCopy& r) { return r.recipe.augments(); });
}

int64_t EngineCheck::held_bytes() const {
  const BuildState& s = impl_->state;
  int64_t bytes = mel::cpu_engine_host_bytes(engine_config(s));
  if (!impl_->augment_pending) return bytes;
  int64_t scratch = 0;
  for (const PlannedCopy& row : memory_rows(s))
    scratch = std::max(scratch, s.augment->cpu_augmenter()->item_bytes(row.plan.samples));
  return bytes + int64_t{s.threads} * scratch;
}

AudioStages EngineCheck::stages(int64_t number, std::size_t split) const {
  impl_->batch_number = number;
  impl_->batch_split = split;
  const BuildState& s = impl_->state;
  if (!impl_->augment_pending) return s.audio_stages;
  const std::size_t k = impl_->augment_index();
  AudioStages stages(s.audio_stages.begin(), s.audio_stages.begin() + static_cast<std::ptrdiff_t>(k));
  stages.push_back(std::make_shared<CheckStage>(*impl_, &Impl::capture));
  stages.push_back(s.audio_stages[k]);
  stages.push_back(std::make_shared<CheckStage>(*impl_, &Impl::compare_rows));
  stages.insert(stages.end(), s.audio_stages.begin() + static_cast<std::ptrdiff_t>(k) + 1, s.audio_stages.end());
  return stages;
}

void EngineCheck::compare(const Batch& batch, std::vector<uint8_t>& device_out) {
  Impl& c = *impl_;
  if (batch.kept.records.empty()) return;
  std::unique_ptr<mel::MelEngine> twin = mel::make_cpu_engine(engine_config(c.state));
  c.compare_mel(batch, device_out, *twin);
  if (c.summary.result == "failed") {
    if (!c.rows_in_arena && !c.rows.empty()) {
      c.rows_into_arena(batch.files);
      c.rerun_after_augment(batch.files);
      compute_rows(*twin, c.state.config.mel, c.state.config.build.dtype, batch.arena, batch.kept,
                   c.twin_out.data());
    }
    device_out = c.twin_out;
    c.fall_back(std::move(twin));
  }
  std::vector<Impl::Row>().swap(c.rows);
  std::vector<uint8_t>().swap(c.twin_out);
}

bool EngineCheck::fell_back() const { return impl_->fallback; }

EngineCheckSummary EngineCheck::summary() const {
  EngineCheckSummary s = impl_->summary;
  if (s.result != "passed") return s;
  if (!s.ran) {
    s.result = "skipped";
    s.reason = "no batch held a row to compare";
    return s;
  }
  s.reason = std::to_string(s.batches_compared) + (s.batches_compared == 1 ? " batch" : " batches") +
             " computed by " + s.engine + " agree with the CPU engine within the tolerance";
  if (!s.augmenter.empty())
    s.reason += s.augmented_compared > 0 ? ", and the augmented rows of the first augmented batch with the CPU "
                                           "augmenter"
                                         : "; no kept row had a recipe that augments, so no augmented waveform was "
                                           "compared";
  return s;
}

mel::EngineTimes EngineCheck::replaced_times() const { return impl_->replaced_times; }

int64_t EngineCheck::replaced_device_bytes() const { return impl_->replaced_device_bytes; }

}  // namespace melforge::builder
