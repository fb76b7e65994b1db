/// melforge._core.MelCompute: the CPU mel engine (kernels/mel/mel_engine.h) behind melforge.MelSpectrogram, with
/// torchaudio's `pad` and `normalized` applied around it (constant padding of the signal before the engine; the
/// normalisation factor on the mel power, then cpu_log_compress); MelCompute.fbank, the same engine with Kaldi's
/// filterbank (MelArgs::use_fbank) behind melforge.Fbank and melforge.compliance.kaldi.fbank; the bounded engine
/// cache they share (EngineCache; melforge.clear_cache) and the seeded dither noise of the torch path.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "fbank/fbank_args.h"
#include "fbank/fbank_math.h"
#include "mel/filterbank.h"
#include "mel/mel_args.h"
#include "mel/mel_cpu.h"
#include "mel/mel_engine.h"
#include "mel/mel_math.h"
#include "melforge/common/errors.h"

namespace nb = nanobind;

namespace melforge::python {
namespace {

/// torchaudio's `normalized`: none, window (`True` or "window": the STFT divided by sqrt(sum(window^2))), or
/// frame_length (torch.stft's normalized: divided by sqrt(n_fft)).
enum class Normalized { none, window, frame_length };

Normalized parse_normalized(const std::string& s) {
  if (s == "none") return Normalized::none;
  if (s == "window") return Normalized::window;
  if (s == "frame_length") return Normalized::frame_length;
  throw InvalidArgument("normalized must be False, True, 'window' or 'frame_length', got '" + s + "'");
}

/// A row-major float32 [rows, time] input array on the CPU.
using Input = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
/// The float32 [rows, n_mels, n_frames] (mel) or [rows, frames, bins] (fbank) output array.
using Output = nb::ndarray<nb::numpy, float, nb::ndim<3>>;
/// A float32 [rows, cols] output array (the dense filterbank, the dither noise).
using Matrix = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

/// Default bound of the engine cache, bytes: 256 MiB.
constexpr int64_t kDefaultCacheBytes = int64_t{256} << 20;

/// The process-wide cache of the engines every MelCompute builds, least recently used first out, bounded by the sum
/// of the engines' MelEngine::host_bytes(). An entry is keyed by (owner, samples, threads): each MelCompute (the
/// owner) sees only its own engines, and drops them when it is destroyed. An engine in use when evicted lives on
/// until its call returns (shared ownership); the entry just used is never evicted, so one engine larger than the
/// bound is kept alone.
class EngineCache {
 public:
  /// An engine and the mutex that serialises calls on it.
  struct Entry {
    std::shared_ptr<mel::MelEngine> engine;
    std::shared_ptr<std::mutex> mutex;
    int64_t bytes = 0;
  };
  /// (owner id, samples per row (0: any length), threads).
  using Key = std::tuple<uint64_t, int64_t, int>;

  /// The one cache of the process.
  static EngineCache& instance() {
    static EngineCache cache;
    return cache;
  }

  /// The entry for `key`, made most recent; built by `build` (outside the lock) when absent, then older entries
  /// are evicted until the total is within the limit.
  template <typename Build>
  Entry get(const Key& key, const Build& build) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    std::shared_ptr<mel::MelEngine> engine = build();
    Entry made{engine, std::make_shared<std::mutex>(), engine->host_bytes()};
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    lru_.emplace_front(key, made);
    index_[key] = lru_.begin();
    bytes_ += made.bytes;
    evict();
    return made;
  }

  /// Drops every entry of `owner`.
  void drop_owner(uint64_t owner) {
    std::lock_guard lock(mutex_);
    for (auto it = lru_.begin(); it != lru_.end();) it = std::get<0>(it->first) == owner ? erase(it) : std::next(it);
  }
  /// Drops every entry.
  void clear() {
    std::lock_guard lock(mutex_);
    lru_.clear();
    index_.clear();
    bytes_ = 0;
  }
  /// Entries of `owner`.
  int count(uint64_t owner) const {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& [key, entry] : lru_) n += std::get<0>(key) == owner ? 1 : 0;
    return n;
  }
  /// {"engines": entries, "bytes": their host bytes, "limit": the bound}.
  nb::dict info() const {
    std::lock_guard lock(mutex_);
    nb::dict d;
    d["engines"] = static_cast<int64_t>(lru_.size());
    d["bytes"] = bytes_;
    d["limit"] = limit_;
    return d;
  }
  /// Sets the bound (bytes, >= 0; 0 keeps only the engine in use) and evicts down to it.
  void set_limit(int64_t limit) {
    if (limit < 0) throw InvalidArgument("cache limit must be >= 0 bytes, got " + std::to_string(limit));
    std::lock_guard lock(mutex_);
    limit_ = limit;
    evict();
  }

