// CPU tests of the CUDA augmenter's CUDA-free parts (augment_cuda.h, augment_cuda_host.cpp, augment_cuda_kernels.h):
// the buffer sizes, the batch plan, the active-power selection against active_power(), and the whole device
// pipeline run on the CPU (the kernels' bodies over their grids, a double-precision FFT in place of cuFFT) against
// the CPU augmenter.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <numeric>
#include <vector>

#include "augment/augment.h"
#include "augment/augment_cuda.h"
#include "augment/augment_cuda_kernels.h"
#include "augment/augment_math.h"
#include "augment_cases.h"
#include "melforge/common/errors.h"

namespace melforge_test_augment_cuda_host {

using namespace melforge;
using namespace melforge::augment;
using namespace melforge::augment::cuda;
using namespace melforge::test;

namespace {

/// In-place radix-2 FFT in double (n a power of two); `inverse`: e^{+i}, unnormalised.
void fft(std::vector<std::complex<double>>& a, bool inverse) {
  const size_t n = a.size();
  for (size_t i = 1, j = 0; i < n; ++i) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (size_t len = 2; len <= n; len <<= 1) {
    const double ang = 2.0 * M_PI / static_cast<double>(len) * (inverse ? 1.0 : -1.0);
    for (size_t i = 0; i < n; i += len) {
      for (size_t k = 0; k < len / 2; ++k) {
        const std::complex<double> w = std::polar(1.0, ang * static_cast<double>(k));
        const std::complex<double> u = a[i + k];
        const std::complex<double> v = a[i + k + len / 2] * w;
        a[i + k] = u + v;
        a[i + k + len / 2] = u - v;
      }
    }
  }
}

/// cuFFT R2C of one row: n reals to n / 2 + 1 bins.
void r2c(const float* in, Complex* out, int64_t n) {
  std::vector<std::complex<double>> a(in, in + n);
  fft(a, false);
  for (int64_t k = 0; k <= n / 2; ++k) out[k] = {static_cast<float>(a[k].real()), static_cast<float>(a[k].imag())};
}

/// cuFFT C2R of one row: n / 2 + 1 bins (imaginary parts of DC and Nyquist ignored) to n reals, unnormalised.
void c2r(const Complex* in, float* out, int64_t n) {
  std::vector<std::complex<double>> a(static_cast<size_t>(n));
  for (int64_t k = 0; k <= n / 2; ++k) {
    const bool real_only = k == 0 || k == n / 2;
    a[k] = {in[k].re, real_only ? 0.0 : in[k].im};
    if (k > 0 && k < n / 2) a[n - k] = std::conj(a[k]);
  }
  fft(a, true);
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(a[j].real());
}

/// Runs body(block, thread) over a one-dimensional grid covering `elements` threads.
template <class Body>
void launch(int64_t elements, Body body) {
  for (int64_t b = 0; b < grid_for(elements); ++b) {
    for (int t = 0; t < kThreads; ++t) body(b, t);
  }
}

/// The energy kernel's block for (frame f, item): partial sums per thread, then the same shared-memory tree.
void emulate_energy(const ItemArgs& a, int64_t item, int64_t f, int64_t stride) {
  std::vector<double> s(kThreads);
  std::vector<double> n(kThreads);
  for (int t = 0; t < kThreads; ++t) energy_partial(a, item, f, t, kThreads, &s[t], &n[t]);
  for (int half = kThreads / 2; half > 0; half /= 2) {
    for (int t = 0; t < half; ++t) {
      s[t] += s[t + half];
      n[t] += n[t + half];
    }
  }
  a.energy[a.items[item].energy_offset + f] = s[0];
  a.energy[stride + a.items[item].energy_offset + f] = n[0];
}

/// Emulation of the device state of one augmenter (bank copies and spectra) and of apply(), on the CPU. Rows of a
/// chunk past its entries are zeros on the device and not transformed here.
class EmulatedAugmenter {
 public:
  EmulatedAugmenter(const Bank& noise, const Bank& rir, int sample_rate, int64_t max_batch, int64_t chunk_floats)
      : layout_(bank_layout(noise, rir)),
        sizes_(augment_buffer_sizes(layout_.noise_lengths, layout_.rir_lengths, sample_rate, max_batch,
                                    chunk_floats)) {
    for (const Clip& c : noise.clips) noise_.insert(noise_.end(), c.samples.begin(), c.samples.end());
    REQUIRE(static_cast<int64_t>(noise_.size()) == sizes_.noise_floats);
    rir_spectra_.resize(static_cast<size_t>(sizes_.rir_spectrum_complex));
    for (size_t c = 0; c < layout_.rirs.size(); ++c) {
      std::vector<float> padded(static_cast<size_t>(layout_.rirs[c].fft_size), 0.0f);
      std::copy(layout_.prepared[c].taps.begin(), layout_.prepared[c].taps.end(), padded.begin());
      r2c(padded.data(), rir_spectra_.data() + layout_.rirs[c].spectrum_offset, layout_.rirs[c].fft_size);
    }
  }

