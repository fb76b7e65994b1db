// The CPU augmenter (augment.h): reverberation by overlap-add FFT convolution (FFTW, float), noise mixed at the
// recipe's SNR on the active signal, then gain. Per-element math from augment_math.h. FFTW plans are made once per
// FFT size under the process's planner lock and executed with the new-array functions, which are thread-safe, on
// per-call buffers, so that apply() may run on several threads at once. Plans use FFTW_ESTIMATE: the algorithm does
// not depend on timings, so a copy is bitwise the same in every run.
#include <fftw3.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "augment/augment.h"
#include "augment/augment_math.h"
#include "melforge/common/errors.h"
#include "melforge/common/fftw_lock.h"

namespace melforge::augment {
namespace {

/// An fftwf_malloc'ed array (SIMD-aligned, as the new-array execute functions require), zero-filled.
template <class T>
class FftwArray {
 public:
  explicit FftwArray(int64_t count) : data_(static_cast<T*>(fftwf_malloc(sizeof(T) * static_cast<size_t>(count)))) {
    if (data_ == nullptr) throw Error("fftwf_malloc of " + std::to_string(sizeof(T) * count) + " bytes failed");
    std::fill(reinterpret_cast<char*>(data_), reinterpret_cast<char*>(data_ + count), char{0});
  }
  ~FftwArray() { fftwf_free(data_); }
  FftwArray(const FftwArray&) = delete;
  FftwArray& operator=(const FftwArray&) = delete;
  /// The array.
  T* get() const { return data_; }

 private:
  T* data_;
};

/// Calls fn(i, j, count) for the runs of signal samples [begin, end) whose noise samples
/// clip[loop_index(offset, i, size)] are contiguous: signal i.. i+count-1 read clip j.. j+count-1. The same indices
/// as loop_index() per sample, without a division per sample.
template <class F>
void for_each_noise_run(int64_t offset, int64_t begin, int64_t end, int64_t size, F&& fn) {
  for (int64_t i = begin; i < end;) {
    const int64_t j = loop_index(offset, i, size);
    const int64_t count = std::min(end - i, size - j);
    fn(i, j, count);
    i += count;
  }
}

/// The forward and inverse real plans of one FFT size, planned out of place.
struct Plans {
  fftwf_plan forward = nullptr;
  fftwf_plan inverse = nullptr;
};

/// One call's buffers for an FFT of `n` points: a real block and two half spectra.
struct Scratch {
  explicit Scratch(int64_t n) : real(n), block(n / 2 + 1), rir(n / 2 + 1) {}
  FftwArray<float> real;
  FftwArray<fftwf_complex> block;
  FftwArray<fftwf_complex> rir;
};

/// The impulse response `h` normalised to unit energy, and its direct path (the first tap of largest |h|).
struct Response {
  std::vector<float> taps;
  int64_t direct = 0;
};

Response normalise(const std::vector<float>& h) {
  Response r;
  double energy = 0.0;
  float peak = -1.0f;
  for (size_t k = 0; k < h.size(); ++k) {
    energy += static_cast<double>(h[k]) * h[k];
    if (std::fabs(h[k]) > peak) {
      peak = std::fabs(h[k]);
      r.direct = static_cast<int64_t>(k);
    }
  }
  const float scale = energy > 0.0 ? static_cast<float>(1.0 / std::sqrt(energy)) : 0.0f;
  r.taps.resize(h.size());
  for (size_t k = 0; k < h.size(); ++k) r.taps[k] = h[k] * scale;
  return r;
}

class CpuAugmenter final : public Augmenter {
 public:
  CpuAugmenter(const Bank& noise, const Bank& rir, int sample_rate)
      : noise_(noise), rir_(rir), sample_rate_(sample_rate) {
    if (sample_rate <= 0) throw InvalidArgument("cpu augmenter: sample rate must be > 0");
    for (const auto& c : rir.clips) max_rir_ = std::max<int64_t>(max_rir_, static_cast<int64_t>(c.samples.size()));
  }