 private:
  using List = std::list<std::pair<Key, Entry>>;
  List::iterator erase(List::iterator it) {
    bytes_ -= it->second.bytes;
    index_.erase(it->first);
    return lru_.erase(it);
  }
  void evict() {
    while (bytes_ > limit_ && lru_.size() > 1) erase(std::prev(lru_.end()));
  }

  mutable std::mutex mutex_;
  List lru_;
  std::map<Key, List::iterator> index_;
  int64_t bytes_ = 0;
  int64_t limit_ = kDefaultCacheBytes;
};

/// Mel spectrograms (or Kaldi filterbanks) of equal-length rows with one set of parameters; the engines live in
/// EngineCache, keyed per object and (samples per row after padding, threads), so that repeated calls reuse the
/// FFTW plans. A fbank object uses one engine per thread count for every length (MelEngine::compute_clips).
class MelCompute {
 public:
  /// `args` with log applied after the normalisation; `pad` samples of zeros on both sides of each row.
  MelCompute(const mel::MelArgs& args, int pad, const std::string& normalized)
      : args_(args), pad_(pad), normalized_(parse_normalized(normalized)) {
    if (pad < 0) throw InvalidArgument("pad must be >= 0, got " + std::to_string(pad));
    args_.validate();
    engine_args_ = args_;
    if (normalized_ != Normalized::none) engine_args_.log = mel::LogMode::none;
    scale_ = static_cast<float>(std::pow(magnitude_scale(), static_cast<double>(args_.power)));
  }
  MelCompute(const MelCompute&) = delete;
  MelCompute& operator=(const MelCompute&) = delete;
  ~MelCompute() { EngineCache::instance().drop_owner(id_); }

  /// torchaudio-style warning naming the mel bands without an FFT bin; "" when there is none (and for fbank).
  std::string empty_bands_warning() const { return args_.is_fbank() ? "" : mel::empty_bands_warning(args_); }

  /// Frames of a row of `samples` samples (before `pad`); for fbank, Kaldi's count (0 when it gives none).
  int n_frames(int64_t samples) const { return args_.n_frames(samples + 2 * static_cast<int64_t>(pad_)); }

  /// Output columns per frame: n_mels (mel) or the fbank bins (num_mel_bins, + 1 with use_energy).
  int n_mels() const { return args_.n_mels; }

  /// Spectrograms of the rows of `x` [rows, time] on `threads` threads (0: all cores): mel [rows, n_mels,
  /// n_frames]; fbank [rows, frames, bins] (each row a clip of MelEngine::compute_clips).
  Output compute(const Input& x, int threads) {
    if (threads < 0) throw InvalidArgument("threads must be >= 0 (0: all cores), got " + std::to_string(threads));
    const auto rows = static_cast<int64_t>(x.shape(0));
    const auto time = static_cast<int64_t>(x.shape(1));
    if (n_frames(time) < 1) throw InvalidArgument(no_frame_message(time));
    const int64_t frames = n_frames(time);
    const int64_t per_row = static_cast<int64_t>(args_.n_mels) * frames;
    auto* out = new float[static_cast<std::size_t>(std::max<int64_t>(rows * per_row, 1))];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    if (rows > 0) {
      nb::gil_scoped_release release;
      if (args_.is_fbank()) {
        run_fbank(x.data(), rows, time, threads, out);
      } else {
        run(x.data(), rows, time, threads, out);
      }
    }
    const auto shape = args_.is_fbank() ? std::array<std::size_t, 3>{std::size_t(rows), std::size_t(frames),
                                                                      std::size_t(args_.n_mels)}
                                        : std::array<std::size_t, 3>{std::size_t(rows), std::size_t(args_.n_mels),
                                                                      std::size_t(frames)};
    return Output(out, {shape[0], shape[1], shape[2]}, owner);
  }

