#include "augment_stage.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "augment/augment_cuda.h"
#include "batch_runner.h"
#include "build_state.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace melforge::builder {

namespace {

/// `bytes` as MiB with one decimal, e.g. "12.5 MiB".
std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

/// {"clips", "seconds", "bytes"} of `bank` at `sample_rate`.
nlohmann::json bank_json(const augment::Bank& bank, int sample_rate) {
  int64_t samples = 0;
  for (const auto& clip : bank.clips) samples += static_cast<int64_t>(clip.samples.size());
  return {{"clips", bank.clips.size()},
          {"seconds", static_cast<double>(samples) / sample_rate},
          {"bytes", bank.bytes()}};
}

/// The settings of `a` with --seed, as the report's augmentation.settings.
nlohmann::json settings_json(const augment::AugmentArgs& a, uint64_t seed) {
  return {{"copies", a.copies},     {"splits", a.splits},       {"seed", seed},
          {"noise", a.noise.string()}, {"noise_weights", a.noise_weights}, {"snr_db", a.snr_db},
          {"noise_prob", a.noise_prob}, {"rir", a.rir.string()}, {"rir_prob", a.rir_prob},
          {"speed", a.speed},       {"gain_db", a.gain_db}};
}

/// Appends the group of `f` at speed-speaker factor `speaker` (-1: the file's own speaker) to `rows`: its utterance
/// (copy 0), then its copies 1..`copies`, drawn for the path `<path>` (own speaker) or `<path>#sp<factor>`.
void add_group(const BuildState& state, const PlannedFile& f, int copies, int speaker, std::vector<PlannedCopy>& rows) {
  const double factor = speaker < 0 ? 1.0 : state.speed_speakers.factors[static_cast<std::size_t>(speaker)];
  rows.push_back({&f, {}, state.row_plan(f, factor), factor, speaker});
  if (copies == 0) return;
  const std::string path = utf8::escape(f.input->rel_path) + (speaker < 0 ? "" : "#sp" + speed_text(factor));
  for (int k = 1; k <= copies; ++k) {
    const augment::Recipe recipe =
        augment::draw_recipe(state.config.augment, state.augment->noise(), state.augment->rir(),
                             state.config.build.seed, path, k);
    rows.push_back({&f, recipe, state.row_plan(f, recipe.speed * factor), factor, speaker});
  }
}

}  // namespace

int64_t AugmentStage::batch_bytes(const PlannedCopy& row) const {
  return device_ ? device_->item_bytes(row.plan.samples) : 0;
}

int64_t AugmentStage::worker_bytes(const PlannedCopy& row) const {
  return !device_ && cpu_ ? cpu_->item_bytes(row.plan.samples) : 0;
}

void AugmentStage::run(BatchFile& file) const {
  if (file.recipe.identity()) return;
  augment::Augmenter::Item item{file.recipe, file.samples,
                                std::min(file.decoded_frames, static_cast<int64_t>(file.samples.size()))};
  cpu_->apply(std::span(&item, 1));
}

void AugmentStage::run_batch(std::span<BatchFile> files) const {
  std::vector<augment::Augmenter::Item> items;
  for (BatchFile& f : files)
    if (f.error.empty() && !f.recipe.identity())
      items.push_back({f.recipe, f.samples, std::min(f.decoded_frames, static_cast<int64_t>(f.samples.size()))});
  if (!items.empty()) device_->apply(items);
}

void AugmentStage::load_banks(const std::vector<std::string>& extensions, int threads) {
  noise_ = augment::load_bank(args_.noise, sample_rate_, extensions, threads, "--noise");
  rir_ = augment::load_bank(args_.rir, sample_rate_, extensions, threads, "--rir");
  cpu_ = augment::make_cpu_augmenter(noise_, rir_, sample_rate_);
}

void init_augment(BuildState& state) {
  if (!state.augment) return;
  const BuildConfig& c = state.config;
  const augment::AugmentArgs& a = c.augment;
  const std::vector<std::string> ext = c.build.extension_list();
  const int64_t noise = a.noise.empty() ? 0 : augment::bank_bytes(a.noise, state.sample_rate, ext, "--noise");
  const int64_t rir = a.rir.empty() ? 0 : augment::bank_bytes(a.rir, state.sample_rate, ext, "--rir");
  const int64_t max_ram = c.build.max_ram_bytes();
  if (kFixedReserveBytes + noise + rir <= max_ram) {
    state.augment->load_banks(ext, state.threads);
    return;
  }
  std::string banks;
  if (!a.noise.empty()) banks = "--noise '" + a.noise.string() + "' decodes to " + mib(noise);
  if (!a.rir.empty())
    banks += (banks.empty() ? "" : " and ") + std::string("--rir '") + a.rir.string() + "' to " + mib(rir);
  throw InvalidArgument("--max-ram " + c.build.max_ram + " cannot hold the augmentation banks: " + banks + " at " +
                        std::to_string(state.sample_rate) + " Hz, kept in RAM for the whole build, which with the " +
                        mib(kFixedReserveBytes) + " the program keeps for itself exceeds " + mib(max_ram) +
                        "; raise --max-ram or give --noise/--rir fewer or shorter clips");
}