  ~CpuAugmenter() override {
    std::lock_guard lock(fftw_planner_mutex());
    for (auto& [n, p] : plans_) {
      fftwf_destroy_plan(p.forward);
      fftwf_destroy_plan(p.inverse);
    }
  }

  void apply(std::span<Item> items) override {
    for (Item& item : items) apply_one(item);
  }

  std::string name() const override { return "cpu-fftw"; }

  /// The frame energies of active_power(), and with impulse responses the output copy, the normalised response,
  /// a real block and two half spectra of the largest FFT.
  int64_t item_bytes(int64_t frames) const override {
    const int64_t energies = (frames / 8 + 1) * static_cast<int64_t>(sizeof(double));
    if (max_rir_ == 0) return energies;
    const int64_t n = ola_fft_size(max_rir_);
    return energies + (frames + max_rir_ + n) * static_cast<int64_t>(sizeof(float)) +
           2 * (n / 2 + 1) * static_cast<int64_t>(sizeof(fftwf_complex));
  }

  int64_t device_bytes() const override { return 0; }

  int64_t host_bytes() const override { return 0; }

 private:
  void apply_one(Item& item) const {
    const Recipe& r = item.recipe;
    if (item.frames < 0 || item.frames > static_cast<int64_t>(item.samples.size()))
      throw InvalidArgument("augmenter: item frames " + std::to_string(item.frames) + " outside its " +
                            std::to_string(item.samples.size()) + " samples");
    const std::span<float> x = item.samples.first(static_cast<size_t>(item.frames));
    if (r.rir >= 0) reverberate(rir_.clips.at(static_cast<size_t>(r.rir)).samples, x);
    if (r.noise >= 0) add_noise(noise_.clips.at(static_cast<size_t>(r.noise)).samples, r, x);
    if (r.gain_db != 0.0) {
      const auto amplitude = static_cast<float>(db_to_amplitude(r.gain_db));
      for (float& v : x) v = gain_sample(v, amplitude);
    }
  }

  void add_noise(const std::vector<float>& clip, const Recipe& r, std::span<float> x) const {
    const ActivePower power = active_power(x, clip, r.noise_offset, sample_rate_);
    const auto factor = static_cast<float>(noise_factor(power, r.snr_db));
    for_each_noise_run(r.noise_offset, 0, static_cast<int64_t>(x.size()), static_cast<int64_t>(clip.size()),
                       [&](int64_t i, int64_t j, int64_t count) {
                         float* out = x.data() + i;
                         const float* n = clip.data() + j;
                         for (int64_t k = 0; k < count; ++k) out[k] = mix_sample(out[k], n[k], factor);
                       });
  }

  /// x <- the direct-path-aligned convolution of x with the unit-energy `h` (augment_math.h), tail dropped.
  void reverberate(const std::vector<float>& h, std::span<float> x) const {
    const auto frames = static_cast<int64_t>(x.size());
    const auto len = static_cast<int64_t>(h.size());
    if (frames == 0 || len == 0) return;
    const Response resp = normalise(h);
    const int64_t n = ola_fft_size(len);
    const int64_t hop = ola_hop(len);
    const int64_t bins = n / 2 + 1;
    const float scale = 1.0f / static_cast<float>(n);
    const Plans plans = plans_for(n);
    Scratch s(n);
    std::copy(resp.taps.begin(), resp.taps.end(), s.real.get());
    fftwf_execute_dft_r2c(plans.forward, s.real.get(), s.rir.get());
    std::vector<float> out(static_cast<size_t>(frames), 0.0f);
    const int64_t blocks = ola_blocks(frames, len);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * hop;
      const int64_t count = std::min(hop, frames - first);
      std::fill(s.real.get(), s.real.get() + n, 0.0f);
      std::copy(x.begin() + first, x.begin() + first + count, s.real.get());
      fftwf_execute_dft_r2c(plans.forward, s.real.get(), s.block.get());
      for (int64_t k = 0; k < bins; ++k) {
        float* a = s.block.get()[k];
        const float* h_k = s.rir.get()[k];
        spectrum_product(a[0], a[1], h_k[0], h_k[1], scale, &a[0], &a[1]);
      }
      fftwf_execute_dft_c2r(plans.inverse, s.block.get(), s.real.get());
      const int64_t j_end = std::min(n, count + len - 1);
      for (int64_t j = 0; j < j_end; ++j) {
        const int64_t t = ola_target(b, j, hop, resp.direct);
        if (t >= 0 && t < frames) out[static_cast<size_t>(t)] += s.real.get()[j];
      }
    }
    std::copy(out.begin(), out.end(), x.begin());
  }

