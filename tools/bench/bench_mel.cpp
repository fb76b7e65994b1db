// melforge-bench-mel: the mel engine alone against a bare batched FFTW r2c of the same frames (issue 4).
//
// Segments are consecutive slices of one seeded signal (white noise plus a few tones), as the builder's arena holds
// them. Both sides run on the same number of threads and the same segments:
//   engine: MelEngine::compute over every segment (framing, reflect padding, window, FFTW r2c, power, sparse mel,
//           log, float16), the call the builder makes;
//   fft:    only fftwf_execute_dft_r2c, with a plan of the engine's block size, over frames that were framed and
//           windowed beforehand (a pool of --fft-pool-segments segments, cycled), so framing is not counted.
// The two sides run alternately, engine then FFT, --repeats times after one warmup pair, and the ratio reported is
// the median of the per-pair ratios, so that a change in the machine's speed during the run (other tenants of a
// virtual machine) moves both sides alike. Timings are medians over the repeats. --dump-audio and --dump-mel write the signal and the
// float32 spectrograms of the first segments, so that tools/bench/py_mel.py runs torch on the very same samples and
// checks that it computes the same values.
#include <fftw3.h>
#include <omp.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "mel/filterbank.h"
#include "mel/mel_cpu.h"
#include "mel/mel_engine.h"
#include "mel/mel_math.h"
#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "melforge/common/timing.h"

namespace po = boost::program_options;
using melforge::Stopwatch;
using namespace melforge::mel;

