// CUDA-free parts of the CUDA augmenter (augment_cuda.h), compiled in every build so that the CPU tests check them.
#include <algorithm>
#include <cmath>
#include <string>

#include "augment/augment_cuda.h"
#include "augment/augment_cuda_kernels.h"
#include "augment/augment_math.h"
#include "melforge/common/errors.h"

namespace melforge::augment::cuda {

int64_t direct_path(std::span<const float> h) {
  int64_t best = 0;
  float best_abs = -1.0f;
  for (size_t k = 0; k < h.size(); ++k) {
    const float a = std::abs(h[k]);
    if (a > best_abs) {
      best_abs = a;
      best = static_cast<int64_t>(k);
    }
  }
  return best;
}

PreparedRir prepare_rir(std::span<const float> h) {
  PreparedRir r;
  r.taps.assign(h.begin(), h.end());
  r.direct = direct_path(h);
  double energy = 0.0;
  for (const float v : h) energy += static_cast<double>(v) * v;
  const float scale = energy > 0.0 ? static_cast<float>(1.0 / std::sqrt(energy)) : 0.0f;
  for (float& v : r.taps) v = v * scale;
  return r;
}

int64_t active_frame_samples(int sample_rate) {
  const auto n = static_cast<int64_t>(std::llround(sample_rate * kActiveFrameMs / 1000.0));
  return std::max<int64_t>(n, 1);
}

int64_t AugmentBufferSizes::block_table_bytes() const {
  return block_entries * static_cast<int64_t>(sizeof(OlaBlock));
}

int64_t AugmentBufferSizes::item_table_bytes() const { return items * static_cast<int64_t>(sizeof(ItemParams)); }

int64_t AugmentBufferSizes::device_bytes() const {
  return signal_bytes() + out_bytes() + noise_bytes() + rir_spectrum_bytes() + block_bytes() + spectrum_bytes() +
         block_table_bytes() + item_table_bytes() + scale_bytes() + energy_bytes();
}

int64_t AugmentBufferSizes::pinned_bytes() const {
  return signal_bytes() + block_table_bytes() + item_table_bytes() + scale_bytes() + energy_bytes();
}

AugmentBufferSizes augment_buffer_sizes(std::span<const int64_t> noise_lengths, std::span<const int64_t> rir_lengths,
                                        int sample_rate, int64_t max_batch_samples, int64_t chunk_floats) {
  if (max_batch_samples < 1) {
    throw InvalidArgument("CUDA augmenter: max_batch_samples must be >= 1, got " + std::to_string(max_batch_samples));
  }
  if (sample_rate < 1) {
    throw InvalidArgument("CUDA augmenter: sample_rate must be >= 1, got " + std::to_string(sample_rate));
  }
  if (chunk_floats < 1) {
    throw InvalidArgument("CUDA augmenter: chunk_floats must be >= 1, got " + std::to_string(chunk_floats));
  }
  AugmentBufferSizes s;
  s.chunk_floats = chunk_floats;
  s.max_batch_samples = max_batch_samples;
  s.signal_floats = max_batch_samples;
  s.out_floats = max_batch_samples;
  for (const int64_t n : noise_lengths) s.noise_floats += n;
  int64_t min_hop = 0;
  for (const int64_t taps : rir_lengths) {
    const int64_t n = ola_fft_size(taps);
    s.rir_spectrum_complex += n / 2 + 1;
    if (std::find(s.fft_sizes.begin(), s.fft_sizes.end(), n) == s.fft_sizes.end()) s.fft_sizes.push_back(n);
    const int64_t hop = ola_hop(taps);
    min_hop = min_hop == 0 ? hop : std::min(min_hop, hop);
  }
  std::sort(s.fft_sizes.begin(), s.fft_sizes.end());
  for (const int64_t n : s.fft_sizes) {
    s.block_floats = std::max(s.block_floats, chunk_blocks(n, chunk_floats) * n);
    s.spectrum_complex = std::max(s.spectrum_complex, chunk_blocks(n, chunk_floats) * (n / 2 + 1));
  }
  s.items = std::min(kMaxItemsPerBatch, max_batch_samples);
  if (min_hop > 0) s.block_entries = max_batch_samples / min_hop + s.items + 1;
  s.frame_samples = active_frame_samples(sample_rate);
  s.energy_frames = max_batch_samples / s.frame_samples + s.items;
  return s;
}

int64_t smallest_hop(std::span<const int64_t> rir_lengths) {
  int64_t hop = 0;
  for (const int64_t taps : rir_lengths) hop = hop == 0 ? ola_hop(taps) : std::min(hop, ola_hop(taps));
  return hop;
}

int64_t device_item_bytes(int64_t frames, int64_t min_hop) {
  const int64_t blocks = min_hop > 0 ? frames / min_hop + 1 : 0;
  return static_cast<int64_t>(sizeof(ItemParams) + sizeof(int64_t)) + blocks * static_cast<int64_t>(sizeof(OlaBlock));
}

void check_launch_limits(const AugmentBufferSizes& sizes) {
  if (grid_for(sizes.block_floats) > kMaxGridX) {
    throw InvalidArgument("CUDA augmenter: an overlap-add chunk of " + std::to_string(sizes.block_floats) +
                          " floats exceeds the grid limit of " + std::to_string(kMaxGridX) + " blocks of " +
                          std::to_string(kThreads) + " threads");
  }
  if (sizes.items > kMaxGridY) {
    throw InvalidArgument("CUDA augmenter: " + std::to_string(sizes.items) + " items per device batch exceed the " +
                          "grid limit of " + std::to_string(kMaxGridY));
  }
}

bool does_work(const Augmenter::Item& item) {
  const Recipe& r = item.recipe;
  return item.frames > 0 && (r.rir >= 0 || r.noise >= 0 || r.gain_db != 0.0);
}

void check_items(std::span<const Augmenter::Item> items, std::span<const int64_t> noise_lengths, int64_t rir_count,
                 const AugmentBufferSizes& sizes) {
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Augmenter::Item& item = items[i];
    const Recipe& r = item.recipe;
    const std::string name = "CUDA augmenter: item " + std::to_string(i) + ": ";
    const auto size = static_cast<int64_t>(item.samples.size());
    if (item.frames < 0 || item.frames > size) {
      throw InvalidArgument(name + "frames " + std::to_string(item.frames) + " outside [0, " + std::to_string(size) +
                            "]");
    }
    if (r.rir >= rir_count) {
      throw InvalidArgument(name + "impulse response " + std::to_string(r.rir) + " outside the bank of " +
                            std::to_string(rir_count));
    }
    if (r.noise >= static_cast<int64_t>(noise_lengths.size())) {
      throw InvalidArgument(name + "noise clip " + std::to_string(r.noise) + " outside the bank of " +
                            std::to_string(noise_lengths.size()));
    }
    if (r.noise >= 0 && (r.noise_offset < 0 || r.noise_offset >= noise_lengths[static_cast<size_t>(r.noise)])) {
      throw InvalidArgument(name + "noise offset " + std::to_string(r.noise_offset) + " outside its clip of " +
                            std::to_string(noise_lengths[static_cast<size_t>(r.noise)]) + " samples");
    }
    total += size;
  }
  if (total > sizes.max_batch_samples) {
    throw InvalidArgument("CUDA augmenter: " + std::to_string(items.size()) + " items hold " + std::to_string(total) +
                          " samples, more than max_batch_samples " + std::to_string(sizes.max_batch_samples));
  }
}

