#pragma once
/// One interface for the CPU (FFTW) and CUDA (cuFFT) log-mel engines. Documented here, once.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>
#include <string>
#include <utility>

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
  /// device. make_engine sets it to each planned device.
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

/// Bits of ClipBatch::flags: how a clip's frames differ from what torchaudio computes on the whole clip.
enum ClipFlag : uint8_t {
  /// The clip gives no STFT frame (stft_frames is 0: center false and fewer than n_fft samples, or no sample at all
  /// with an odd n_fft) or has no sample: it is zero-padded on the right to the one frame it gets.
  kClipPaddedToFrame = 1,
  /// Reflect padding was asked (center true, pad_mode reflect) but the clip has at most n_fft/2 samples, which
  /// torch.stft refuses: its edges are padded with zeros (pad_mode constant) instead. Frame count unchanged.
  kClipZeroEdges = 2,
};

/// Where MelEngine::compute_clips puts the frames of a batch of whole clips, and what it writes: the one place where a
/// ragged batch is sized (made by plan_clips; both engines check it with check_clip_batch). C clips, F frames.
///
/// Output layout: [F][n_mels], frame-major, clip after clip (clip c's frames are rows [frame_offsets[c],
/// frame_offsets[c + 1])). A clip's frames are then one contiguous run, so a batch is appended to an HDF5
/// `frames[total_frames, n_mels]` dataset as one hyperslab (any chunking along frames, whole rows per chunk), a view
/// of a clip is a row range, and the CUDA engine's mel kernel writes it coalesced. Transpose a view to get
/// torchaudio's [n_mels][n_frames].
struct ClipBatch {
  /// [C + 1] sample offsets into the caller's buffer: clip c is samples [sample_offsets[c], sample_offsets[c + 1]).
  std::vector<int64_t> sample_offsets;
  /// [C + 1] frame offsets into the output: clip c is rows [frame_offsets[c], frame_offsets[c + 1]); starts at 0.
  std::vector<int64_t> frame_offsets;
  /// [C] ClipFlag bits of each clip; 0 when its frames are exactly torchaudio's.
  std::vector<uint8_t> flags;
  /// Mel bands (columns of the output).
  int n_mels = 0;
  /// Bytes per output element (2 for float16, 4 for float32).
  int out_elem_bytes = 0;

  /// Clips: C.
  int64_t clips() const { return static_cast<int64_t>(flags.size()); }
  /// Samples of clip c.
  int64_t samples(int64_t c) const { return at(sample_offsets, c + 1) - at(sample_offsets, c); }
  /// Frames of clip c: clip_frames (mel_math.h) of its samples.
  int64_t frames(int64_t c) const { return at(frame_offsets, c + 1) - at(frame_offsets, c); }
  /// Frames of all clips: F.
  int64_t total_frames() const { return frame_offsets.empty() ? 0 : frame_offsets.back(); }
  /// Output elements: F * n_mels.
  int64_t out_elems() const { return total_frames() * n_mels; }
  /// Output bytes: F * n_mels * out_elem_bytes.
  int64_t out_bytes() const { return out_elems() * out_elem_bytes; }
  /// Clips [first, last) as a batch of their own: the same sample offsets (into the same buffer), frame offsets
  /// starting at 0 (the sub-batch's row r is row frame_offsets[first] + r of this batch). Throws InvalidArgument
  /// unless 0 <= first <= last <= C.
  ClipBatch slice(int64_t first, int64_t last) const;

 private:
  static int64_t at(const std::vector<int64_t>& v, int64_t i) { return v[static_cast<size_t>(i)]; }
};

/// Plans a batch of clips: C = sample_offsets.size() - 1 clips, clip c of sample_offsets[c + 1] - sample_offsets[c]
/// samples, each getting clip_frames() frames (torch.stft's count for `args`, at least 1) and its ClipFlag bits.
/// `dtype` sets out_elem_bytes. Throws InvalidArgument when `args` is invalid, sample_offsets is empty, negative or
/// decreasing.
ClipBatch plan_clips(const MelArgs& args, DType dtype, std::span<const int64_t> sample_offsets);