  /// The dense mel filterbank, [n_freqs][n_mels] float32 as torchaudio's melscale_fbanks (mel only).
  Matrix filterbank() const {
    if (args_.is_fbank()) throw InvalidArgument("filterbank(): a fbank object has Kaldi's mel banks, not this one");
    const std::vector<float> dense = mel::cached_filterbank(args_)->dense();
    auto* out = new float[dense.size()];
    std::copy(dense.begin(), dense.end(), out);
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    return Matrix(out, {static_cast<std::size_t>(args_.n_freqs()), static_cast<std::size_t>(args_.n_mels)}, owner);
  }

  /// Number of engines of this object in the cache (one per distinct (time, threads); fbank: per threads).
  int cached_engines() const { return EngineCache::instance().count(id_); }

  /// The engine parameters, one line (MelArgs::to_string).
  std::string describe() const { return args_.to_string(); }

 private:
  std::string no_frame_message(int64_t time) const {
    if (args_.is_fbank())
      return "a signal of " + std::to_string(time) + " samples gives no fbank frame of " +
             std::to_string(args_.win()) + " samples";
    return "a signal of " + std::to_string(time) + " samples gives no frame with n_fft " +
           std::to_string(args_.n_fft) + (args_.center ? "" : " and center=False");
  }

  /// Factor on the STFT magnitude for `normalized`.
  double magnitude_scale() const {
    if (normalized_ == Normalized::frame_length) return 1.0 / std::sqrt(static_cast<double>(args_.n_fft));
    if (normalized_ == Normalized::none || args_.is_fbank()) return 1.0;
    double sum = 0.0;
    const int win = args_.win();
    for (int n = 0; n < win; ++n) {
      const double w = args_.window == mel::Window::hann ? mel::hann(n, win) : mel::hamming(n, win);
      sum += w * w;
    }
    return 1.0 / std::sqrt(sum);
  }

  /// The cached engine for rows of `samples` samples (0 for fbank: any length, through compute_clips) on `threads`
  /// threads, built (after validating the parameters for that length) on first use. A fbank engine is sized for a
  /// segment of one full FFT block (cpu_block_frames), so that compute_clips batches that many frames per FFT call.
  EngineCache::Entry engine(int64_t samples, int threads) {
    return EngineCache::instance().get({id_, samples, threads}, [&] {
      const int block = mel::cpu_block_frames(std::numeric_limits<int>::max(), args_.n_fft);
      const int64_t segment = samples > 0 ? samples : args_.win() + static_cast<int64_t>(block) * args_.hop();
      args_.validate(segment);
      mel::EngineConfig config;
      config.mel = engine_args_;
      config.segment_samples = segment;
      config.dtype = mel::DType::float32;
      config.threads = threads;
      return std::shared_ptr<mel::MelEngine>(mel::make_cpu_engine(config));
    });
  }

  /// Pads (when pad > 0), computes all rows in one engine call, then normalises and takes the log (when normalized).
  void run(const float* x, int64_t rows, int64_t time, int threads, float* out) {
    const int64_t samples = time + 2 * static_cast<int64_t>(pad_);
    std::vector<float> padded;
    const float* base = x;
    if (pad_ > 0) {
      padded.assign(static_cast<std::size_t>(rows * samples), 0.0f);
      for (int64_t r = 0; r < rows; ++r)
        std::copy(x + r * time, x + (r + 1) * time, padded.begin() + r * samples + pad_);
      base = padded.data();
    }
    std::vector<int64_t> offsets(static_cast<std::size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) offsets[static_cast<std::size_t>(r)] = r * samples;
    const EngineCache::Entry e = engine(samples, threads);
    std::lock_guard lock(*e.mutex);
    e.engine->compute(base, offsets, out);
    if (normalized_ == Normalized::none) return;
    const int64_t count = rows * e.engine->layout().out_elems_per_segment();
    for (int64_t i = 0; i < count; ++i) out[i] *= scale_;
    mel::cpu_log_compress(out, count, args_);
  }

