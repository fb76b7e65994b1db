// melforge-bench-fbank: the CPU engine's Kaldi fbank against a bare FFTW r2c of the same frames, side by side in one
// run, per utterance (issue 31).
//
// Utterances of --min-seconds to --max-seconds (--utterances of them, lengths evenly spread, seeded int16-scale
// noise plus tones) at the fbank settings given (default: WeSpeaker's, 80 bins, 16 kHz, hamming, dither 0). Both
// sides run on one thread by default:
//   engine: per utterance, plan_clips + MelEngine::compute_clips of that one clip into float32 [frames][bins]
//           (framing, DC removal, pre-emphasis, window, FFTW r2c, power, Kaldi mel bank, log): what
//           melforge.compliance.kaldi.fbank does per call, the engine built once;
//   fft:    per utterance, only fftwf_execute_dft_r2c over that utterance's frames (framed, preprocessed and
//           zero-padded beforehand), in batches of the engine's block (cpu_block_frames: about 128 KiB of input, so
//           each batch is cache-resident as the engine's is) with fftwf_plan_many_dft_r2c plans (FFTW_ESTIMATE) made
//           beforehand, the last batch of an utterance with a plan of its size. A single plan over a whole utterance's
//           frames streams them through memory and was up to 1.5x slower per frame here: not the bound.
// A third row times the same batches with FFTW_MEASURE plans (planned beforehand, not reproducible run to run, which
// is why the engine does not use them): what a measured plan shipped as fixed wisdom could gain.
// The two sides run alternately, engine then FFT, over all utterances, --repeats times after one warmup pair; times
// are medians over the repeats, and the ratio is the median of the per-pair ratios.
#include <fftw3.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fbank/fbank_args.h"
#include "fbank/fbank_frames.h"
#include "mel/mel_cpu.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/timing.h"

namespace po = boost::program_options;
using melforge::Stopwatch;
using namespace melforge::mel;

