/// melforge._core.MelCompute: the CPU mel engine (kernels/mel/mel_engine.h) behind melforge.MelSpectrogram, with
/// torchaudio's `pad` and `normalized` applied around it (constant padding of the signal before the engine; the
/// normalisation factor on the mel power, then cpu_log_compress).
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
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
/// The float32 [rows, n_mels, n_frames] output array.
using Output = nb::ndarray<nb::numpy, float, nb::ndim<3>>;

/// Mel spectrograms of equal-length rows with one set of parameters, with the CPU engines cached per (samples per
/// row after padding, threads) so that repeated calls reuse the FFTW plans.
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

  /// torchaudio-style warning naming the mel bands without an FFT bin; "" when there is none.
  std::string empty_bands_warning() const { return mel::empty_bands_warning(args_); }

  /// Frames of a row of `samples` samples (before `pad`).
  int n_frames(int64_t samples) const { return args_.n_frames(samples + 2 * static_cast<int64_t>(pad_)); }

  /// Spectrograms of the rows of `x` [rows, time] on `threads` threads (0: all cores): [rows, n_mels, n_frames].
  Output compute(const Input& x, int threads) {
    if (threads < 0) throw InvalidArgument("threads must be >= 0 (0: all cores), got " + std::to_string(threads));
    const auto rows = static_cast<int64_t>(x.shape(0));
    const auto time = static_cast<int64_t>(x.shape(1));
    const int64_t samples = time + 2 * static_cast<int64_t>(pad_);
    if (n_frames(time) < 1)
      throw InvalidArgument("a signal of " + std::to_string(time) + " samples gives no frame with n_fft " +
                            std::to_string(args_.n_fft) + (args_.center ? "" : " and center=False"));
    const int64_t frames = n_frames(time);
    const int64_t per_row = static_cast<int64_t>(args_.n_mels) * frames;
    auto* out = new float[static_cast<std::size_t>(std::max<int64_t>(rows * per_row, 1))];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    if (rows > 0) {
      nb::gil_scoped_release release;
      run(x.data(), rows, time, threads, out);
    }
    return Output(out, {static_cast<std::size_t>(rows), static_cast<std::size_t>(args_.n_mels),
                        static_cast<std::size_t>(frames)},
                  owner);
  }

  /// Number of engines built so far (one per distinct (time, threads)).
  int cached_engines() const {
    std::lock_guard lock(mutex_);
    return static_cast<int>(engines_.size());
  }

 private:
  /// Factor on the STFT magnitude for `normalized`.
  double magnitude_scale() const {
    if (normalized_ == Normalized::frame_length) return 1.0 / std::sqrt(static_cast<double>(args_.n_fft));
    if (normalized_ == Normalized::none) return 1.0;
    double sum = 0.0;
    const int win = args_.win();
    for (int n = 0; n < win; ++n) {
      const double w = args_.window == mel::Window::hann ? mel::hann(n, win) : mel::hamming(n, win);
      sum += w * w;
    }
    return 1.0 / std::sqrt(sum);
  }

  /// The cached engine for rows of `samples` samples on `threads` threads, built (after validating the parameters
  /// for that length) on first use.
  mel::MelEngine& engine(int64_t samples, int threads) {
    const auto key = std::make_pair(samples, threads);
    if (auto it = engines_.find(key); it != engines_.end()) return *it->second;
    args_.validate(samples);
    mel::EngineConfig config;
    config.mel = engine_args_;
    config.segment_samples = samples;
    config.dtype = mel::DType::float32;
    config.threads = threads;
    return *engines_.emplace(key, mel::make_cpu_engine(config)).first->second;
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
    std::lock_guard lock(mutex_);
    mel::MelEngine& e = engine(samples, threads);
    e.compute(base, offsets, out);
    if (normalized_ == Normalized::none) return;
    const int64_t count = rows * e.layout().out_elems_per_segment();
    for (int64_t i = 0; i < count; ++i) out[i] *= scale_;
    mel::cpu_log_compress(out, count, args_);
  }

  mel::MelArgs args_;
  mel::MelArgs engine_args_;
  int pad_ = 0;
  Normalized normalized_ = Normalized::none;
  float scale_ = 1.0f;
  mutable std::mutex mutex_;
  std::map<std::pair<int64_t, int>, std::unique_ptr<mel::MelEngine>> engines_;
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
           "Number of engines (FFTW plans) built so far: one per distinct (signal length, threads).");
}

}  // namespace melforge::python