namespace {

/// Appends the overlap-add blocks of the plan's items convolved at FFT size `n`, cut into chunks.
void add_ola_blocks(BatchPlan& plan, std::span<const Augmenter::Item> items, std::span<const RirInfo> rirs,
                    int64_t n, int64_t chunk_floats) {
  const int64_t cap = chunk_blocks(n, chunk_floats);
  const auto group_first = static_cast<int64_t>(plan.blocks.size());
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const Augmenter::Item& item = items[static_cast<size_t>(plan.items[k])];
    if (item.recipe.rir < 0) continue;
    const RirInfo& rir = rirs[static_cast<size_t>(item.recipe.rir)];
    if (rir.fft_size != n) continue;
    const int64_t blocks = ola_blocks(item.frames, rir.taps);
    for (int64_t b = 0; b < blocks; ++b) {
      OlaBlock e;
      e.offset = plan.params[k].offset;
      e.frames = item.frames;
      e.block = b;
      e.hop = rir.hop;
      e.direct = rir.direct;
      e.spectrum_offset = rir.spectrum_offset;
      const int64_t c = (static_cast<int64_t>(plan.blocks.size()) - group_first) % cap;
      e.prev_in_chunk = b > 0 && c > 0 ? 1 : 0;
      e.last_in_chunk = b + 1 == blocks || c + 1 == cap ? 1 : 0;
      plan.blocks.push_back(e);
    }
  }
  const auto group_end = static_cast<int64_t>(plan.blocks.size());
  for (int64_t first = group_first; first < group_end; first += cap) {
    plan.chunks.push_back({n, first, std::min(cap, group_end - first)});
  }
}

