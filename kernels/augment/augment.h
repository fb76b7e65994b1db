#pragma once
/// Waveform augmentation of melforge-build (issue 18): the options, the banks of noise and impulse-response clips
/// held in RAM, the recipe each augmented copy draws, and the augmenters that apply a recipe to a decoded file, on
/// the CPU (FFTW) and on a CUDA device (cuFFT). One interface, documented here; the per-element math both backends
/// share is in augment_math.h. No CUDA type appears in this header.
///
/// A copy's waveform, in order: decode at speed_decode_rate() (speed perturbation through the resampler, Kaldi/sox
/// style: tempo and pitch both scale by the factor), reverberation (FFT convolution with the impulse response,
/// aligned on its direct path and normalised to unit energy), additive noise at the drawn SNR measured on the active
/// signal (active_power()), then gain. Copy 0 is the clean file, untouched.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::program_options {
class options_description;
}

namespace melforge::augment {

/// Options of the augmentation (melforge-build flags; registered by add_options).
struct AugmentArgs {
  /// --augment-copies K: augmented copies written for each file of the augmented splits, besides the clean copy;
  /// 0..64, 0 (the default) turns augmentation off.
  int copies = 0;
  /// --augment-splits: comma-separated subset of train,val,test whose files get copies.
  std::string splits = "train";
  /// --noise DIR: folder of noise clips (searched recursively, any audio the builder reads); empty: no noise.
  std::filesystem::path noise;
  /// --noise-weights "noise:1,music:1,speech:1": a weight per immediate subfolder of --noise (MUSAN layout); a
  /// copy picks a subfolder by weight, then a clip of it uniformly. Empty: every clip equally likely. Clips directly
  /// in --noise form the group "." when weights are given. Subfolders not named are not used; a named one that holds
  /// no clip makes draw_recipe throw InvalidArgument.
  std::string noise_weights;
  /// --snr-db MIN,MAX: SNR range in dB, drawn uniformly.
  std::string snr_db = "5,20";
  /// --noise-prob P: probability that a copy gets noise, in [0, 1].
  double noise_prob = 1.0;
  /// --rir DIR: folder of room impulse responses (searched recursively); empty: no reverberation.
  std::filesystem::path rir;
  /// --rir-prob P: probability that a copy is reverberated, in [0, 1].
  double rir_prob = 1.0;
  /// --speed LIST: speed factors, one drawn uniformly per copy (e.g. "0.9,1.0,1.1"); each in [0.5, 2].
  std::string speed = "1.0";
  /// --gain-db MIN,MAX: gain in dB, drawn uniformly, applied last.
  std::string gain_db = "0,0";