namespace {

/// Command-line settings.
struct Options {
  /// Utterances per timed run.
  int utterances = 20;
  /// Shortest and longest utterance, seconds.
  double min_seconds = 4.0;
  double max_seconds = 12.0;
  /// Threads of both sides.
  int threads = 1;
  /// Timed runs (the median is reported).
  int repeats = 7;
  /// Signal seed.
  uint32_t seed = 1;
  /// Sample rate, Hz.
  int sample_rate = 16000;
  /// fbank parameters (the builder's flags); WeSpeaker's by default.
  melforge::fbank::FbankArgs fbank = [] {
    melforge::fbank::FbankArgs f;
    f.num_mel_bins = 80;
    f.window_type = melforge::fbank::KaldiWindow::hamming;
    f.energy_floor = 0.0;
    return f;
  }();
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// `samples` integer-valued samples at int16 scale: noise plus three tones.
std::vector<float> make_signal(int64_t samples, uint32_t seed, int sample_rate) {
  std::vector<float> x(static_cast<std::size_t>(samples));
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, 600.0);
  for (int64_t i = 0; i < samples; ++i) {
    const double t = static_cast<double>(i) / sample_rate;
    const double v = 3000 * std::sin(2 * M_PI * 220 * t) + 2000 * std::sin(2 * M_PI * 1250 * t) +
                     1000 * std::sin(2 * M_PI * 3100 * t) + noise(rng);
    x[static_cast<std::size_t>(i)] = static_cast<float>(std::round(v));
  }
  return x;
}

/// One utterance and the bare FFT's input and tail plan for its frames.
struct Utterance {
  std::vector<float> samples;
  int64_t frames = 0;
  float* fft_in = nullptr;
  /// Plan of the utterance's last frames % block frames; null when the block divides its frames.
  fftwf_plan tail = nullptr;
};

/// A batched r2c plan of `howmany` frames of `n_fft` samples from `in` into `out` (`flags`: FFTW_ESTIMATE, or
/// FFTW_MEASURE, which overwrites `in` and `out` while planning).
fftwf_plan plan_r2c(int n_fft, int howmany, float* in, fftwf_complex* out, unsigned flags = FFTW_ESTIMATE) {
  const int n_freqs = n_fft / 2 + 1;
  fftwf_plan p = fftwf_plan_many_dft_r2c(1, &n_fft, howmany, in, nullptr, 1, n_fft, out, nullptr, 1, n_freqs, flags);
  if (p == nullptr) throw melforge::Error("FFTW planning failed");
  return p;
}

int run(const Options& o) {
  MelArgs mel;
  mel.sample_rate = o.sample_rate;
  mel.use_fbank(o.fbank);
  EngineConfig cfg;
  cfg.mel = mel;
  cfg.segment_samples = static_cast<int64_t>(o.min_seconds * o.sample_rate);
  cfg.dtype = DType::float32;
  cfg.threads = o.threads;
  auto engine = make_cpu_engine(cfg);
  const melforge::fbank::FramePrep prep(o.fbank, o.sample_rate);
  const int n_fft = prep.padded(), n_freqs = n_fft / 2 + 1;
  const int block = cpu_block_frames(engine->layout().n_frames, n_fft);
  fftwf_complex* fft_out = fftwf_alloc_complex(static_cast<std::size_t>(block) * n_freqs);
  fftwf_plan block_plan = nullptr;
  float* measure_buf = fftwf_alloc_real(static_cast<std::size_t>(block) * n_fft);
  fftwf_plan measured = plan_r2c(n_fft, block, measure_buf, fft_out, FFTW_MEASURE);

  std::vector<Utterance> utts(static_cast<std::size_t>(o.utterances));
  double audio_s = 0.0;
  int64_t total_frames = 0;
  for (int u = 0; u < o.utterances; ++u) {
    Utterance& ut = utts[static_cast<std::size_t>(u)];
    const double span = o.utterances > 1 ? static_cast<double>(u) / (o.utterances - 1) : 0.0;
    const auto n = static_cast<int64_t>((o.min_seconds + span * (o.max_seconds - o.min_seconds)) * o.sample_rate);
    ut.samples = make_signal(n, o.seed + static_cast<uint32_t>(u), o.sample_rate);
    ut.frames = mel.clip_frames(n);
    audio_s += static_cast<double>(n) / o.sample_rate;
    total_frames += ut.frames;
    ut.fft_in = fftwf_alloc_real(static_cast<std::size_t>(ut.frames * n_fft));
    std::vector<float> gather(static_cast<std::size_t>(prep.window())), tmp(gather.size());
    for (int64_t t = 0; t < ut.frames; ++t) {
      const float* src = prep.source(ut.samples.data(), n, t, gather.data());
      prep.prepare(src, t, tmp.data(), ut.fft_in + t * n_fft);
    }
    if (block_plan == nullptr) block_plan = plan_r2c(n_fft, block, ut.fft_in, fft_out);
    if (ut.frames % block != 0) ut.tail = plan_r2c(n_fft, static_cast<int>(ut.frames % block), ut.fft_in, fft_out);
  }
  std::vector<float> out;
  const auto run_engine = [&] {
    for (const Utterance& ut : utts) {
      const std::vector<int64_t> offsets{0, static_cast<int64_t>(ut.samples.size())};
      const ClipBatch batch = plan_clips(mel, DType::float32, offsets);
      out.resize(static_cast<std::size_t>(batch.out_elems()));
      engine->compute_clips(ut.samples.data(), batch, out.data());
    }
  };
  const auto run_fft = [&](fftwf_plan plan) {
    for (const Utterance& ut : utts) {
      int64_t t = 0;
      for (; t + block <= ut.frames; t += block) fftwf_execute_dft_r2c(plan, ut.fft_in + t * n_fft, fft_out);
      if (ut.tail != nullptr) fftwf_execute_dft_r2c(ut.tail, ut.fft_in + t * n_fft, fft_out);
    }
  };
  std::vector<double> engine_s, fft_s, measured_s, ratios;
  for (int r = 0; r <= o.repeats; ++r) {
    Stopwatch we;
    run_engine();
    const double e = we.seconds();
    Stopwatch wf;
    run_fft(block_plan);
    const double f = wf.seconds();
    Stopwatch wm;
    run_fft(measured);
    const double m = wm.seconds();
    if (r == 0) continue;
    engine_s.push_back(e);
    fft_s.push_back(f);
    measured_s.push_back(m);
    ratios.push_back(e / f);
  }
  for (Utterance& ut : utts) {
    if (ut.tail != nullptr) fftwf_destroy_plan(ut.tail);
    fftwf_free(ut.fft_in);
  }
  fftwf_destroy_plan(block_plan);
  fftwf_destroy_plan(measured);
  fftwf_free(measure_buf);
  fftwf_free(fft_out);
  const double es = median(engine_s), fs = median(fft_s);
  const double per_utt = 1e3 / o.utterances;
  const double avg_s = audio_s / o.utterances;
  std::printf("fbank: %s, sample_rate %d, window %d, FFT %d, %d bins\n", o.fbank.to_string().c_str(),
              o.sample_rate, prep.window(), n_fft, mel.n_mels);
  std::printf("%d utterances of %.1f-%.1f s (mean %.2f s, %lld frames in all), %d thread(s), median of %d runs\n",
              o.utterances, o.min_seconds, o.max_seconds, avg_s, static_cast<long long>(total_frames),
              cfg.threads, o.repeats);
  std::printf("  melforge fbank (compute_clips per utterance): %8.3f ms/utterance  %8.0fx real time  %7.3f us/frame\n",
              es * per_utt, audio_s / es, 1e6 * es / static_cast<double>(total_frames));
  std::printf("  bare FFTW r2c, same frames, batches of %3d:   %8.3f ms/utterance  %8.0fx real time  %7.3f us/frame\n",
              block, fs * per_utt, audio_s / fs, 1e6 * fs / static_cast<double>(total_frames));
  const double ms = median(measured_s);
  std::printf("  the same with FFTW_MEASURE plans:             %8.3f ms/utterance  %8.0fx real time  %7.3f us/frame\n",
              ms * per_utt, audio_s / ms, 1e6 * ms / static_cast<double>(total_frames));
  std::printf("  fbank / bare FFT time: %.2f (median of the %zu per-run ratios)\n", median(ratios), ratios.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  po::options_description desc("melforge-bench-fbank: Kaldi fbank (CPU engine) vs bare FFTW r2c of the same frames");
  desc.add_options()("help,h", "show this help and exit")(
      "utterances", po::value(&o.utterances)->default_value(o.utterances), "utterances per timed run")(
      "min-seconds", po::value(&o.min_seconds)->default_value(o.min_seconds), "shortest utterance, s")(
      "max-seconds", po::value(&o.max_seconds)->default_value(o.max_seconds), "longest utterance, s")(
      "threads", po::value(&o.threads)->default_value(o.threads), "engine threads (the FFT side runs on one)")(
      "repeats", po::value(&o.repeats)->default_value(o.repeats), "timed runs (median reported)")(
      "seed", po::value(&o.seed)->default_value(o.seed), "signal seed")(
      "sample-rate", po::value(&o.sample_rate)->default_value(o.sample_rate), "sample rate, Hz");
  po::options_description fbank("fbank (as melforge-build --features fbank)");
  melforge::fbank::add_options(fbank, o.fbank);
  desc.add(fbank);
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (o.utterances < 1 || o.repeats < 1 || !(o.min_seconds > 0) || o.max_seconds < o.min_seconds)
      throw melforge::InvalidArgument("--utterances and --repeats must be >= 1, 0 < --min-seconds <= --max-seconds");
    return run(o);
  } catch (const melforge::InvalidArgument& e) {
    std::cerr << "melforge-bench-fbank: " << e.what() << "\n";
    return 2;
  } catch (const po::error& e) {
    std::cerr << "melforge-bench-fbank: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "melforge-bench-fbank: " << e.what() << "\n";
    return 1;
  }
}