  /// Kaldi filterbanks of the rows as clips of one compute_clips call: out [rows][frames][bins].
  void run_fbank(const float* x, int64_t rows, int64_t time, int threads, float* out) {
    std::vector<int64_t> offsets(static_cast<std::size_t>(rows + 1));
    for (int64_t r = 0; r <= rows; ++r) offsets[static_cast<std::size_t>(r)] = r * time;
    const mel::ClipBatch batch = mel::plan_clips(engine_args_, mel::DType::float32, offsets);
    const EngineCache::Entry e = engine(0, threads);
    std::lock_guard lock(*e.mutex);
    e.engine->compute_clips(x, batch, out);
  }

  static uint64_t next_id() {
    static std::atomic<uint64_t> counter{0};
    return ++counter;
  }

  mel::MelArgs args_;
  mel::MelArgs engine_args_;
  int pad_ = 0;
  Normalized normalized_ = Normalized::none;
  float scale_ = 1.0f;
  uint64_t id_ = next_id();
};

/// MelArgs from the keyword values melforge.MelSpectrogram passes (enum values as their spellings).
mel::MelArgs make_args(int sample_rate, int n_fft, int win_length, int hop_length, float f_min, float f_max,
                       int n_mels, const std::string& window, float power, bool center, const std::string& pad_mode,
                       const std::string& norm, const std::string& mel_scale, const std::string& log, float amin,
                       float log_eps) {
  return mel::MelArgs{.sample_rate = sample_rate,
                      .n_fft = n_fft,
                      .win_length = win_length,
                      .hop_length = hop_length,
                      .window = mel::parse_window(window),
                      .center = center,
                      .pad_mode = mel::parse_pad_mode(pad_mode),
                      .power = power,
                      .n_mels = n_mels,
                      .f_min = f_min,
                      .f_max = f_max,
                      .mel_scale = mel::parse_mel_scale(mel_scale),
                      .mel_norm = mel::parse_mel_norm(norm),
                      .log = mel::parse_log_mode(log),
                      .amin = amin,
                      .log_eps = log_eps};
}

/// FbankArgs from a dict of torchaudio's keyword names (every FbankArgs field; fbank_math/fbank_args spellings).
/// Throws InvalidArgument naming a missing or unknown key.
fbank::FbankArgs make_fbank_args(const nb::dict& params) {
  fbank::FbankArgs f;
  std::size_t used = 0;
  const auto read = [&](const char* name, auto& field) {
    if (!params.contains(name)) throw InvalidArgument(std::string("fbank: missing parameter ") + name);
    field = nb::cast<std::remove_reference_t<decltype(field)>>(params[name]);
    ++used;
  };
  std::string window;
  read("num_mel_bins", f.num_mel_bins);
  read("frame_length", f.frame_length);
  read("frame_shift", f.frame_shift);
  read("window_type", window);
  read("blackman_coeff", f.blackman_coeff);
  read("preemphasis_coefficient", f.preemphasis_coefficient);
  read("remove_dc_offset", f.remove_dc_offset);
  read("dither", f.dither);
  read("dither_seed", f.dither_seed);
  read("round_to_power_of_two", f.round_to_power_of_two);
  read("snip_edges", f.snip_edges);
  read("low_freq", f.low_freq);
  read("high_freq", f.high_freq);
  read("use_energy", f.use_energy);
  read("raw_energy", f.raw_energy);
  read("energy_floor", f.energy_floor);
  read("htk_compat", f.htk_compat);
  read("use_log_fbank", f.use_log_fbank);
  read("use_power", f.use_power);
  read("vtln_warp", f.vtln_warp);
  read("subtract_mean", f.subtract_mean);
  f.window_type = fbank::parse_kaldi_window(window);
  if (used != params.size())
    throw InvalidArgument("fbank: " + std::to_string(params.size() - used) + " unknown parameter(s) in the dict");
  return f;
}

/// A MelCompute with Kaldi's filterbank `params` at `sample_rate` Hz.
MelCompute* make_fbank(int sample_rate, const nb::dict& params) {
  mel::MelArgs args;
  args.sample_rate = sample_rate;
  args.log = mel::LogMode::none;
  args.use_fbank(make_fbank_args(params));
  return new MelCompute(args, 0, "none");
}