  /// True when copies > 0.
  bool enabled() const { return copies > 0; }
  /// Parsed snr_db: {min, max}, min <= max, each in [-60, 120]. Throws InvalidArgument naming the flag.
  std::pair<double, double> snr_range() const;
  /// Parsed gain_db: {min, max}, min <= max, each in [-60, 30]. Throws InvalidArgument naming the flag.
  std::pair<double, double> gain_range() const;
  /// Parsed speed: the factors in the order given. Throws InvalidArgument naming the flag.
  std::vector<double> speed_list() const;
  /// Parsed splits: [train, val, test] true for the splits that get copies. Throws InvalidArgument.
  std::array<bool, 3> split_mask() const;
  /// Parsed noise_weights: (subfolder, weight > 0) pairs in the order given; empty when not given. Throws.
  std::vector<std::pair<std::string, double>> weight_list() const;
  /// Checks every field: the parsers above, copies in 0..64, probabilities in [0, 1], the folders exist; with
  /// copies > 0, at least one of --noise, --rir, a speed other than 1 or a gain range other than 0,0 is given, and
  /// with copies == 0 none of them is (they would silently do nothing). Throws InvalidArgument naming the flag.
  void validate() const;
};

/// Registers --augment-copies --augment-splits --noise --noise-weights --snr-db --noise-prob --rir --rir-prob
/// --speed --gain-db, each with its default in the help.
void add_options(boost::program_options::options_description& desc, AugmentArgs& args);

/// One clip of a bank, decoded to mono float32 at the build's sample rate.
struct Clip {
  /// Path relative to the bank's folder, '/'-separated, UTF-8 (as recorded in the dataset's recipe columns).
  std::string path;
  /// Immediate subfolder of the bank's folder it lies in ("." for a clip directly in the folder).
  std::string group;
  /// Samples at the build's rate; never empty.
  std::vector<float> samples;
};

/// A folder of clips held in RAM for the whole build.
struct Bank {
  /// Clips sorted by path.
  std::vector<Clip> clips;
  /// Sum of the clips' sample bytes.
  int64_t bytes() const;
  /// True when the bank has no clip (no folder was given).
  bool empty() const { return clips.empty(); }
};

/// Bytes load_bank would hold for `dir`, from the files' headers only (frames at `sample_rate`, 4 bytes each), so
/// that the build can check --max-ram before decoding anything. Throws InvalidArgument naming `flag` and the file
/// when a header cannot be read or the folder holds no audio file with one of `extensions`.
int64_t bank_bytes(const std::filesystem::path& dir, int sample_rate, const std::vector<std::string>& extensions,
                   const std::string& flag);

/// Loads every audio file with one of `extensions` under `dir` (recursively, hidden entries skipped), decoded once
/// (libsndfile, soxr to `sample_rate`, channels mixed down) on `threads` threads. A file that cannot be decoded, or
/// that decodes to no sample, throws InvalidArgument naming `flag` and the file: a bank is a parameter of the
/// build, so this happens before any input is decoded. An empty `dir` gives an empty bank.
Bank load_bank(const std::filesystem::path& dir, int sample_rate, const std::vector<std::string>& extensions,
               int threads, const std::string& flag);

/// What one copy of one file does; drawn by draw_recipe. Copy 0 is the identity.
struct Recipe {
  /// 0 for the clean copy, 1..copies for the augmented ones.
  int copy = 0;
  /// Speed factor, 1 for none.
  double speed = 1.0;
  /// Index into the impulse-response bank, -1 for none.
  int rir = -1;
  /// Index into the noise bank, -1 for none.
  int noise = -1;
  /// First sample of the noise clip mixed in (the clip is looped from there when shorter than the signal).
  int64_t noise_offset = 0;
  /// Drawn SNR in dB (meaningful only when noise >= 0; 0 otherwise).
  double snr_db = 0.0;
  /// Gain in dB applied last (0 for none).
  double gain_db = 0.0;
  /// True for the identity (copy 0, or a copy whose draws changed nothing).
  bool identity() const { return speed == 1.0 && rir < 0 && noise < 0 && gain_db == 0.0; }
  /// True when an augmenter changes the waveform: an impulse response, a noise or a gain (the speed is the
  /// decode's).
  bool augments() const { return rir >= 0 || noise >= 0 || gain_db != 0.0; }
};

/// Draws copy `copy` of the file at `path` (its path as the dataset records it). Deterministic in (seed, path, copy,
/// args, the banks' clip lists and lengths) and in nothing else, so threads, batches and engines cannot change it.
/// The draws come in a fixed order from one splitmix64 stream seeded from FNV-1a(path), seed and copy: speed, then
/// reverberation (probability, clip), then noise (probability, group by weight, clip, offset, SNR), then gain; a
/// draw that is not needed is still made, so that changing one option leaves the other draws as they were. copy 0
/// returns the identity.
Recipe draw_recipe(const AugmentArgs& args, const Bank& noise, const Bank& rir, uint64_t seed, std::string_view path,
                   int copy);

/// Rate at which to decode a file so that, read at `sample_rate`, it plays `speed` times faster (Kaldi/sox speed
/// perturbation through the resampler): round(sample_rate / speed). speed 1 gives sample_rate.
int speed_decode_rate(int sample_rate, double speed);

/// Length of the analysis frames of active_power(), milliseconds.
inline constexpr double kActiveFrameMs = 20.0;
/// A frame is active when its energy is within this many dB of the loudest frame's.
inline constexpr double kActiveRangeDb = 40.0;

/// The powers an SNR is measured from: the signal is cut into frames of kActiveFrameMs (the last one shorter); the
/// active frames are those whose signal energy is within kActiveRangeDb of the loudest frame's (none when the signal
/// is all zeros). Both powers are mean squares over the samples of the active frames.
struct ActivePower {
  /// Mean square of the signal over the active samples.
  double signal = 0.0;
  /// Mean square of the noise excerpt (looped as mixed) over the same samples.
  double noise = 0.0;
  /// Samples in active frames.
  int64_t active_samples = 0;
};

/// ActivePower of `signal` [frames] and of the noise excerpt that mix_noise() would add: noise[(offset + i) % size].
ActivePower active_power(std::span<const float> signal, std::span<const float> noise, int64_t offset,
                         int sample_rate);

/// Factor the noise excerpt is multiplied by so that 10 log10(power.signal / (factor^2 power.noise)) = snr_db;
/// 0 when either power is 0 (silence gets no noise; a silent noise clip adds nothing).
double noise_factor(const ActivePower& power, double snr_db);

/// Applies recipes to decoded files: reverberation, noise, gain (speed was applied by the decode). Backends:
/// make_cpu_augmenter (FFTW, thread-safe: several threads may call apply at once on different files) and
/// make_cuda_augmenter (cuFFT; one batch at a time).
class Augmenter {
 public:
  virtual ~Augmenter() = default;
  /// One file to augment in place.
  struct Item {
    /// Its recipe.
    Recipe recipe;
    /// The file's arena slice; samples [0, frames) hold audio, the rest zeros.
    std::span<float> samples;
    /// Frames of audio in `samples` (<= samples.size()). The reverberation tail past `frames` is dropped, noise is
    /// mixed over [0, frames) only, and samples past `frames` stay zero, so the segment plan is unchanged.
    int64_t frames = 0;
  };
  /// Applies each item's recipe to its samples. The CPU augmenter's result for an item depends on nothing but the
  /// item and the banks; the CUDA augmenter's matches it within the tolerance stated in augment_math.h.
  virtual void apply(std::span<Item> items) = 0;
  /// "cpu-fftw" or "cuda-cufft".
  virtual std::string name() const = 0;
  /// Host bytes one call holds per item of `frames` frames beyond the items themselves (FFT scratch), for --max-ram.
  virtual int64_t item_bytes(int64_t frames) const = 0;
  /// Bytes of device memory held (0 for the CPU augmenter): the banks and the batch buffers.
  virtual int64_t device_bytes() const = 0;
  /// Bytes of host memory held for as long as the augmenter lives, beyond the banks and the items (0 for the CPU
  /// augmenter, whose scratch is item_bytes per call; the CUDA augmenter's pinned staging buffers,
  /// cuda::AugmentBufferSizes::pinned_bytes()). The builder's --max-ram planner reserves it.
  virtual int64_t host_bytes() const = 0;
};

/// The CPU augmenter over `noise` and `rir`, which must outlive it. apply() may be called from several threads.
std::unique_ptr<Augmenter> make_cpu_augmenter(const Bank& noise, const Bank& rir, int sample_rate);

/// The CUDA augmenter on device `device`: copies the banks to the device once (and the impulse responses' spectra),
/// and keeps persistent device buffers for up to `max_batch_samples` samples per apply() call (the builder's batch
/// arena). Throws CudaError when CUDA is unavailable or compiled out, or a CUDA/cuFFT call fails; InvalidArgument
/// when a call's items exceed max_batch_samples.
std::unique_ptr<Augmenter> make_cuda_augmenter(const Bank& noise, const Bank& rir, int sample_rate, int device,
                                               int64_t max_batch_samples);

}  // namespace melforge::augment