/// Throws InvalidArgument unless `batch` is what plan_clips(args, dtype, batch.sample_offsets) gives (checked in O(C)).
void check_clip_batch(const ClipBatch& batch, const MelArgs& args, DType dtype);

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
  /// Computes the log-mel frames of whole clips of any lengths: the STFT of each clip on its own (torchaudio's
  /// MelSpectrogram of the whole waveform, then the log), with the frames of many clips batched into each FFT. With
  /// fbank args: torchaudio.compliance.kaldi.fbank of each clip ([frames][bins], subtract_mean per clip; the CPU
  /// engine with float16 output and subtract_mean converts through a transient float copy; docs/FBANK.md).
  /// Clip c is samples [batch.sample_offsets[c], batch.sample_offsets[c + 1]) of `samples` (float32, mono).
  /// `out` receives batch.out_bytes(): [batch.total_frames()][n_mels] elements of the configured dtype (uint16 IEEE
  /// half bits for float16), clip c in rows [batch.frame_offsets[c], batch.frame_offsets[c + 1]). `batch` comes
  /// from plan_clips with this engine's mel args and dtype (checked: InvalidArgument otherwise); EngineConfig's
  /// segment_samples plays no part. Frames per FFT batch, fixed: the CPU engine's block (cpu_block_frames of the
  /// segment layout), the CUDA engine's plan (device_batch * n_frames rows per launch; the last launch padded).
  /// Not to be called concurrently with compute() on one engine.
  virtual void compute_clips(const float* samples, const ClipBatch& batch, void* out) = 0;
  /// Name for reports: "cpu-fftw" or "cuda-cufft".
  virtual std::string name() const = 0;
  /// Accumulated stage times.
  virtual EngineTimes times() const = 0;
  /// Bytes of device memory held (0 for the CPU engine).
  virtual int64_t device_bytes() const = 0;
  /// Bytes of host memory held for as long as the engine lives, beyond the caller's input and output: the CPU
  /// engine's per-thread scratch (cpu_scratch_bytes), the CUDA engine's pinned staging buffers (two slots of
  /// CudaBufferSizes::slot_pinned_bytes() + CudaClipSizes::extra_slot_bytes(): input, output and the clip launch
  /// tables). Callers that plan memory (the builder's --max-ram) reserve it.
  virtual int64_t host_bytes() const = 0;
  /// The layout this engine was built for.
  virtual const MelLayout& layout() const = 0;
};

/// Outcome of the CUDA device query (cudaGetDeviceCount), with its error kept. The CUDA error is carried as its
/// number, name and message, so that this header needs no CUDA type.
struct CudaDeviceQuery {
  /// False when melforge was built with -DMELFORGE_CUDA=OFF; then `count` is 0 and the other fields are empty.
  bool built_with_cuda = false;
  /// Usable devices: cudaGetDeviceCount's count, 0 when it failed.
  int count = 0;
  /// cudaGetDeviceCount's cudaError_t as a number: 0 on success, e.g. 35 (cudaErrorInsufficientDriver: no driver,
  /// or one older than the runtime needs) or 100 (cudaErrorNoDevice: a driver but no GPU).
  int error_code = 0;
  /// cudaGetErrorName of the error, e.g. "cudaErrorInsufficientDriver"; empty on success.
  std::string error_name;
  /// cudaGetErrorString of the error, e.g. "CUDA driver version is insufficient for CUDA runtime version"; empty on
  /// success.
  std::string error_message;
  /// cudaDriverGetVersion: the newest CUDA version the installed driver supports, 1000 * major + 10 * minor
  /// (13000 for 13.0); 0 when no driver is installed.
  int driver_version = 0;
  /// cudaRuntimeGetVersion: the version of the CUDA runtime this build links, same encoding.
  int runtime_version = 0;
  /// True when at least one device can be used.
  bool usable() const { return count > 0; }
  /// One line for messages and reports. Failure: "cudaGetDeviceCount: <error_name>: <error_message> (driver: none
  /// installed | CUDA X.Y; runtime: CUDA X.Y)"; without CUDA: "built without CUDA (MELFORGE_CUDA=OFF)"; success:
  /// "N CUDA device(s) (driver: ...; runtime: ...)".
  std::string describe() const;
};

