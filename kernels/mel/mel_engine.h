#pragma once
/// One interface for the CPU (FFTW) and CUDA (cuFFT) log-mel engines. Documented here, once.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>
#include <string>

#include "mel_args.h"

namespace melforge::mel {

/// Which engine computes the spectrograms. `auto_select` picks CUDA when a device is present, else CPU.
enum class Device { auto_select, cpu, cuda };
/// Spelling used on the command line: "auto", "cpu", "cuda".
std::string to_string(Device d);
/// Parses "auto", "cpu" or "cuda"; throws InvalidArgument otherwise.
Device parse_device(const std::string& s);
std::istream& operator>>(std::istream& in, Device& d);
std::ostream& operator<<(std::ostream& out, Device d);

/// Fixed configuration of an engine. An engine is built once and reused for every batch and split.
struct EngineConfig {
  /// Spectrogram parameters; must already be validated.
  MelArgs mel;
  /// Length of every segment, samples (the short segment).
  int64_t segment_samples = 0;
  /// Output element type.
  DType dtype = DType::float16;
  /// CPU threads the CPU engine uses (0: all cores). The CUDA engine uses one host thread.
  int threads = 0;
  /// CUDA engine: segments per device batch (the batch the cuFFT plan and the CUDA graph are built for).
  int64_t device_batch = 4096;
  /// CUDA engine: index of the device to build on (0..cuda_device_count()-1); -1: the calling thread's current
  /// device. make_engine sets it when it builds one engine per device.
  int cuda_device = -1;
};

/// Shape and byte sizes derived from an EngineConfig. Every buffer of both engines and of the tests is sized here.
struct MelLayout {
  /// Frames per segment.
  int n_frames = 0;
  /// Mel bands.
  int n_mels = 0;
  /// One-sided FFT bins.
  int n_freqs = 0;
  /// Samples per segment.
  int64_t segment_samples = 0;
  /// Bytes per output element (2 for float16, 4 for float32).
  int out_elem_bytes = 0;
  /// Output elements per segment: n_mels * n_frames, laid out [n_mels][n_frames].
  int64_t out_elems_per_segment() const { return static_cast<int64_t>(n_mels) * n_frames; }
  /// Output bytes per segment.
  int64_t out_bytes_per_segment() const { return out_elems_per_segment() * out_elem_bytes; }
  /// Real FFT input floats for `segments` segments: [segments * n_frames][n_fft].
  int64_t frame_floats(int64_t segments, int n_fft) const { return segments * n_frames * n_fft; }
  /// Complex FFT output values for `segments` segments: [segments * n_frames][n_freqs].
  int64_t spectrum_complex(int64_t segments) const { return segments * n_frames * n_freqs; }
};

/// Derives the layout; throws InvalidArgument when a segment yields no frame.
MelLayout make_layout(const EngineConfig& config);

/// Time spent by an engine since construction, seconds. The CPU engine fills only `compute_s`.
struct EngineTimes {
  /// Host to device copies (CUDA), including the host-side gather into pinned memory.
  double h2d_s = 0;
  /// Framing, FFT, mel, log and conversion.
  double compute_s = 0;
  /// Device to host copies (CUDA).
  double d2h_s = 0;
};

/// Computes log-mel spectrograms of equal-length segments.
class MelEngine {
 public:
  virtual ~MelEngine() = default;
  /// Computes `offsets.size()` spectrograms. Segment i is samples [offsets[i], offsets[i] + segment_samples) of
  /// `base`. `out` receives [offsets.size()][n_mels][n_frames] elements of the configured dtype
  /// (uint16 IEEE half bits for float16). Any count works; engines split or pad internally.
  virtual void compute(const float* base, std::span<const int64_t> offsets, void* out) = 0;
  /// Name for reports: "cpu-fftw" or "cuda-cufft".
  virtual std::string name() const = 0;
  /// Accumulated stage times.
  virtual EngineTimes times() const = 0;
  /// Bytes of device memory held (0 for the CPU engine).
  virtual int64_t device_bytes() const = 0;
  /// The layout this engine was built for.
  virtual const MelLayout& layout() const = 0;
};

/// True when a CUDA device can be used (false when built without CUDA, with no driver, or with no device).
/// Never throws; leaves no sticky CUDA error behind.
bool cuda_available();

/// Number of usable CUDA devices: 0 when built without CUDA, with no driver, no device, or a failed device query.
/// Never throws; leaves no sticky CUDA error behind.
int cuda_device_count();

/// The engines make_engine builds for `device` when `cuda_devices` CUDA devices are usable: one CPU engine for cpu
/// (and for auto without a device), else one CUDA engine per device (cuda with 0 devices: 1, whose construction
/// then fails with CudaError).
struct EnginePlan {
  /// Use CUDA engines.
  bool cuda = false;
  /// Number of engines, >= 1.
  int engines = 1;
};
/// See EnginePlan.
EnginePlan plan_engines(Device device, int cuda_devices);

/// Which part of a compute() call one engine of a MultiEngine gets: segments [first, first + count).
struct DealtBatch {
  /// First segment.
  int64_t first = 0;
  /// Segments, >= 1.
  int64_t count = 0;
};
/// Deals `count` segments to `engines` engines: in consecutive batches of min(max_batch, ceil(count / engines))
/// segments (at least 1), batch b to engine b % engines. Returns each engine's batches in order; engines without
/// work get none. Every segment is in exactly one batch.
std::vector<std::vector<DealtBatch>> deal_round_robin(int64_t count, int64_t max_batch, int engines);

/// An engine over several engines of the same configuration (one per CUDA device): compute() deals the segments
/// with deal_round_robin (max_batch `deal`) and runs the engines concurrently, one host thread each, every engine
/// writing its segments' slots of `out`; the result is what one engine computes. Takes ownership of `engines`
/// (at least 1, equal layouts). Errors of any engine are rethrown after all have finished.
std::unique_ptr<MelEngine> make_multi_engine(std::vector<std::unique_ptr<MelEngine>> engines, int64_t deal);

/// Builds the CPU engine.
std::unique_ptr<MelEngine> make_cpu_engine(const EngineConfig& config);
/// Builds the CUDA engine. Throws CudaError when CUDA is unavailable or compiled out.
std::unique_ptr<MelEngine> make_cuda_engine(const EngineConfig& config);
/// Builds the engines plan_engines(device, cuda_device_count()) names: one engine, or a MultiEngine over one CUDA
/// engine per device (dealing batches of config.device_batch segments). auto: CUDA if available, else CPU.
std::unique_ptr<MelEngine> make_engine(Device device, const EngineConfig& config);

/// The value every output element takes for an all-zero segment: the log of zero energy (db: (20/power)*log10(amin),
/// ln: log(log_eps), none: 0). Used to fill long-segment slots that hold no audio.
float silence_value(const MelArgs& args);

}  // namespace melforge::mel