/// fbank_math.h's dither_gauss(seed, t, j) for frames [0, frames) and samples [0, window): float32 [frames, window],
/// the noise the engine adds (times `dither`) to sample j of frame t of every clip.
Matrix dither_noise(uint64_t seed, int64_t frames, int window) {
  if (frames < 0 || window < 1) throw InvalidArgument("dither_noise: frames must be >= 0 and window >= 1");
  auto* out = new float[static_cast<std::size_t>(std::max<int64_t>(frames * window, 1))];
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  for (int64_t t = 0; t < frames; ++t)
    for (int j = 0; j < window; ++j) out[t * window + j] = fbank::dither_gauss(seed, t, j);
  return Matrix(out, {static_cast<std::size_t>(frames), static_cast<std::size_t>(window)}, owner);
}

}  // namespace

void bind_mel(nb::module_& m) {
  nb::class_<MelCompute>(m, "MelCompute",
                         "The CPU mel engine behind melforge.MelSpectrogram (use that class). Parameters are "
                         "validated on construction (melforge.InvalidArgument).")
      .def("__init__",
           [](MelCompute* self, int sample_rate, int n_fft, int win_length, int hop_length, float f_min, float f_max,
              int pad, int n_mels, const std::string& window, float power, const std::string& normalized,
              bool center, const std::string& pad_mode, const std::string& norm, const std::string& mel_scale,
              const std::string& log, float amin, float log_eps) {
             new (self) MelCompute(make_args(sample_rate, n_fft, win_length, hop_length, f_min, f_max, n_mels, window,
                                             power, center, pad_mode, norm, mel_scale, log, amin, log_eps),
                                   pad, normalized);
           },
           nb::arg("sample_rate"), nb::arg("n_fft"), nb::arg("win_length"), nb::arg("hop_length"), nb::arg("f_min"),
           nb::arg("f_max"), nb::arg("pad"), nb::arg("n_mels"), nb::arg("window"), nb::arg("power"),
           nb::arg("normalized"), nb::arg("center"), nb::arg("pad_mode"), nb::arg("norm"), nb::arg("mel_scale"),
           nb::arg("log"), nb::arg("amin"), nb::arg("log_eps"))
      .def("compute", &MelCompute::compute, nb::arg("x"), nb::arg("threads"),
           "Spectrograms of x (float32 [rows, time], C-contiguous) on `threads` threads (0: all cores): float32 "
           "[rows, n_mels, n_frames]. All rows go to one engine call; the GIL is released.")
      .def("n_frames", &MelCompute::n_frames, nb::arg("samples"), "Frames of a signal of `samples` samples.")
      .def("empty_bands_warning", &MelCompute::empty_bands_warning,
           "torchaudio-like warning naming the mel bands with no FFT bin, or '' when there is none.")
      .def("cached_engines", &MelCompute::cached_engines,
           "Number of this object's engines (FFTW plans) in the cache: one per distinct (signal length, threads); "
           "fbank: one per threads.")
      .def("n_mels", &MelCompute::n_mels, "Output columns per frame: n_mels, or the fbank bins.")
      .def("filterbank", &MelCompute::filterbank,
           "The dense mel filterbank, float32 [n_freqs, n_mels] (torchaudio's MelScale.fb layout); mel only.")
      .def("describe", &MelCompute::describe, "Every engine parameter, one line.")
      .def_static("fbank", &make_fbank, nb::arg("sample_rate"), nb::arg("params"), nb::rv_policy::take_ownership,
                  "Kaldi's filterbank (melforge.Fbank's engine): `params` holds every FbankArgs field under "
                  "torchaudio's name, plus dither_seed. compute() then gives float32 [rows, frames, bins].");
  m.def("fbank_dither_noise", &dither_noise, nb::arg("seed"), nb::arg("frames"), nb::arg("window"),
        "Seeded dither noise: float32 [frames, window], sample j of frame t is fbank_math.h's dither_gauss(seed, t, "
        "j), the standard normal draw the engine scales by `dither`.");
  m.def("engine_cache_info", [] { return EngineCache::instance().info(); },
        "The engine cache: {'engines': count, 'bytes': sum of their host bytes, 'limit': the bound}.");
  m.def("set_engine_cache_limit", [](int64_t limit) { EngineCache::instance().set_limit(limit); }, nb::arg("bytes"),
        "Bounds the engine cache to `bytes` (least recently used engines are dropped first).");
  m.def("clear_engine_cache", [] { EngineCache::instance().clear(); }, "Drops every cached engine.");
}

}  // namespace melforge::python