/// Queries the CUDA devices: cudaRuntimeGetVersion, cudaDriverGetVersion, cudaGetDeviceCount. Never throws; leaves
/// no sticky CUDA error behind (after a failed count it makes no further CUDA call).
CudaDeviceQuery query_cuda_devices();

/// Whether this build's kernels can run on one CUDA device.
struct CudaDeviceSupport {
  /// Device index, 0..CudaDeviceQuery::count-1.
  int device = 0;
  /// Compute capability major version (8 for 8.6); 0 when the device could not be queried.
  int cc_major = 0;
  /// Compute capability minor version (6 for 8.6).
  int cc_minor = 0;
  /// Device name (cudaDeviceProp::name); empty when the device could not be queried.
  std::string name;
  /// Empty when this build can run its kernels on the device; else why not, e.g. no_kernel_image_message()'s text.
  std::string problem;
  /// True when `problem` is empty.
  bool supported() const { return problem.empty(); }
};

/// Checks that this build can run its mel kernels on device `device`: reads its compute capability and loads each
/// kernel (cudaFuncGetAttributes); cudaErrorNoKernelImageForDevice or cudaErrorInvalidDeviceFunction become
/// no_kernel_image_message(). Call only for a device query_cuda_devices() reported. Never throws; restores the
/// calling thread's current device and leaves no sticky CUDA error behind. Without CUDA: `problem` says so.
CudaDeviceSupport cuda_device_support(int device);

/// The CUDA architectures this build has device code for, as CMAKE_CUDA_ARCHITECTURES spelled them, comma separated
/// (e.g. "75-real,80-real,120-real,120-virtual"); empty when built without CUDA.
std::string cuda_architectures();

/// Human-readable form of a cuda_architectures() string: "sm_75, sm_80, sm_120 and PTX for compute_120". "NN-real"
/// is SASS for sm_NN, "NN-virtual" PTX for compute_NN, plain "NN" both; other entries (e.g. "all") are kept as
/// given. Empty input gives "no CUDA architecture".
std::string describe_cuda_architectures(const std::string& architectures);

/// The error for a device of compute capability `cc_major`.`cc_minor` that no code of this build runs on:
/// "no kernel image for compute capability X.Y in this build; built for <describe_cuda_architectures>; rebuild with
/// -DCMAKE_CUDA_ARCHITECTURES including XY-real".
std::string no_kernel_image_message(int cc_major, int cc_minor, const std::string& architectures);

/// True when a CUDA device can be used: query_cuda_devices().usable(). Never throws; leaves no sticky CUDA error.
bool cuda_available();

/// query_cuda_devices().count: 0 when built without CUDA, with no driver, no device, or a failed device query.
/// Never throws; leaves no sticky CUDA error behind.
int cuda_device_count();

/// The engines make_engine builds for a Device, and why.
///   cpu: one CPU engine.
///   auto: one CUDA engine per device that is usable and supported; the CPU engine when there is none, with
///     `fallback_reason` saying why (the failed device query, or each device's problem). Devices left out while
///     others are used are named in `fallback_reason` too.
///   cuda: one CUDA engine per device; `error` is set (and make_engine throws CudaError with it) when the device
///     query failed or found nothing, or when any device is unsupported.
struct EnginePlan {
  /// Use CUDA engines.
  bool cuda = false;
  /// CUDA devices to build one engine each on, in order; empty for the CPU engine and when `error` is set.
  std::vector<int> devices;
  /// For each of `devices`: "<name> (compute capability X.Y)", or "" when its support was not given.
  std::vector<std::string> device_names;
  /// auto only: why the CPU engine was chosen, or which devices were left out and why; empty otherwise.
  std::string fallback_reason;
  /// cuda only: why no CUDA engine can be built; empty when the devices can be used.
  std::string error;
  /// CudaDeviceQuery::describe() of the query the plan was made from; empty for Device::cpu (no query is made).
  std::string cuda_query;
  /// Engines to build: 1 for the CPU engine, devices.size() for CUDA (0 when `error` is set).
  int engines() const { return cuda ? static_cast<int>(devices.size()) : 1; }
};
/// Plans the engines for `device` from a device query and the support of devices 0..query.count-1 (`support[d]` for
/// device d; a device without an entry counts as supported). Pure: no CUDA call. See EnginePlan.
EnginePlan plan_engines(Device device, const CudaDeviceQuery& query, const std::vector<CudaDeviceSupport>& support);
/// query_cuda_devices(), cuda_device_support() for each device found (skipped for Device::cpu), then plan_engines.
/// Never throws.
EnginePlan choose_engines(Device device);