  void apply(std::span<Augmenter::Item> items) {
    check_items(items, layout_.noise_lengths, static_cast<int64_t>(layout_.rirs.size()), sizes_);
    for (const BatchPlan& plan : plan_batches(items, layout_.rirs, layout_.noise_offsets, layout_.noise_lengths,
                                              sizes_)) {
      REQUIRE(static_cast<int64_t>(plan.blocks.size()) <= sizes_.block_entries);
      REQUIRE(plan.energy_frames <= sizes_.energy_frames);
      REQUIRE(static_cast<int64_t>(plan.items.size()) <= sizes_.items);
      run_batch(plan, items);
    }
  }

  const AugmentBufferSizes& sizes() const { return sizes_; }

 private:
  void run_batch(const BatchPlan& plan, std::span<Augmenter::Item> items) {
    std::vector<float> signal(static_cast<size_t>(sizes_.signal_floats), -7.0f);
    std::vector<float> out(static_cast<size_t>(sizes_.out_floats), -9.0f);
    for (size_t k = 0; k < plan.items.size(); ++k) {
      const Augmenter::Item& item = items[static_cast<size_t>(plan.items[k])];
      std::copy(item.samples.begin(), item.samples.begin() + item.frames, signal.begin() + plan.params[k].offset);
    }
    if (plan.reverb) reverberate(plan, signal, out);
    ItemArgs a;
    a.signal = signal.data();
    a.out = out.data();
    a.noise = noise_.data();
    a.items = plan.params.data();
    std::vector<double> energy(static_cast<size_t>(2 * sizes_.energy_frames), -1.0);
    a.energy = energy.data();
    a.count = static_cast<int64_t>(plan.items.size());
    a.frame_samples = sizes_.frame_samples;
    for (int64_t item = 0; item < a.count; ++item) {
      if (a.items[item].noise == 0) continue;
      const int64_t frames = energy_frame_count(a.items[item].frames, a.frame_samples);
      for (int64_t f = 0; f < frames; ++f) emulate_energy(a, item, f, plan.energy_frames);
    }
    const std::vector<float> scales = item_scales(plan, items, energy, sizes_.frame_samples);
    a.scales = scales.data();
    for (int64_t item = 0; item < a.count; ++item) {
      for (int64_t t = 0; t < plan.max_frames; ++t) mix_element(a, item, t);
    }
    for (size_t k = 0; k < plan.items.size(); ++k) {
      Augmenter::Item& item = items[static_cast<size_t>(plan.items[k])];
      std::copy(signal.begin() + plan.params[k].offset, signal.begin() + plan.params[k].offset + item.frames,
                item.samples.begin());
    }
  }