/// Fills the plan's item table and tables for the items already listed in plan.items.
void finish_plan(BatchPlan& plan, std::span<const Augmenter::Item> items, std::span<const RirInfo> rirs,
                 std::span<const int64_t> noise_offsets, std::span<const int64_t> noise_lengths,
                 const AugmentBufferSizes& sizes) {
  for (const int64_t index : plan.items) {
    const Augmenter::Item& item = items[static_cast<size_t>(index)];
    const Recipe& r = item.recipe;
    ItemParams p;
    p.offset = plan.samples;
    p.frames = item.frames;
    p.energy_offset = plan.energy_frames;
    p.reverb = r.rir >= 0 ? 1 : 0;
    if (r.noise >= 0) {
      p.noise = 1;
      p.noise_begin = noise_offsets[static_cast<size_t>(r.noise)];
      p.noise_size = noise_lengths[static_cast<size_t>(r.noise)];
      p.noise_offset = r.noise_offset;
      plan.energy_frames += energy_frame_count(item.frames, sizes.frame_samples);
    }
    plan.params.push_back(p);
    plan.samples += item.frames;
    plan.max_frames = std::max(plan.max_frames, item.frames);
    plan.reverb = plan.reverb || p.reverb != 0;
    plan.noise = plan.noise || p.noise != 0;
  }
  for (const int64_t n : sizes.fft_sizes) add_ola_blocks(plan, items, rirs, n, sizes.chunk_floats);
}

}  // namespace

std::vector<BatchPlan> plan_batches(std::span<const Augmenter::Item> items, std::span<const RirInfo> rirs,
                                    std::span<const int64_t> noise_offsets, std::span<const int64_t> noise_lengths,
                                    const AugmentBufferSizes& sizes) {
  std::vector<BatchPlan> plans;
  BatchPlan current;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!does_work(items[i])) continue;
    if (static_cast<int64_t>(current.items.size()) == sizes.items) {
      plans.push_back(std::move(current));
      current = BatchPlan{};
    }
    current.items.push_back(static_cast<int64_t>(i));
  }
  if (!current.items.empty()) plans.push_back(std::move(current));
  for (BatchPlan& plan : plans) finish_plan(plan, items, rirs, noise_offsets, noise_lengths, sizes);
  return plans;
}

BankLayout bank_layout(const Bank& noise, const Bank& rir) {
  BankLayout l;
  int64_t noise_floats = 0;
  for (const Clip& c : noise.clips) {
    l.noise_offsets.push_back(noise_floats);
    l.noise_lengths.push_back(static_cast<int64_t>(c.samples.size()));
    noise_floats += static_cast<int64_t>(c.samples.size());
  }
  int64_t spectrum_offset = 0;
  for (const Clip& c : rir.clips) {
    l.prepared.push_back(prepare_rir(c.samples));
    RirInfo info;
    info.taps = static_cast<int64_t>(c.samples.size());
    info.fft_size = ola_fft_size(info.taps);
    info.hop = ola_hop(info.taps);
    info.direct = l.prepared.back().direct;
    info.spectrum_offset = spectrum_offset;
    spectrum_offset += info.fft_size / 2 + 1;
    l.rirs.push_back(info);
    l.rir_lengths.push_back(info.taps);
  }
  return l;
}

std::vector<float> item_scales(const BatchPlan& plan, std::span<const Augmenter::Item> items,
                               std::span<const double> energy, int64_t frame_samples) {
  std::vector<float> scales;
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const ItemParams& p = plan.params[k];
    const Recipe& r = items[static_cast<size_t>(plan.items[k])].recipe;
    float factor = 0.0f;
    if (p.noise != 0) {
      const auto frames = static_cast<size_t>(energy_frame_count(p.frames, frame_samples));
      const auto first = static_cast<size_t>(p.energy_offset);
      const auto noise_first = static_cast<size_t>(plan.energy_frames + p.energy_offset);
      const ActivePower power = active_power_from_energies(energy.subspan(first, frames),
                                                           energy.subspan(noise_first, frames), p.frames,
                                                           frame_samples);
      factor = static_cast<float>(noise_factor(power, r.snr_db));
    }
    scales.push_back(factor);
    scales.push_back(static_cast<float>(db_to_amplitude(r.gain_db)));
  }
  return scales;
}

ActivePower active_power_from_energies(std::span<const double> signal_energy, std::span<const double> noise_energy,
                                       int64_t frames, int64_t frame_samples) {
  ActivePower power;
  double loudest = 0.0;
  for (const double e : signal_energy) loudest = std::max(loudest, e);
  if (loudest <= 0.0) return power;
  const double floor = loudest * std::pow(10.0, -kActiveRangeDb / 10.0);
  double signal = 0.0;
  double noise = 0.0;
  for (size_t f = 0; f < signal_energy.size(); ++f) {
    if (signal_energy[f] < floor) continue;
    const int64_t begin = static_cast<int64_t>(f) * frame_samples;
    power.active_samples += std::min(frame_samples, frames - begin);
    signal += signal_energy[f];
    noise += noise_energy[f];
  }
  power.signal = signal / static_cast<double>(power.active_samples);
  power.noise = noise / static_cast<double>(power.active_samples);
  return power;
}

}  // namespace melforge::augment::cuda