/// Which part of a compute() call one engine of a MultiEngine gets: segments [first, first + count).
struct DealtBatch {
  /// First segment.
  int64_t first = 0;
  /// Segments, >= 1.
  int64_t count = 0;
};
/// Deals `count` segments to `engines` engines in contiguous chunks of whole units of `unit` segments (a device
/// batch; values < 1 count as 1): the count / unit units (rounded up) are split into chunks of
/// ceil(units / engines) units, chunk b going to engine b % engines; the last chunk holds the remainder, so every
/// chunk but the one holding segment count - 1 is a whole multiple of `unit`. Each engine gets at most one chunk,
/// so each engine's compute() gets as many device batches as an even share allows and can pipeline them (the CUDA
/// engine overlaps one batch's host work with the previous batch's device work), and no engine gets more than
/// ceil(units / engines) units. Returns each engine's chunks in order; engines without work get none. Every segment
/// is in exactly one chunk, and the chunks in engine order cover [0, count) in order.
std::vector<std::vector<DealtBatch>> deal_round_robin(int64_t count, int64_t unit, int engines);

/// Splits clips [0, batch.clips()) into at most `engines` contiguous ranges [first, last) of about equal frame counts
/// (each range ends at the first clip boundary at or past its share of the frames), in order, none empty; every clip
/// is in exactly one range. No range for an empty batch.
std::vector<std::pair<int64_t, int64_t>> deal_clips(const ClipBatch& batch, int engines);

/// An engine over several engines of the same configuration (one per CUDA device): compute() deals the segments
/// with deal_round_robin (unit `deal`, the device batch) and runs the engines concurrently, one host thread each,
/// every engine writing its segments' slots of `out`; the result is what one engine computes. compute_clips() deals
/// the clips with deal_clips the same way, each engine writing its clips' rows. Takes ownership of
/// `engines` (at least 1, equal layouts). Errors of any engine are rethrown after all have finished.
std::unique_ptr<MelEngine> make_multi_engine(std::vector<std::unique_ptr<MelEngine>> engines, int64_t deal);

/// Builds the CPU engine.
std::unique_ptr<MelEngine> make_cpu_engine(const EngineConfig& config);
/// Builds the CUDA engine on config.cuda_device. Throws CudaError when CUDA is unavailable or compiled out (the
/// message names the device query's error), when the device has no kernel image of this build
/// (no_kernel_image_message()), or when a CUDA or cuFFT call fails.
std::unique_ptr<MelEngine> make_cuda_engine(const EngineConfig& config);
/// Builds the engines choose_engines(device) plans: one CPU engine, one CUDA engine, or a MultiEngine over one CUDA
/// engine per planned device (dealing units of config.device_batch segments). Throws CudaError with the plan's
/// `error` (Device::cuda without a usable, supported device). When `chosen` is not null it receives the plan, so
/// that the caller can log and report auto's fallback reason.
std::unique_ptr<MelEngine> make_engine(Device device, const EngineConfig& config, EnginePlan* chosen = nullptr);

/// The value every output element takes for an all-zero segment: the log of zero energy (db: (20/power)*log10(amin),
/// ln: log(log_eps), none: 0; fbank: the mel bins' log(FLT_EPSILON) with use_log_fbank, else 0; its energy column is
/// log(FLT_EPSILON) floored at log(energy_floor)). Used to fill long-segment slots that hold no audio.
float silence_value(const MelArgs& args);

}  // namespace melforge::mel