  void reverberate(const BatchPlan& plan, const std::vector<float>& signal, std::vector<float>& out) {
    std::fill(out.begin(), out.begin() + plan.samples, 0.0f);
    std::vector<float> blocks(static_cast<size_t>(sizes_.block_floats), -5.0f);
    std::vector<Complex> spectra(static_cast<size_t>(sizes_.spectrum_complex), Complex{-3.0f, -3.0f});
    for (const OlaChunk& chunk : plan.chunks) {
      ChunkArgs a;
      a.signal = signal.data();
      a.out = out.data();
      a.blocks = blocks.data();
      a.spectra = spectra.data();
      a.rir_spectra = rir_spectra_.data();
      a.table = plan.blocks.data() + chunk.first;
      a.count = chunk.count;
      a.capacity = chunk_blocks(chunk.fft_size, sizes_.chunk_floats);
      a.fft_size = chunk.fft_size;
      a.scale = 1.0f / static_cast<float>(chunk.fft_size);
      REQUIRE(a.capacity * a.fft_size <= sizes_.block_floats);
      REQUIRE(a.capacity * (a.fft_size / 2 + 1) <= sizes_.spectrum_complex);
      const int64_t n = a.fft_size;
      const int64_t bins = n / 2 + 1;
      launch(a.capacity * n, [&](int64_t b, int t) { gather_element(a, b, t, kThreads); });
      for (int64_t c = 0; c < a.count; ++c) r2c(blocks.data() + c * n, spectra.data() + c * bins, n);
      launch(a.count * bins, [&](int64_t b, int t) { product_element(a, b, t, kThreads); });
      for (int64_t c = 0; c < a.count; ++c) c2r(spectra.data() + c * bins, blocks.data() + c * n, n);
      launch(a.count * n, [&](int64_t b, int t) { overlap_add_element(a, b, t, kThreads); });
    }
  }