  /// The plans of size `n`, made on first use under the planner lock.
  Plans plans_for(int64_t n) const {
    std::lock_guard cache(plans_mutex_);
    auto it = plans_.find(n);
    if (it != plans_.end()) return it->second;
    Scratch s(n);
    Plans p;
    {
      std::lock_guard lock(fftw_planner_mutex());
      const int size = static_cast<int>(n);
      p.forward = fftwf_plan_dft_r2c_1d(size, s.real.get(), s.block.get(), FFTW_ESTIMATE);
      p.inverse = fftwf_plan_dft_c2r_1d(size, s.block.get(), s.real.get(), FFTW_ESTIMATE);
    }
    if (p.forward == nullptr || p.inverse == nullptr)
      throw Error("FFTW could not plan real FFTs of size " + std::to_string(n));
    plans_.emplace(n, p);
    return p;
  }

  const Bank& noise_;
  const Bank& rir_;
  int sample_rate_;
  int64_t max_rir_ = 0;
  mutable std::mutex plans_mutex_;
  mutable std::map<int64_t, Plans> plans_;
};

}  // namespace

ActivePower active_power(std::span<const float> signal, std::span<const float> noise, int64_t offset,
                         int sample_rate) {
  ActivePower p;
  const auto frames = static_cast<int64_t>(signal.size());
  const auto frame = std::max<int64_t>(1, std::llround(kActiveFrameMs * sample_rate / 1000.0));
  const int64_t count = (frames + frame - 1) / frame;
  std::vector<double> energy(static_cast<size_t>(count), 0.0);
  double loudest = 0.0;
  for (int64_t f = 0; f < count; ++f) {
    double e = 0.0;
    for (int64_t i = f * frame; i < std::min(frames, (f + 1) * frame); ++i)
      e += static_cast<double>(signal[static_cast<size_t>(i)]) * signal[static_cast<size_t>(i)];
    energy[static_cast<size_t>(f)] = e;
    loudest = std::max(loudest, e);
  }
  if (loudest <= 0.0) return p;
  const double threshold = loudest * std::pow(10.0, -kActiveRangeDb / 10.0);
  const auto size = static_cast<int64_t>(noise.size());
  double signal_sum = 0.0, noise_sum = 0.0;
  for (int64_t f = 0; f < count; ++f) {
    if (energy[static_cast<size_t>(f)] < threshold) continue;
    const int64_t end = std::min(frames, (f + 1) * frame);
    signal_sum += energy[static_cast<size_t>(f)];
    p.active_samples += end - f * frame;
    if (size == 0) continue;
    for_each_noise_run(offset, f * frame, end, size, [&](int64_t, int64_t j, int64_t count) {
      for (int64_t k = j; k < j + count; ++k) noise_sum += static_cast<double>(noise[size_t(k)]) * noise[size_t(k)];
    });
  }
  p.signal = signal_sum / static_cast<double>(p.active_samples);
  p.noise = noise_sum / static_cast<double>(p.active_samples);
  return p;
}

double noise_factor(const ActivePower& power, double snr_db) {
  if (!(power.signal > 0.0) || !(power.noise > 0.0)) return 0.0;
  return std::sqrt(power.signal / (power.noise * std::pow(10.0, snr_db / 10.0)));
}

std::unique_ptr<Augmenter> make_cpu_augmenter(const Bank& noise, const Bank& rir, int sample_rate) {
  return std::make_unique<CpuAugmenter>(noise, rir, sample_rate);
}

}  // namespace melforge::augment