namespace {

/// Command-line settings.
struct Options {
  /// Segments per timed run.
  int64_t segments = 8000;
  /// Samples per segment (the short segment: 0.25 s at 16 kHz).
  int64_t segment_samples = 4000;
  /// Threads of both sides.
  int threads = 1;
  /// Timed runs (the median is reported).
  int repeats = 5;
  /// Segments framed beforehand for the bare FFT, cycled over.
  int64_t fft_pool_segments = 256;
  /// Engine input: 0 = every segment distinct (as the builder's arena, streamed from RAM); N > 0 = the first N
  /// segments cycled, as the bare FFT's pool, so that both sides read cache-resident input.
  int64_t engine_pool_segments = 0;
  /// Signal seed.
  uint32_t seed = 1;
  /// cpu or cuda.
  std::string device = "cpu";
  /// Output type of the engine: float16 (as the builder stores) or float32.
  std::string dtype = "float16";
  /// Raw float32 signal file to write (segments * segment_samples values), empty: none.
  std::string dump_audio;
  /// Raw float32 spectrograms [dump_segments][n_mels][n_frames] to write, empty: none.
  std::string dump_mel;
  /// Segments whose spectrograms --dump-mel writes.
  int64_t dump_segments = 64;
  /// JSON results file, empty: none.
  std::string out;
  /// both (alternately, for the ratio), engine or fft (one side alone, for profiling).
  std::string only = "both";
  /// Spectrogram parameters, registered with the builder's own mel::add_options so that every flag is spelled, parsed
  /// and validated as melforge-build's (the bench's default hop is 128, not auto). The bare FFT side frames with a
  /// reflect-padded periodic Hann of n_fft whatever --window, --win-length or --pad-mode say: only its time counts.
  MelArgs mel = [] {
    MelArgs a;
    a.hop_length = 128;
    return a;
  }();
  /// CUDA engine: segments per device batch (the batch its plan and graph are built for).
  int64_t device_batch = 4096;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<float> make_signal(int64_t samples, uint32_t seed, int sample_rate) {
  std::vector<float> x(static_cast<std::size_t>(samples));
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  const double tones[] = {220.0, 1250.0, 3100.0};
  for (int64_t i = 0; i < samples; ++i) {
    const double t = static_cast<double>(i) / sample_rate;
    double v = 0;
    for (double f : tones) v += 0.1 * std::sin(2.0 * M_PI * f * t);
    x[static_cast<std::size_t>(i)] = static_cast<float>(v) + noise(rng);
  }
  return x;
}

/// Frames and windows segment `seg` (torch.stft's centred, reflect-padded framing) into `out` [n_frames][n_fft].
void frame_segment(const float* seg, int64_t len, const MelArgs& a, const std::vector<float>& window, int n_frames,
                   float* out) {
  const int n_fft = a.n_fft, hop = a.hop(), pad = a.pad();
  for (int t = 0; t < n_frames; ++t) {
    for (int j = 0; j < n_fft; ++j) {
      int64_t k = static_cast<int64_t>(t) * hop + j - pad;
      if (k < 0) k = -k;
      if (k >= len) k = 2 * (len - 1) - k;
      out[static_cast<std::size_t>(t) * n_fft + j] = seg[k] * window[static_cast<std::size_t>(j)];
    }
  }
}

void write_raw(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f) throw melforge::IoError("cannot write " + path);
}

int run(const Options& o) {
  const MelArgs& mel = o.mel;
  mel.validate(o.segment_samples);
  const int n_frames = mel.n_frames(o.segment_samples);
  const int n_fft = mel.n_fft, n_freqs = mel.n_freqs();
  const int threads = melforge::resolve_threads(o.threads);

  EngineConfig cfg;
  cfg.mel = mel;
  cfg.segment_samples = o.segment_samples;
  cfg.dtype = parse_dtype(o.dtype);
  cfg.threads = threads;
  cfg.device_batch = o.device_batch;
  std::unique_ptr<MelEngine> engine =
      o.device == "cuda" ? make_cuda_engine(cfg) : make_cpu_engine(cfg);

  const int64_t engine_pool = o.engine_pool_segments > 0 ? std::min(o.engine_pool_segments, o.segments) : o.segments;
  const int64_t signal_segments =
      std::max({engine_pool, std::min(o.fft_pool_segments, o.segments), std::min(o.dump_segments, o.segments)});
  const std::vector<float> signal = make_signal(signal_segments * o.segment_samples, o.seed, mel.sample_rate);
  std::vector<int64_t> offsets(static_cast<std::size_t>(o.segments));
  for (int64_t i = 0; i < o.segments; ++i) {
    offsets[static_cast<std::size_t>(i)] = (i % engine_pool) * o.segment_samples;
  }
  if (!o.dump_audio.empty()) write_raw(o.dump_audio, signal.data(), signal.size() * sizeof(float));

  const MelLayout& layout = engine->layout();
  std::vector<unsigned char> out(static_cast<std::size_t>(o.segments * layout.out_bytes_per_segment()));

  if (!o.dump_mel.empty()) {
    EngineConfig c32 = cfg;
    c32.dtype = DType::float32;
    auto e32 = make_cpu_engine(c32);
    const int64_t k = std::min(o.dump_segments, o.segments);
    std::vector<float> m(static_cast<std::size_t>(k * layout.out_elems_per_segment()));
    e32->compute(signal.data(), std::span(offsets.data(), static_cast<std::size_t>(k)), m.data());
    write_raw(o.dump_mel, m.data(), m.size() * sizeof(float));
  }

  const int block = cpu_block_frames(n_frames, n_fft);
  const int64_t pool = std::max<int64_t>(1, std::min(o.fft_pool_segments, o.segments));
  std::vector<float> window(static_cast<std::size_t>(n_fft));
  for (int j = 0; j < n_fft; ++j) window[static_cast<std::size_t>(j)] = hann(j, n_fft);
  float* frames = fftwf_alloc_real(static_cast<std::size_t>(pool * n_frames * n_fft));
  std::vector<fftwf_complex*> spectra(static_cast<std::size_t>(threads));
  for (auto& s : spectra) s = fftwf_alloc_complex(static_cast<std::size_t>(block) * n_freqs);
  for (int64_t s = 0; s < pool; ++s)
    frame_segment(signal.data() + s * o.segment_samples, o.segment_samples, mel, window, n_frames,
                  frames + s * n_frames * n_fft);
  fftwf_plan plan = fftwf_plan_many_dft_r2c(1, &n_fft, block, frames, nullptr, 1, n_fft, spectra[0], nullptr, 1,
                                            n_freqs, FFTW_ESTIMATE);
  const int tail = n_frames % block;
  fftwf_plan plan_tail = tail ? fftwf_plan_many_dft_r2c(1, &n_fft, tail, frames, nullptr, 1, n_fft, spectra[0],
                                                        nullptr, 1, n_freqs, FFTW_ESTIMATE)
                              : nullptr;
  if (plan == nullptr || (tail && plan_tail == nullptr)) throw melforge::Error("FFTW planning failed");
  const auto run_fft = [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t s = 0; s < o.segments; ++s) {
      fftwf_complex* spec = spectra[static_cast<std::size_t>(omp_get_thread_num())];
      float* seg = frames + (s % pool) * n_frames * n_fft;
      int t = 0;
      for (; t + block <= n_frames; t += block) fftwf_execute_dft_r2c(plan, seg + t * n_fft, spec);
      if (tail) fftwf_execute_dft_r2c(plan_tail, seg + t * n_fft, spec);
    }
  };