  BankLayout layout_;
  AugmentBufferSizes sizes_;
  std::vector<float> noise_;
  std::vector<Complex> rir_spectra_;
};

/// A recipe-free item of `size` samples, `frames` of audio, for check_items and plan_batches.
Augmenter::Item plain_item(std::vector<float>& buf, int64_t frames, Recipe r) {
  Augmenter::Item item;
  item.recipe = r;
  item.samples = buf;
  item.frames = frames;
  return item;
}

}  // namespace

TEST_CASE("augment_buffer_sizes: every buffer from its formula, in 64 bits", "[augment][cuda_host]") {
  const std::vector<int64_t> rir_lengths = GENERATE(std::vector<int64_t>{}, std::vector<int64_t>{1},
                                                    std::vector<int64_t>{2048, 2049, 100, 30000, 2049});
  const int64_t max_batch = GENERATE(int64_t{1}, int64_t{1000}, int64_t{1} << 24, int64_t{1} << 40);
  const int rate = GENERATE(8000, 16000, 44100);
  const std::vector<int64_t> noise_lengths{5, int64_t{1} << 33, 12345};
  CAPTURE(rir_lengths, max_batch, rate);
  const AugmentBufferSizes s = augment_buffer_sizes(noise_lengths, rir_lengths, rate, max_batch);
  CHECK(s.max_batch_samples == max_batch);
  CHECK(s.signal_floats == max_batch);
  CHECK(s.out_floats == max_batch);
  CHECK(s.noise_floats == 5 + (int64_t{1} << 33) + 12345);
  CHECK(s.noise_bytes() == 4 * s.noise_floats);
  CHECK(s.chunk_floats == kOlaChunkFloats);
  int64_t spectra = 0;
  int64_t min_hop = 0;
  std::vector<int64_t> sizes;
  for (const int64_t l : rir_lengths) {
    const int64_t n = ola_fft_size(l);
    REQUIRE((n & (n - 1)) == 0);
    REQUIRE(n >= 2 * l);
    spectra += n / 2 + 1;
    sizes.push_back(n);
    min_hop = min_hop == 0 ? ola_hop(l) : std::min(min_hop, ola_hop(l));
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  CHECK(s.fft_sizes == sizes);
  CHECK(s.rir_spectrum_complex == spectra);
  int64_t block_floats = 0;
  int64_t spectrum_complex = 0;
  for (const int64_t n : sizes) {
    block_floats = std::max(block_floats, std::max<int64_t>(1, kOlaChunkFloats / n) * n);
    spectrum_complex = std::max(spectrum_complex, std::max<int64_t>(1, kOlaChunkFloats / n) * (n / 2 + 1));
  }
  CHECK(s.block_floats == block_floats);
  CHECK(s.spectrum_complex == spectrum_complex);
  CHECK(s.items == std::min<int64_t>(4096, max_batch));
  CHECK(s.block_entries == (min_hop > 0 ? max_batch / min_hop + s.items + 1 : 0));
  CHECK(s.frame_samples == std::llround(rate * 0.02));
  CHECK(s.energy_frames == max_batch / s.frame_samples + s.items);
  CHECK(s.signal_bytes() == 4 * max_batch);
  CHECK(s.energy_bytes() == 16 * s.energy_frames);
  CHECK(s.scale_bytes() == 8 * s.items);
  CHECK(s.block_table_bytes() == s.block_entries * static_cast<int64_t>(sizeof(OlaBlock)));
  CHECK(s.item_table_bytes() == s.items * static_cast<int64_t>(sizeof(ItemParams)));
  CHECK(s.device_bytes() == s.signal_bytes() + s.out_bytes() + s.noise_bytes() + s.rir_spectrum_bytes() +
                                s.block_bytes() + s.spectrum_bytes() + s.block_table_bytes() + s.item_table_bytes() +
                                s.scale_bytes() + s.energy_bytes());
  CHECK(s.pinned_bytes() ==
        s.signal_bytes() + s.block_table_bytes() + s.item_table_bytes() + s.scale_bytes() + s.energy_bytes());
  CHECK(s.device_bytes() > 0);
  CHECK(s.pinned_bytes() > 0);
  CHECK_NOTHROW(check_launch_limits(s));
}

TEST_CASE("augment_buffer_sizes and check_launch_limits reject what cannot run", "[augment][cuda_host]") {
  const std::vector<int64_t> none;
  CHECK_THROWS_AS(augment_buffer_sizes(none, none, 16000, 0), InvalidArgument);
  CHECK_THROWS_AS(augment_buffer_sizes(none, none, 0, 100), InvalidArgument);
  CHECK_THROWS_AS(augment_buffer_sizes(none, none, 16000, 100, 0), InvalidArgument);
  AugmentBufferSizes s = augment_buffer_sizes(none, std::vector<int64_t>{3000}, 16000, 1000);
  CHECK_NOTHROW(check_launch_limits(s));
  s.items = kMaxGridY + 1;
  CHECK_THROWS_WITH(check_launch_limits(s), Catch::Contains("65535"));
  s.items = kMaxGridY;
  CHECK_NOTHROW(check_launch_limits(s));
  s.block_floats = kMaxGridX * kThreads + 1;
  CHECK_THROWS_WITH(check_launch_limits(s), Catch::Contains("grid limit"));
  s.block_floats = kMaxGridX * kThreads;
  CHECK_NOTHROW(check_launch_limits(s));
  CHECK(kMaxItemsPerBatch <= kMaxGridY);
}

TEST_CASE("prepare_rir: unit energy, the first largest tap, silence kept", "[augment][cuda_host]") {
  const int64_t taps = GENERATE(int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4097});
  const int64_t peak = GENERATE_COPY(int64_t{0}, taps / 2, taps - 1);
  const std::vector<float> h = augment_rir(taps, peak, 3);
  const PreparedRir r = prepare_rir(h);
  double energy = 0.0;
  for (const float v : r.taps) energy += static_cast<double>(v) * v;
  CHECK(energy == Approx(1.0).epsilon(1e-5));
  CHECK(r.direct == peak);
  CHECK(direct_path(h) == peak);
  std::vector<float> tie(static_cast<size_t>(taps), 0.5f);
  tie.back() = -0.5f;
  CHECK(direct_path(tie) == 0);
  const PreparedRir silent = prepare_rir(std::vector<float>(static_cast<size_t>(taps), 0.0f));
  CHECK(std::all_of(silent.taps.begin(), silent.taps.end(), [](float v) { return v == 0.0f; }));
  CHECK(silent.direct == 0);
}

TEST_CASE("active_power_from_energies selects the frames active_power selects", "[augment][cuda_host]") {
  const int rate = GENERATE(8000, 16000, 22050);
  const int64_t frames = GENERATE(int64_t{1}, int64_t{159}, int64_t{160}, int64_t{4801}, int64_t{30000});
  const int64_t offset = GENERATE(int64_t{0}, int64_t{1999});
  CAPTURE(rate, frames, offset);
  const std::vector<float> x = augment_signal(frames, 11);
  const Bank noise = augment_noise_bank();
  const std::vector<float>& clip = noise.clips[0].samples;
  const int64_t f = active_frame_samples(rate);
  std::vector<double> se;
  std::vector<double> ne;
  for (int64_t b = 0; b < frames; b += f) {
    double s = 0.0;
    double n = 0.0;
    for (int64_t i = b; i < std::min(frames, b + f); ++i) {
      s += static_cast<double>(x[i]) * x[i];
      const double w = clip[static_cast<size_t>(loop_index(offset, i, static_cast<int64_t>(clip.size())))];
      n += w * w;
    }
    se.push_back(s);
    ne.push_back(n);
  }
  const ActivePower want = active_power(x, clip, offset, rate);
  const ActivePower got = active_power_from_energies(se, ne, frames, f);
  CHECK(got.active_samples == want.active_samples);
  CHECK(got.signal == Approx(want.signal).epsilon(1e-12));
  CHECK(got.noise == Approx(want.noise).epsilon(1e-12));
  const std::vector<double> zeros(se.size(), 0.0);
  const ActivePower silent = active_power_from_energies(zeros, ne, frames, f);
  CHECK(silent.active_samples == 0);
  CHECK(noise_factor(silent, 10.0) == 0.0);
}

TEST_CASE("check_items refuses bad items before any work", "[augment][cuda_host]") {
  const std::vector<int64_t> noise{100, 50};
  const AugmentBufferSizes s = augment_buffer_sizes(noise, std::vector<int64_t>{300}, 16000, 1000);
  std::vector<float> a(600);
  std::vector<float> b(400);
  const Recipe plain = augment_recipe(0, 1, 49, 10.0, 0.0);
  std::vector<Augmenter::Item> items{plain_item(a, 600, plain), plain_item(b, 400, plain)};
  CHECK_NOTHROW(check_items(items, noise, 1, s));
  SECTION("more samples than max_batch_samples") {
    std::vector<float> c(1);
    items.push_back(plain_item(c, 0, Recipe{}));
    CHECK_THROWS_WITH(check_items(items, noise, 1, s), Catch::Contains("max_batch_samples 1000"));
  }
  SECTION("frames past the span") {
    items[1].frames = 401;
    CHECK_THROWS_WITH(check_items(items, noise, 1, s), Catch::Contains("item 1"));
  }
  SECTION("impulse response outside the bank") {
    items[0].recipe.rir = 1;
    CHECK_THROWS_AS(check_items(items, noise, 1, s), InvalidArgument);
  }
  SECTION("noise offset outside its clip") {
    items[0].recipe.noise_offset = 50;
    CHECK_THROWS_WITH(check_items(items, noise, 1, s), Catch::Contains("noise offset 50"));
  }
}

TEST_CASE("plan_batches: packing, block table, chunks and item split", "[augment][cuda_host]") {
  const int64_t chunk_floats = GENERATE(int64_t{kOlaChunkFloats}, int64_t{3 * 4096}, int64_t{1});
  const int64_t count = GENERATE(int64_t{5}, kMaxItemsPerBatch + 3);
  CAPTURE(chunk_floats, count);
  const BankLayout layout = bank_layout(augment_noise_bank(), augment_rir_bank({1000, 3000}));
  const int64_t each = 9000;
  const AugmentBufferSizes s =
      augment_buffer_sizes(layout.noise_lengths, layout.rir_lengths, 16000, count * each, chunk_floats);
  std::vector<std::vector<float>> bufs(static_cast<size_t>(count), std::vector<float>(each));
  std::vector<Augmenter::Item> items;
  for (int64_t i = 0; i < count; ++i) {
    const int rir = static_cast<int>(i % 3) - 1;
    const double gain = i % 4 == 0 ? 0.0 : -2.0;
    items.push_back(plain_item(bufs[static_cast<size_t>(i)], each - i % 7, augment_recipe(rir, -1, 0, 0.0, gain)));
  }
  const std::vector<BatchPlan> plans = plan_batches(items, layout.rirs, layout.noise_offsets, layout.noise_lengths, s);
  int64_t packed = 0;
  int64_t previous = -1;
  for (const BatchPlan& p : plans) {
    REQUIRE(static_cast<int64_t>(p.items.size()) <= s.items);
    REQUIRE(static_cast<int64_t>(p.blocks.size()) <= s.block_entries);
    int64_t offset = 0;
    for (size_t k = 0; k < p.items.size(); ++k) {
      const Augmenter::Item& item = items[static_cast<size_t>(p.items[k])];
      REQUIRE(does_work(item));
      REQUIRE(p.items[k] > previous);
      previous = p.items[k];
      CHECK(p.params[k].offset == offset);
      CHECK(p.params[k].reverb == (item.recipe.rir >= 0 ? 1 : 0));
      offset += item.frames;
      ++packed;
      int64_t blocks = 0;
      for (const OlaBlock& b : p.blocks) blocks += b.offset == p.params[k].offset ? 1 : 0;
      CHECK(blocks == (item.recipe.rir >= 0 ? ola_blocks(item.frames, layout.rirs[item.recipe.rir].taps) : 0));
    }
    CHECK(p.samples == offset);
    int64_t covered = 0;
    for (const OlaChunk& c : p.chunks) {
      REQUIRE(c.first == covered);
      REQUIRE(c.count >= 1);
      REQUIRE(c.count <= chunk_blocks(c.fft_size, s.chunk_floats));
      for (int64_t e = c.first; e < c.first + c.count; ++e) {
        const OlaBlock& b = p.blocks[static_cast<size_t>(e)];
        const bool prev = e > c.first && p.blocks[e - 1].offset == b.offset;
        const bool next = e + 1 < c.first + c.count && p.blocks[e + 1].offset == b.offset;
        CHECK(b.prev_in_chunk == (prev ? 1 : 0));
        CHECK(b.last_in_chunk == (next ? 0 : 1));
        if (prev) CHECK(p.blocks[e - 1].block + 1 == b.block);
      }
      covered += c.count;
    }
    CHECK(covered == static_cast<int64_t>(p.blocks.size()));
  }
  int64_t working = 0;
  for (const Augmenter::Item& item : items) working += does_work(item) ? 1 : 0;
  CHECK(packed == working);
  CHECK(static_cast<int64_t>(plans.size()) == (working + s.items - 1) / s.items);
}

TEST_CASE("the CUDA pipeline's kernel bodies, run on the CPU, match the CPU augmenter", "[augment][cuda_host]") {
  const std::vector<int64_t> rir_lengths = GENERATE(std::vector<int64_t>{1}, std::vector<int64_t>{1000},
                                                    std::vector<int64_t>{2048, 3000});
  const int64_t frames = GENERATE(int64_t{1}, int64_t{3097}, int64_t{20000});
  const double snr = GENERATE(0.0, 25.0);
  const double gain = GENERATE(0.0, -6.0);
  const int64_t chunk_floats = GENERATE(int64_t{kOlaChunkFloats}, int64_t{2 * 4096});
  const int rir = static_cast<int>(rir_lengths.size()) - 1;
  CAPTURE(rir_lengths, frames, snr, gain, chunk_floats);
  const Bank noise = augment_noise_bank();
  const Bank rirs = augment_rir_bank(rir_lengths);
  compare_with_cpu(noise, rirs, 16000, augment_cases(frames, rir, snr, gain), [&](AugmentBatch& got) {
    EmulatedAugmenter emulated(noise, rirs, 16000, got.samples, chunk_floats);
    emulated.apply(got.items);
  });
}

}  // namespace melforge_test_augment_cuda_host