int64_t augment_capacity(int64_t largest_slice, const std::function<int64_t(int64_t)>& budget) {
  if (largest_slice < 1) throw InvalidArgument("augment_capacity: largest slice " + std::to_string(largest_slice));
  const auto fits = [&](int64_t c) { return c >= budget(c) / static_cast<int64_t>(sizeof(float)); };
  int64_t lo = largest_slice;
  int64_t hi = std::max(largest_slice, kPipelineBatchBytes / static_cast<int64_t>(sizeof(float)));
  if (fits(lo)) return lo;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? hi : lo) = mid;
  }
  return hi;
}

int64_t device_augment_capacity(const BuildState& state) {
  const AugmentStage& stage = *state.augment;
  AudioStages others;
  for (const auto& s : state.audio_stages)
    if (s.get() != &stage) others.push_back(s);
  const int64_t worker = largest_worker_bytes(others, state);
  const int64_t held = state.engine->host_bytes() + stage.bank_bytes();
  std::vector<int64_t> noise, rir;
  for (const augment::Clip& c : stage.noise().clips) noise.push_back(static_cast<int64_t>(c.samples.size()));
  for (const augment::Clip& c : stage.rir().clips) rir.push_back(static_cast<int64_t>(c.samples.size()));
  const int64_t max_ram = state.config.build.max_ram_bytes();
  int64_t largest = 1;
  for (const PlannedCopy& row : memory_rows(state)) largest = std::max(largest, row.plan.samples);
  return augment_capacity(largest, [&](int64_t c) {
    const int64_t pinned = augment::cuda::augment_buffer_sizes(noise, rir, state.sample_rate, c).pinned_bytes();
    return batch_budget(max_ram, state.threads, worker, held + pinned);
  });
}

void init_augment_device(BuildState& state) {
  if (!state.augment || !state.engine_plan.cuda || state.engine_plan.devices.empty()) return;
  const AugmentStage& stage = *state.augment;
  state.augment->use_device(augment::make_cuda_augmenter(stage.noise(), stage.rir(), state.sample_rate,
                                                         state.engine_plan.devices.front(),
                                                         device_augment_capacity(state)));
}

std::vector<PlannedCopy> split_copies(const BuildState& state, std::size_t split) {
  const augment::AugmentArgs& a = state.config.augment;
  const int copies = state.augment && a.split_mask()[split] ? a.copies : 0;
  const std::vector<double>& factors = state.speed_speakers.factors;
  std::vector<PlannedCopy> rows;
  for (const PlannedFile& f : state.usable) {
    if (f.input->split != static_cast<int>(split)) continue;
    add_group(state, f, copies, -1, rows);
    if (split == 0)
      for (std::size_t i = 0; i < factors.size(); ++i) add_group(state, f, copies, static_cast<int>(i), rows);
  }
  return rows;
}

RowRecipe row_recipe(const BuildState& state, const augment::Recipe& recipe) {
  RowRecipe row;
  row.copy = recipe.copy;
  row.speed = static_cast<float>(recipe.speed);
  row.gain_db = static_cast<float>(recipe.gain_db);
  if (recipe.rir >= 0) row.rir = state.augment->rir().clips.at(static_cast<std::size_t>(recipe.rir)).path;
  if (recipe.noise >= 0) {
    row.noise = state.augment->noise().clips.at(static_cast<std::size_t>(recipe.noise)).path;
    row.snr_db = static_cast<float>(recipe.snr_db);
  }
  return row;
}

std::vector<Attribute> augment_attributes(const BuildState& state) {
  if (!state.augment) return {};
  const augment::AugmentArgs& a = state.config.augment;
  return {{"augment_copies", int64_t{a.copies}},
          {"augment_splits", a.splits},
          {"augment_seed", static_cast<int64_t>(state.config.build.seed)},
          {"augment_noise", a.noise.generic_string()},
          {"augment_noise_weights", a.noise_weights},
          {"augment_noise_clips", static_cast<int64_t>(state.augment->noise().clips.size())},
          {"augment_snr_db", a.snr_db},
          {"augment_noise_prob", a.noise_prob},
          {"augment_rir", a.rir.generic_string()},
          {"augment_rir_clips", static_cast<int64_t>(state.augment->rir().clips.size())},
          {"augment_rir_prob", a.rir_prob},
          {"augment_speed", a.speed},
          {"augment_gain_db", a.gain_db}};
}

nlohmann::json augment_report(const BuildState& state, const CopyCounts& copies, int64_t skipped_copies) {
  using nlohmann::json;
  const AugmentStage& stage = *state.augment;
  json per_split = json::object();
  for (std::size_t s = 0; s < kSplitNames.size(); ++s) {
    json per_class = json::object();
    int64_t clean = 0, augmented = 0;
    for (const auto& [name, n] : copies[s]) {
      per_class[name] = {{"clean", n[0]}, {"augmented", n[1]}};
      clean += n[0];
      augmented += n[1];
    }
    per_split[kSplitNames[s]] = {{"clean", clean}, {"augmented", augmented}, {"per_class", per_class}};
  }
  return {{"settings", settings_json(stage.args(), state.config.build.seed)},
          {"augmenter", stage.augmenter()->name()},
          {"device_bytes", stage.augmenter()->device_bytes()},
          {"banks", {{"noise", bank_json(stage.noise(), state.sample_rate)},
                     {"rir", bank_json(stage.rir(), state.sample_rate)}}},
          {"copies", per_split},
          {"skipped_copies", skipped_copies}};
}

}  // namespace melforge::builder