  const bool do_engine = o.only != "fft", do_fft = o.only != "engine";
  std::vector<double> engine_s, fft_s, ratios, h2d_s, compute_s, d2h_s;
  for (int r = 0; r <= o.repeats; ++r) {
    double e = 0, f = 0;
    if (do_engine) {
      const EngineTimes before = engine->times();
      Stopwatch w;
      engine->compute(signal.data(), offsets, out.data());
      e = w.seconds();
      const EngineTimes after = engine->times();
      if (r > 0) {
        h2d_s.push_back(after.h2d_s - before.h2d_s);
        compute_s.push_back(after.compute_s - before.compute_s);
        d2h_s.push_back(after.d2h_s - before.d2h_s);
      }
    }
    if (do_fft) {
      Stopwatch w;
      run_fft();
      f = w.seconds();
    }
    if (r == 0) continue;
    if (do_engine) engine_s.push_back(e);
    if (do_fft) fft_s.push_back(f);
    if (do_engine && do_fft) ratios.push_back(e / f);
  }
  fftwf_destroy_plan(plan);
  if (plan_tail) fftwf_destroy_plan(plan_tail);
  for (auto* s : spectra) fftwf_free(s);
  fftwf_free(frames);
  const double nf = static_cast<double>(o.segments) * n_frames;
  const auto side = [&](const std::vector<double>& t) -> nlohmann::json {
    if (t.empty()) return nullptr;
    const double m = median(t);
    return {{"seconds", t}, {"median_s", m}, {"segments_per_s", o.segments / m}, {"frames_per_s", nf / m}};
  };
  nlohmann::json j = {
      {"device", o.device},
      {"engine_name", engine->name()},
      {"threads", threads},
      {"segments", o.segments},
      {"segment_samples", o.segment_samples},
      {"sample_rate", mel.sample_rate},
      {"n_fft", n_fft},
      {"hop_length", mel.hop()},
      {"n_mels", mel.n_mels},
      {"n_frames", n_frames},
      {"dtype", o.dtype},
      {"device_batch", o.device_batch},
      {"device_bytes", engine->device_bytes()},
      {"fft_block_frames", block},
      {"fft_pool_segments", pool},
      {"engine_pool_segments", o.engine_pool_segments},
      {"engine", side(engine_s)},
      {"engine_stages_median_s",
       do_engine ? nlohmann::json{{"h2d", median(h2d_s)}, {"compute", median(compute_s)}, {"d2h", median(d2h_s)}}
                 : nlohmann::json(nullptr)},
      {"fft", side(fft_s)},
      {"engine_over_fft_each_run", ratios},
      {"engine_over_fft", ratios.empty() ? nlohmann::json(nullptr) : nlohmann::json(median(ratios))}};
  if (do_engine) {
    const double es = median(engine_s);
    std::printf("mel engine (%s, %d thread(s)): %lld segments of %d frames: %.4f s, %.0f segments/s, %.0f frames/s\n",
                engine->name().c_str(), threads, static_cast<long long>(o.segments), n_frames, es, o.segments / es,
                nf / es);
    std::printf("  engine stages (median s per run; device stages overlap): h2d %.4f, compute %.4f, d2h %.4f\n",
                median(h2d_s), median(compute_s), median(d2h_s));
  }
  if (do_fft) {
    const double fs = median(fft_s);
    std::printf("bare FFTW r2c (block %d, same frames):              %.4f s, %.0f segments/s, %.0f frames/s\n",
                block, fs, o.segments / fs, nf / fs);
  }
  if (!ratios.empty()) {
    std::printf("engine / bare FFT time: %.2f (median of the %zu per-run ratios, engine and FFT run alternately)\n",
                median(ratios), ratios.size());
  }
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << j.dump(2) << "\n";
    if (!f) throw melforge::IoError("cannot write " + o.out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  po::options_description desc("melforge-bench-mel: mel engine vs bare batched FFTW r2c of the same frames");
  desc.add_options()("help,h", "show this help and exit")(
      "segments", po::value(&o.segments)->default_value(o.segments), "segments per timed run")(
      "segment-samples", po::value(&o.segment_samples)->default_value(o.segment_samples), "samples per segment")(
      "threads", po::value(&o.threads)->default_value(o.threads), "threads of both sides (0: all cores)")(
      "repeats", po::value(&o.repeats)->default_value(o.repeats), "timed runs (median reported)")(
      "fft-pool-segments", po::value(&o.fft_pool_segments)->default_value(o.fft_pool_segments),
      "segments framed beforehand for the bare FFT (cycled)")(
      "engine-pool-segments", po::value(&o.engine_pool_segments)->default_value(o.engine_pool_segments),
      "engine input: 0 = all segments distinct (streamed from RAM), N = the first N segments cycled")(
      "seed", po::value(&o.seed)->default_value(o.seed), "signal seed")(
      "device-batch", po::value(&o.device_batch)->default_value(o.device_batch),
      "CUDA engine: segments per device batch")(
      "device", po::value(&o.device)->default_value(o.device), "engine: cpu or cuda")(
      "dtype", po::value(&o.dtype)->default_value(o.dtype), "engine output: float16 or float32")(
      "dump-audio", po::value(&o.dump_audio), "write the float32 signal here")(
      "dump-mel", po::value(&o.dump_mel), "write float32 spectrograms of the first --dump-segments here")(
      "dump-segments", po::value(&o.dump_segments)->default_value(o.dump_segments), "segments --dump-mel writes")(
      "out", po::value(&o.out), "write JSON results here")(
      "only", po::value(&o.only)->default_value(o.only), "both, engine or fft: time one side alone (for a profiler)");
  po::options_description spectrogram("spectrogram (as melforge-build)");
  add_options(spectrogram, o.mel);
  desc.add(spectrogram);
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (o.segments < 1 || o.repeats < 1 || o.segment_samples < 1) throw melforge::InvalidArgument("counts must be >= 1");
    if (o.device != "cpu" && o.device != "cuda") throw melforge::InvalidArgument("--device must be cpu or cuda");
    if (o.only != "both" && o.only != "engine" && o.only != "fft")
      throw melforge::InvalidArgument("--only must be both, engine or fft");
    return run(o);
  } catch (const melforge::InvalidArgument& e) {
    std::cerr << "melforge-bench-mel: " << e.what() << "\n";
    return 2;
  } catch (const po::error& e) {
    std::cerr << "melforge-bench-mel: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "melforge-bench-mel: " << e.what() << "\n";
    return 1;
  }
}
