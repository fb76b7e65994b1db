// The CUDA log-mel engine: gather kernel -> batched cuFFT R2C -> power/mel/log kernel, captured once per slot into
// a CUDA graph together with its host<->device copies, and replayed for every device batch.
// compute_clips has a second graph per slot on the same plan and buffers: clip gather kernel -> the same cuFFT plan ->
// frame-major mel kernel. Its launches carry variable amounts (pieces, samples, rows), so its copies are issued on the
// slot's stream around the graph, each of exactly the bytes the launch holds.
// Kaldi fbank (MelArgs::features fbank) runs on the same slots, plans and graphs with its own kernels: the fbank
// gather (one block per FFT row: dither, DC removal, raw energy, pre-emphasis, window and zero padding, with block sums
// in shared memory) -> the same cuFFT plan -> the fbank mel kernel (Kaldi bank, log, energy column). With
// subtract_mean, segments get a column-mean kernel inside their graph; clips take two passes over the batch (a clip may
// span launches): the first graph sums each piece's columns (the host adds them up per clip), the second subtracts
// each clip's means uploaded with its launch.
// The library links libcudart and libcufft dynamically: machines without the CUDA toolkit need a build configured
// with -DMELFORGE_CUDA=OFF (mel_cuda_stub.cpp), where cuda_available() is false.
// Compiled with --fmad=false (kernels/CMakeLists.txt): no a * b + c is contracted into an FMA, so the window, power,
// mel sum and log are the same IEEE operations as the CPU engine's (which avoids FMA too, see mel_cpu.cpp).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cufft.h>
#include <nvtx3/nvToolsExt.h>

#include "filterbank.h"
#include "mel_cuda.h"
#include "mel_cuda_kernels.h"
#include "mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/timing.h"

#ifndef MELFORGE_CUDA_ARCHITECTURES
#error "MELFORGE_CUDA_ARCHITECTURES (CMAKE_CUDA_ARCHITECTURES, comma separated) must come from kernels/CMakeLists.txt"
#endif

namespace melforge::mel {
namespace cuda {
namespace {

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " at " + file + ":" + std::to_string(line);
}

const char* cufft_result_string(cufftResult r) {
  switch (r) {
    case CUFFT_SUCCESS: return "CUFFT_SUCCESS";
    case CUFFT_INVALID_PLAN: return "CUFFT_INVALID_PLAN";
    case CUFFT_ALLOC_FAILED: return "CUFFT_ALLOC_FAILED";
    case CUFFT_INVALID_TYPE: return "CUFFT_INVALID_TYPE";
    case CUFFT_INVALID_VALUE: return "CUFFT_INVALID_VALUE";
    case CUFFT_INTERNAL_ERROR: return "CUFFT_INTERNAL_ERROR";
    case CUFFT_EXEC_FAILED: return "CUFFT_EXEC_FAILED";
    case CUFFT_SETUP_FAILED: return "CUFFT_SETUP_FAILED";
    case CUFFT_INVALID_SIZE: return "CUFFT_INVALID_SIZE";
    case CUFFT_UNALIGNED_DATA: return "CUFFT_UNALIGNED_DATA";
    case CUFFT_INVALID_DEVICE: return "CUFFT_INVALID_DEVICE";
    case CUFFT_NO_WORKSPACE: return "CUFFT_NO_WORKSPACE";
    case CUFFT_NOT_IMPLEMENTED: return "CUFFT_NOT_IMPLEMENTED";
    case CUFFT_NOT_SUPPORTED: return "CUFFT_NOT_SUPPORTED";
    default: return "unknown cufftResult";
  }
}

/// Throws CudaError naming the call, file, line and error when `err` is not cudaSuccess. Clears the (non-sticky)
/// last-error state first so that a later cudaGetLastError() does not report the same failure again.
void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  throw CudaError(where(call, file, line) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

/// Throws CudaError naming the call, file, line and result when `r` is not CUFFT_SUCCESS.
void check_cufft(cufftResult r, const char* call, const char* file, int line) {
  if (r == CUFFT_SUCCESS) return;
  throw CudaError(where(call, file, line) + ": cuFFT error " + std::to_string(static_cast<int>(r)) + " (" +
                  cufft_result_string(r) + ")");
}

/// Destructor variant: never throws, stays silent when the runtime is already shutting down, else prints to stderr.
void check_cuda_nothrow(cudaError_t err, const char* call, const char* file, int line) noexcept {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  std::fprintf(stderr, "melforge: %s:%d: %s: %s\n", file, line, call, cudaGetErrorString(err));
}

/// Destructor variant for cuFFT.
void check_cufft_nothrow(cufftResult r, const char* call, const char* file, int line) noexcept {
  if (r == CUFFT_SUCCESS) return;
  std::fprintf(stderr, "melforge: %s:%d: %s: cuFFT error %d (%s)\n", file, line, call, static_cast<int>(r),
               cufft_result_string(r));
}

}  // namespace
}  // namespace cuda

#define MELFORGE_CUDA_CHECK(call) ::melforge::mel::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define MELFORGE_CUFFT_CHECK(call) ::melforge::mel::cuda::check_cufft((call), #call, __FILE__, __LINE__)
#define MELFORGE_CUDA_CHECK_NOTHROW(call) ::melforge::mel::cuda::check_cuda_nothrow((call), #call, __FILE__, __LINE__)
#define MELFORGE_CUFFT_CHECK_NOTHROW(call) \
  ::melforge::mel::cuda::check_cufft_nothrow((call), #call, __FILE__, __LINE__)

namespace cuda {
namespace {

__global__ void __launch_bounds__(kGatherBlock) gather_kernel(GatherParams p) {
  gather_frame(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kMelBlock) mel_kernel(MelParams p) {
  mel_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kGatherBlock) gather_clips_kernel(ClipGatherParams p) {
  gather_clip_frame(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kMelBlock) mel_frames_kernel(MelParams p) {
  mel_frame_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

/// Sum over the block's kFbankBlock threads of `v` (tree_level's order), returned to every thread. `partial` is the
/// block's shared [kFbankBlock] array; every thread of the block must call it.
__device__ double fbank_block_sum(double* partial, double v) {
  const int tid = static_cast<int>(threadIdx.x);
  partial[tid] = v;
  __syncthreads();
  for (int h = kFbankBlock / 2; h > 0; h /= 2) {
    if (tid < h) tree_level(partial, tid, h);
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();
  return total;
}

/// One block of kFbankBlock threads per FFT row (blockIdx.x): the frame's mean (remove_dc_offset), its raw energy,
/// the written frame and its energy after the window (raw_energy false), as the phases of mel_cuda_kernels.h. Every
/// branch around a block sum depends only on the parameters, so all threads of a block reach each __syncthreads.
__global__ void __launch_bounds__(kFbankBlock) fbank_gather_kernel(FbankFrameParams p) {
  __shared__ double partial[kFbankBlock];
  const int64_t row = blockIdx.x;
  if (row >= p.rows) return;
  const int tid = static_cast<int>(threadIdx.x);
  const FbankFrameSource src = fbank_frame_source(p, row);
  float mean = 0.0f;
  if (p.remove_dc_offset) {
    const double sum = fbank_block_sum(partial, fbank_partial_sum(p, src, tid, kFbankBlock));
    mean = static_cast<float>(sum) / static_cast<float>(p.win);
  }
  double energy = 0.0;
  if (p.energy != nullptr && p.raw_energy) {
    energy = fbank_block_sum(partial, fbank_partial_raw_energy(p, src, mean, tid, kFbankBlock));
  }
  const double written = fbank_write_frame(p, src, mean, row, tid, kFbankBlock);
  if (p.energy == nullptr) return;
  if (!p.raw_energy) energy = fbank_block_sum(partial, written);
  if (tid == 0) p.energy[row] = src.valid ? fbank_frame_log_energy(p, energy) : 0.0f;
}

__global__ void __launch_bounds__(kMelBlock) fbank_mel_kernel(FbankMelParams p) {
  fbank_mel_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kMelBlock) fbank_mel_frames_kernel(FbankMelParams p) {
  fbank_mel_frame_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kMelBlock) fbank_segment_mean_kernel(FbankMeanParams p) {
  fbank_segment_mean_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kMelBlock) fbank_piece_sum_kernel(FbankMeanParams p) {
  fbank_piece_sum_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kMelBlock) fbank_piece_subtract_kernel(FbankMeanParams p) {
  fbank_piece_subtract_element(p, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

/// NVTX range for the lifetime of the scope.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

/// Deepest nesting of child graphs count_nodes follows (cuFFT nests one level, if any).
constexpr int kMaxGraphDepth = 8;

/// Adds the nodes of `graph` at nesting depth `depth` (0: the captured graph) to `summary`, descending into child
/// graph nodes (cudaGraphChildGraphNodeGetGraph). See GraphNodeSummary for what is counted where.
void count_nodes(cudaGraph_t graph, int depth, GraphNodeSummary& summary) {
  if (depth > kMaxGraphDepth) {
    throw CudaError("captured mel graph nests child graphs deeper than " + std::to_string(kMaxGraphDepth) + " levels");
  }
  size_t n_nodes = 0;
  MELFORGE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n_nodes));
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  if (n_nodes > 0) MELFORGE_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n_nodes));
  if (depth == 0) summary.top_level_nodes = static_cast<int64_t>(n_nodes);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    MELFORGE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    switch (type) {
      case cudaGraphNodeTypeKernel: ++summary.kernels; break;
      case cudaGraphNodeTypeMemcpy: ++summary.copies; break;
      case cudaGraphNodeTypeMemset: ++summary.memsets; break;
      case cudaGraphNodeTypeEventRecord: summary.events += depth == 0 ? 1 : 0; break;
      case cudaGraphNodeTypeGraph: {
        ++summary.child_graphs;
        cudaGraph_t child = nullptr;
        MELFORGE_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
        count_nodes(child, depth + 1, summary);
        break;
      }
      default: break;
    }
  }
}

/// Set once the first accepted segment graph's counts have been printed (once per process).
std::atomic<bool> g_graph_counts_printed{false};
/// Set once the first accepted clip graph's counts have been printed (once per process).
std::atomic<bool> g_clip_graph_counts_printed{false};

/// What capture() checks and reports of one kind of graph.
struct GraphKind {
  /// "graph" or "clip graph", for the message.
  const char* name;
  /// Empty when a captured graph of this kind is complete, else why not (graph_problem, clip_graph_problem).
  std::string (*problem)(const GraphNodeSummary&);
  /// Set once a graph of this kind has had its counts printed.
  std::atomic<bool>* printed;
};

/// Everything one in-flight device batch needs. Slots alternate so that one batch's copies and kernels overlap the
/// host gather of the next.
struct Slot {
  /// Non-blocking stream the graph was captured on and is replayed on.
  cudaStream_t stream = nullptr;
  /// Batched R2C plan, bound to `stream`, using `work`.
  cufftHandle plan = 0;
  /// Whether `plan` was created (cufftHandle has no null value).
  bool has_plan = false;
  /// cuFFT work area, `work_bytes` bytes.
  void* work = nullptr;
  /// Size of the cuFFT work area.
  size_t work_bytes = 0;
  /// Device input: [batch][segment_samples] for compute(), a clip launch's samples for compute_clips
  /// (CudaClipSizes::staging_input_floats floats).
  float* d_input = nullptr;
  /// Device [batch * n_frames][n_fft] frames.
  float* d_frames = nullptr;
  /// Device [batch * n_frames][n_freqs] spectra.
  cufftComplex* d_spectrum = nullptr;
  /// Device [batch][n_mels][n_frames] output.
  void* d_output = nullptr;
  /// Pinned input, as d_input; read by the graph's H2D copy at replay time (compute) or by the clip launch's copy.
  float* h_input = nullptr;
  /// Device and pinned header of the current clip launch.
  ClipLaunchHeader* d_clip_header = nullptr;
  ClipLaunchHeader* h_clip_header = nullptr;
  /// Device and pinned piece tables of the current clip launch, CudaClipSizes::pieces entries.
  ClipPiece* d_clip_pieces = nullptr;
  ClipPiece* h_clip_pieces = nullptr;
  /// Pinned [batch][n_mels][n_frames] output, written by the graph's D2H copy.
  void* h_output = nullptr;
  /// Timing events recorded inside the graph: before H2D, after H2D, after the mel kernel, after D2H.
  std::array<cudaEvent_t, 4> marks{};
  /// Recorded on `stream` after each replay (outside the graph); the host waits on it before reusing the slot.
  cudaEvent_t done = nullptr;
  /// The captured pipeline.
  cudaGraphExec_t exec = nullptr;
  /// The captured clip pipeline (kernels only).
  cudaGraphExec_t clip_exec = nullptr;
  /// Gather kernel arguments, fixed for the slot's buffers.
  GatherParams gather{};
  /// Mel kernel arguments, fixed for the slot's buffers.
  MelParams mel{};
  /// Clip gather kernel arguments, fixed for the slot's buffers.
  ClipGatherParams clip_gather{};
  /// Frame-major mel kernel arguments, fixed for the slot's buffers.
  MelParams clip_mel{};
  /// Fbank: device [frame_rows] log energies (use_energy), else nullptr.
  float* d_energy = nullptr;
  /// Fbank with subtract_mean: device float values before the mean and the dtype, CudaBufferSizes::mean_floats.
  float* d_mean_values = nullptr;
  /// Fbank with subtract_mean: device and pinned [pieces][columns] statistics of a clip launch (CudaClipSizes).
  double* d_stats = nullptr;
  double* h_stats = nullptr;
  /// Fbank kernel arguments, fixed for the slot's buffers: segments, then clip launches.
  FbankFrameParams fbank_gather{};
  FbankMelParams fbank_mel{};
  FbankMeanParams fbank_mean{};
  FbankFrameParams fbank_clip_gather{};
  FbankMelParams fbank_clip_mel{};
  FbankMeanParams fbank_piece_sum{};
  FbankMeanParams fbank_piece_subtract{};
  /// Fbank with subtract_mean: the captured first pass of clip launches (kernels only, ending in the piece sums).
  cudaGraphExec_t clip_sum_exec = nullptr;
  /// The pending launch is a first (sum) pass: finish() adds h_stats into the clip sums instead of copying output.
  bool pending_sums = false;
  /// Sum pass: clip of the launch's first piece (piece i holds clip first_clip + i), and the launch's pieces.
  int64_t first_clip = 0;
  int64_t pieces = 0;
  /// A replay was launched and its output not yet copied out.
  bool pending = false;
  /// Where the pending launch's output goes: byte offset into the caller's output.
  int64_t out_offset = 0;
  /// Bytes of the pending launch's output (from the start of h_output).
  int64_t out_bytes = 0;
};

/// Which work a clip launch does: the mel or fbank output (`output`), or, for fbank with subtract_mean, the first
/// pass (`sums`: per-piece column sums only) and the second (`subtract`: the output less each clip's means).
enum class ClipPass { output, sums, subtract };

/// The CUDA engine. Everything is allocated, planned, warmed up and captured in the constructor; compute() only
/// fills pinned input, replays graphs and copies results out, alternating between the two slots.
/// times(), summed over every device batch since construction:
///   h2d_s: host wall time gathering the batch's segments into pinned input, plus the graph's H2D copy (events);
///   compute_s: gather kernel + cuFFT + mel kernel on the device (events around them inside the graph);
///   d2h_s: the graph's D2H copy (events), plus host wall time copying pinned output to the caller.
/// Device times of the two slots overlap each other, so their sum can exceed the wall time of compute().
/// A partial last batch is padded with zero segments and costs as much device time as a full one.
/// compute_clips() runs launches of CudaClipSizes::rows frame rows (the plan's batch) on the same slots, buffers and
/// plan, each filled by fill_clip_launch and replayed through the slot's clip graph; its copies and the four timing
/// marks are on the slot's stream around that graph. A partial last launch is padded with zero frames.
class CudaMelEngine final : public MelEngine {
 public:
  explicit CudaMelEngine(const EngineConfig& config) : config_(config) {
    try {
      init();
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaMelEngine() override { release(); }
  CudaMelEngine(const CudaMelEngine&) = delete;
  CudaMelEngine& operator=(const CudaMelEngine&) = delete;

  void compute(const float* base, std::span<const int64_t> offsets, void* out) override;
  void compute_clips(const float* samples, const ClipBatch& batch, void* out) override;
  std::string name() const override { return "cuda-cufft"; }
  EngineTimes times() const override { return times_; }
  int64_t device_bytes() const override { return device_bytes_; }
  int64_t host_bytes() const override { return pinned_bytes_; }
  const MelLayout& layout() const override { return layout_; }

 private:
  void init();
  void init_slot(Slot& s);
  void init_clip_slot(Slot& s);
  void init_fbank_slot(Slot& s);
  void init_fbank_clip_slot(Slot& s);
  void enqueue(Slot& s, bool capturing);
  void enqueue_segment_kernels(Slot& s, bool capturing);
  void enqueue_clip_kernels(Slot& s, bool capturing, bool sum_pass);
  void run_clip_pass(const float* samples, const ClipBatch& batch, void* out, ClipPass pass);
  void fill_clip_means(Slot& s, const ClipBatch& batch, int64_t first_clip, int64_t pieces);
  void warm_up_clips(Slot& s);
  template <class Enqueue>
  cudaGraphExec_t capture(Slot& s, const Enqueue& enqueue_work, const GraphKind& kind);
  void launch(Slot& s, int64_t first, int64_t count);
  void launch_clips(Slot& s, const ClipLaunchFill& fill, int64_t first_row, ClipPass pass);
  void finish(Slot& s, void* out);
  void abandon() noexcept;
  void release() noexcept;
  template <class T>
  T* device_alloc(int64_t bytes);
  template <class T>
  T* pinned_alloc(int64_t bytes);

  EngineConfig config_;
  MelLayout layout_;
  CudaBufferSizes sizes_;
  CudaClipSizes clip_sizes_;
  std::shared_ptr<const Filterbank> filterbank_;
  int device_ = 0;
  CudaDeviceSupport support_;
  bool runtime_ok_ = false;
  bool fbank_ = false;
  bool subtract_mean_ = false;
  /// Fbank with subtract_mean: [clips][columns] column sums of the current compute_clips batch (first pass).
  std::vector<double> clip_sums_;
  float* d_window_ = nullptr;
  int32_t* d_bands_ = nullptr;
  float* d_weights_ = nullptr;
  std::array<Slot, 2> slots_{};
  EngineTimes times_;
  int64_t device_bytes_ = 0;
  int64_t pinned_bytes_ = 0;
};

template <class T>
T* CudaMelEngine::device_alloc(int64_t bytes) {
  void* p = nullptr;
  MELFORGE_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes)));
  device_bytes_ += bytes;
  return static_cast<T*>(p);
}

template <class T>
T* CudaMelEngine::pinned_alloc(int64_t bytes) {
  void* p = nullptr;
  MELFORGE_CUDA_CHECK(cudaMallocHost(&p, static_cast<size_t>(bytes)));
  pinned_bytes_ += bytes;
  return static_cast<T*>(p);
}

void CudaMelEngine::init() {
  config_.mel.validate(config_.segment_samples);
  layout_ = make_layout(config_);
  if (config_.device_batch < 1) {
    throw InvalidArgument("device_batch must be >= 1, got " + std::to_string(config_.device_batch));
  }
  const CudaDeviceQuery query = query_cuda_devices();
  if (!query.usable()) throw CudaError("no usable CUDA device: " + query.describe());
  if (config_.cuda_device >= query.count) {
    throw InvalidArgument("CUDA device " + std::to_string(config_.cuda_device) + " does not exist (" +
                          std::to_string(query.count) + " found)");
  }
  if (config_.cuda_device >= 0) MELFORGE_CUDA_CHECK(cudaSetDevice(config_.cuda_device));
  runtime_ok_ = true;
  MELFORGE_CUDA_CHECK(cudaGetDevice(&device_));
  support_ = cuda_device_support(device_);
  if (!support_.supported()) {
    throw CudaError("CUDA device " + std::to_string(device_) + " (" + support_.name + "): " + support_.problem);
  }

  filterbank_ = cached_filterbank(config_.mel);
  fbank_ = config_.mel.is_fbank();
  subtract_mean_ = fbank_ && config_.mel.fbank.subtract_mean;
  const int n_fft = config_.mel.n_fft;
  sizes_ = cuda_buffer_sizes(layout_, n_fft, config_.device_batch, filterbank_->nnz(),
                             fbank_ ? &config_.mel.fbank : nullptr);
  check_launch_limits(sizes_, n_fft);
  clip_sizes_ = cuda_clip_sizes(sizes_, n_fft, config_.mel.hop());

  const std::vector<float> window = fbank_ ? fbank_window_table(config_.mel) : window_table(config_.mel);
  const Filterbank& fb = *filterbank_;
  const int n_bands = fbank_ ? config_.mel.fbank.num_mel_bins : layout_.n_mels;
  if (fb.n_mels != n_bands || fb.n_freqs != layout_.n_freqs) {
    throw InvalidArgument("CUDA mel engine: the filterbank has " + std::to_string(fb.n_mels) + " bands of " +
                          std::to_string(fb.n_freqs) + " bins, expected " + std::to_string(n_bands) + " of " +
                          std::to_string(layout_.n_freqs));
  }
  const std::vector<int32_t> bands = filterbank_band_table(fb);
  if (static_cast<int64_t>(bands.size()) != sizes_.filterbank_ints ||
      static_cast<int64_t>(window.size()) != sizes_.window_floats) {
    throw InvalidArgument("CUDA mel engine: filterbank or window table does not match the buffer sizes");
  }

  d_window_ = device_alloc<float>(sizes_.window_bytes());
  d_bands_ = device_alloc<int32_t>(sizes_.filterbank_index_bytes());
  d_weights_ = device_alloc<float>(std::max<int64_t>(sizes_.filterbank_weight_bytes(), sizeof(float)));
  MELFORGE_CUDA_CHECK(cudaMemcpy(d_window_, window.data(), sizes_.window_bytes(), cudaMemcpyHostToDevice));
  MELFORGE_CUDA_CHECK(cudaMemcpy(d_bands_, bands.data(), sizes_.filterbank_index_bytes(), cudaMemcpyHostToDevice));
  MELFORGE_CUDA_CHECK(
      cudaMemcpy(d_weights_, fb.weights.data(), sizes_.filterbank_weight_bytes(), cudaMemcpyHostToDevice));
  // cudaMemcpy from pageable memory may return before its DMA has finished, and it runs on the legacy default
  // stream, which the slots' non-blocking streams do not wait for: finish the uploads before any kernel reads them.
  MELFORGE_CUDA_CHECK(cudaDeviceSynchronize());

  for (Slot& s : slots_) {
    init_slot(s);
    init_clip_slot(s);
    if (fbank_) {
      init_fbank_slot(s);
      init_fbank_clip_slot(s);
    }
  }
  for (Slot& s : slots_) {
    std::memset(s.h_input, 0, static_cast<size_t>(clip_sizes_.staging_input_bytes()));
    enqueue(s, false);
    MELFORGE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    warm_up_clips(s);
  }
  for (Slot& s : slots_) {
    s.exec = capture(s, [&] { enqueue(s, true); }, GraphKind{"graph", graph_problem, &g_graph_counts_printed});
    s.clip_exec = capture(s, [&] { enqueue_clip_kernels(s, true, false); },
                          GraphKind{"clip graph", clip_graph_problem, &g_clip_graph_counts_printed});
    if (subtract_mean_) {
      s.clip_sum_exec = capture(s, [&] { enqueue_clip_kernels(s, true, true); },
                                GraphKind{"clip sum graph", clip_graph_problem, &g_clip_graph_counts_printed});
    }
  }
}

void CudaMelEngine::init_slot(Slot& s) {
  MELFORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : s.marks) MELFORGE_CUDA_CHECK(cudaEventCreate(&e));
  MELFORGE_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));

  MELFORGE_CUFFT_CHECK(cufftCreate(&s.plan));
  s.has_plan = true;
  MELFORGE_CUFFT_CHECK(cufftSetAutoAllocation(s.plan, 0));
  long long n[1] = {config_.mel.n_fft};
  long long inembed[1] = {config_.mel.n_fft};
  long long onembed[1] = {layout_.n_freqs};
  MELFORGE_CUFFT_CHECK(cufftMakePlanMany64(s.plan, 1, n, inembed, 1, config_.mel.n_fft, onembed, 1, layout_.n_freqs,
                                           CUFFT_R2C, sizes_.frame_rows, &s.work_bytes));
  s.work = device_alloc<void>(static_cast<int64_t>(std::max<size_t>(s.work_bytes, 256)));
  MELFORGE_CUFFT_CHECK(cufftSetWorkArea(s.plan, s.work));
  MELFORGE_CUFFT_CHECK(cufftSetStream(s.plan, s.stream));

  s.d_input = device_alloc<float>(clip_sizes_.staging_input_bytes());
  s.d_frames = device_alloc<float>(sizes_.frame_bytes());
  s.d_spectrum = device_alloc<cufftComplex>(sizes_.spectrum_bytes());
  s.d_output = device_alloc<void>(sizes_.output_bytes());
  s.h_input = pinned_alloc<float>(clip_sizes_.staging_input_bytes());
  s.h_output = pinned_alloc<void>(sizes_.output_bytes());

  const MelArgs& a = config_.mel;
  s.gather.input = s.d_input;
  s.gather.window = d_window_;
  s.gather.frames = s.d_frames;
  s.gather.segment_samples = layout_.segment_samples;
  s.gather.frame_rows = sizes_.frame_rows;
  s.gather.n_fft = a.n_fft;
  s.gather.hop = a.hop();
  s.gather.pad = a.pad();
  s.gather.n_frames = layout_.n_frames;
  s.gather.reflect = a.pad_mode == PadMode::reflect;

  s.mel.spectrum = s.d_spectrum;
  s.mel.bands = d_bands_;
  s.mel.weights = d_weights_;
  s.mel.out = s.d_output;
  s.mel.total = sizes_.output_elems;
  s.mel.n_mels = layout_.n_mels;
  s.mel.n_frames = layout_.n_frames;
  s.mel.n_freqs = layout_.n_freqs;
  s.mel.power = a.power;
  s.mel.log_mode = static_cast<int>(a.log);
  s.mel.amin = a.amin;
  s.mel.log_eps = a.log_eps;
  s.mel.fp16 = config_.dtype == DType::float16;
}

void CudaMelEngine::init_clip_slot(Slot& s) {
  s.d_clip_header = device_alloc<ClipLaunchHeader>(CudaClipSizes::header_bytes());
  s.h_clip_header = pinned_alloc<ClipLaunchHeader>(CudaClipSizes::header_bytes());
  s.d_clip_pieces = device_alloc<ClipPiece>(clip_sizes_.piece_bytes());
  s.h_clip_pieces = pinned_alloc<ClipPiece>(clip_sizes_.piece_bytes());

  const MelArgs& a = config_.mel;
  s.clip_gather.input = s.d_input;
  s.clip_gather.header = s.d_clip_header;
  s.clip_gather.pieces = s.d_clip_pieces;
  s.clip_gather.window = d_window_;
  s.clip_gather.frames = s.d_frames;
  s.clip_gather.rows = clip_sizes_.rows;
  s.clip_gather.n_fft = a.n_fft;
  s.clip_gather.hop = a.hop();
  s.clip_gather.pad = a.pad();

  s.clip_mel = s.mel;
  s.clip_mel.total = clip_sizes_.rows * layout_.n_mels;
  if (s.clip_mel.total != sizes_.output_elems) {
    throw InvalidArgument("CUDA mel engine: a clip launch's output does not match the slot's output buffer");
  }
}

void CudaMelEngine::init_fbank_slot(Slot& s) {
  if (sizes_.energy_bytes() > 0) s.d_energy = device_alloc<float>(sizes_.energy_bytes());
  if (sizes_.mean_bytes() > 0) s.d_mean_values = device_alloc<float>(sizes_.mean_bytes());
  const bool fp16 = config_.dtype == DType::float16;

  s.fbank_gather = fbank_frame_params(config_.mel);
  s.fbank_gather.input = s.d_input;
  s.fbank_gather.window = d_window_;
  s.fbank_gather.frames = s.d_frames;
  s.fbank_gather.energy = s.d_energy;
  s.fbank_gather.rows = sizes_.frame_rows;
  s.fbank_gather.segment_samples = layout_.segment_samples;
  s.fbank_gather.n_frames = layout_.n_frames;

  s.fbank_mel = fbank_mel_params(config_.mel);
  s.fbank_mel.spectrum = s.d_spectrum;
  s.fbank_mel.bands = d_bands_;
  s.fbank_mel.weights = d_weights_;
  s.fbank_mel.energy = s.d_energy;
  s.fbank_mel.out = subtract_mean_ ? static_cast<void*>(s.d_mean_values) : s.d_output;
  s.fbank_mel.total = sizes_.output_elems;
  s.fbank_mel.n_frames = layout_.n_frames;
  s.fbank_mel.float_out = subtract_mean_;
  s.fbank_mel.fp16 = fp16;

  s.fbank_mean.values = s.d_mean_values;
  s.fbank_mean.out = s.d_output;
  s.fbank_mean.total = sizes_.batch * layout_.n_mels;
  s.fbank_mean.n_cols = layout_.n_mels;
  s.fbank_mean.n_frames = layout_.n_frames;
  s.fbank_mean.fp16 = fp16;
  if (s.fbank_mel.n_cols != layout_.n_mels || (s.fbank_mel.energy_column >= 0) != (s.d_energy != nullptr) ||
      (subtract_mean_ && s.d_mean_values == nullptr)) {
    throw InvalidArgument("CUDA mel engine: the fbank columns or buffers do not match the layout");
  }
}

void CudaMelEngine::init_fbank_clip_slot(Slot& s) {
  if (clip_sizes_.stat_bytes() > 0) {
    s.d_stats = device_alloc<double>(clip_sizes_.stat_bytes());
    s.h_stats = pinned_alloc<double>(clip_sizes_.stat_bytes());
  }
  s.fbank_clip_gather = s.fbank_gather;
  s.fbank_clip_gather.header = s.d_clip_header;
  s.fbank_clip_gather.pieces = s.d_clip_pieces;
  s.fbank_clip_gather.rows = clip_sizes_.rows;

  s.fbank_clip_mel = s.fbank_mel;
  s.fbank_clip_mel.total = clip_sizes_.rows * layout_.n_mels;

  FbankMeanParams m;
  m.values = s.d_mean_values;
  m.out = s.d_output;
  m.header = s.d_clip_header;
  m.pieces = s.d_clip_pieces;
  m.stats = s.d_stats;
  m.n_cols = layout_.n_mels;
  m.fp16 = config_.dtype == DType::float16;
  s.fbank_piece_sum = m;
  s.fbank_piece_sum.total = clip_sizes_.pieces * layout_.n_mels;
  s.fbank_piece_subtract = m;
  s.fbank_piece_subtract.total = clip_sizes_.rows * layout_.n_mels;
  if (s.fbank_clip_mel.total > sizes_.output_elems || (subtract_mean_ && s.d_stats == nullptr)) {
    throw InvalidArgument("CUDA mel engine: a fbank clip launch does not match the slot's buffers");
  }
}

void CudaMelEngine::enqueue_clip_kernels(Slot& s, bool capturing, bool sum_pass) {
  const auto launched = [&] {
    if (!capturing) MELFORGE_CUDA_CHECK(cudaGetLastError());
  };
  const auto rows = static_cast<unsigned>(gather_grid(clip_sizes_.rows));
  if (fbank_) {
    fbank_gather_kernel<<<rows, kFbankBlock, 0, s.stream>>>(s.fbank_clip_gather);
  } else {
    gather_clips_kernel<<<rows, kGatherBlock, 0, s.stream>>>(s.clip_gather);
  }
  launched();
  MELFORGE_CUFFT_CHECK(cufftExecR2C(s.plan, s.d_frames, s.d_spectrum));
  if (!fbank_) {
    mel_frames_kernel<<<static_cast<unsigned>(mel_grid(s.clip_mel.total)), kMelBlock, 0, s.stream>>>(s.clip_mel);
    launched();
    return;
  }
  fbank_mel_frames_kernel<<<static_cast<unsigned>(mel_grid(s.fbank_clip_mel.total)), kMelBlock, 0, s.stream>>>(
      s.fbank_clip_mel);
  launched();
  if (!subtract_mean_) return;
  const FbankMeanParams& m = sum_pass ? s.fbank_piece_sum : s.fbank_piece_subtract;
  const auto grid = static_cast<unsigned>(mel_grid(m.total));
  if (sum_pass) {
    fbank_piece_sum_kernel<<<grid, kMelBlock, 0, s.stream>>>(m);
  } else {
    fbank_piece_subtract_kernel<<<grid, kMelBlock, 0, s.stream>>>(m);
  }
  launched();
}

void CudaMelEngine::warm_up_clips(Slot& s) {
  *s.h_clip_header = ClipLaunchHeader{};
  MELFORGE_CUDA_CHECK(cudaMemcpyAsync(s.d_clip_header, s.h_clip_header, CudaClipSizes::header_bytes(),
                                      cudaMemcpyHostToDevice, s.stream));
  enqueue_clip_kernels(s, false, false);
  if (subtract_mean_) enqueue_clip_kernels(s, false, true);
  MELFORGE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void CudaMelEngine::enqueue(Slot& s, bool capturing) {
  const auto mark = [&](int i) {
    if (capturing) MELFORGE_CUDA_CHECK(cudaEventRecordWithFlags(s.marks[i], s.stream, cudaEventRecordExternal));
  };
  mark(0);
  MELFORGE_CUDA_CHECK(
      cudaMemcpyAsync(s.d_input, s.h_input, sizes_.input_bytes(), cudaMemcpyHostToDevice, s.stream));
  mark(1);
  enqueue_segment_kernels(s, capturing);
  mark(2);
  MELFORGE_CUDA_CHECK(
      cudaMemcpyAsync(s.h_output, s.d_output, sizes_.output_bytes(), cudaMemcpyDeviceToHost, s.stream));
  mark(3);
}

void CudaMelEngine::enqueue_segment_kernels(Slot& s, bool capturing) {
  const auto launched = [&] {
    if (!capturing) MELFORGE_CUDA_CHECK(cudaGetLastError());
  };
  const auto rows = static_cast<unsigned>(gather_grid(sizes_.frame_rows));
  const auto elems = static_cast<unsigned>(mel_grid(sizes_.output_elems));
  if (!fbank_) {
    gather_kernel<<<rows, kGatherBlock, 0, s.stream>>>(s.gather);
    launched();
    MELFORGE_CUFFT_CHECK(cufftExecR2C(s.plan, s.d_frames, s.d_spectrum));
    mel_kernel<<<elems, kMelBlock, 0, s.stream>>>(s.mel);
    launched();
    return;
  }
  fbank_gather_kernel<<<rows, kFbankBlock, 0, s.stream>>>(s.fbank_gather);
  launched();
  MELFORGE_CUFFT_CHECK(cufftExecR2C(s.plan, s.d_frames, s.d_spectrum));
  fbank_mel_kernel<<<elems, kMelBlock, 0, s.stream>>>(s.fbank_mel);
  launched();
  if (!subtract_mean_) return;
  fbank_segment_mean_kernel<<<static_cast<unsigned>(mel_grid(s.fbank_mean.total)), kMelBlock, 0, s.stream>>>(
      s.fbank_mean);
  launched();
}

template <class Enqueue>
cudaGraphExec_t CudaMelEngine::capture(Slot& s, const Enqueue& enqueue_work, const GraphKind& kind) {
  const auto destroy_graph = [](cudaGraph_t g) {
    if (g != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphDestroy(g));
  };
  std::unique_ptr<CUgraph_st, decltype(destroy_graph)> graph(nullptr, destroy_graph);

  MELFORGE_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_work();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(s.stream, &partial);
    destroy_graph(partial);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t captured = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s.stream, &captured);
  graph.reset(captured);
  MELFORGE_CUDA_CHECK(end);
  MELFORGE_CUDA_CHECK(cudaGetLastError());

  GraphNodeSummary summary;
  count_nodes(graph.get(), 0, summary);
  const std::string problem = kind.problem(summary);
  if (!problem.empty()) throw CudaError(problem);
  if (!kind.printed->exchange(true)) {
    std::fprintf(stderr, "melforge: CUDA mel engine on device %d (%s, compute capability %d.%d): %s of %s\n",
                 device_, support_.name.c_str(), support_.cc_major, support_.cc_minor, kind.name,
                 describe(summary).c_str());
  }
  cudaGraphExec_t exec = nullptr;
  MELFORGE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
  try {
    MELFORGE_CUDA_CHECK(cudaGraphUpload(exec, s.stream));
    MELFORGE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  } catch (...) {
    MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(exec));
    throw;
  }
  return exec;
}

void CudaMelEngine::launch(Slot& s, int64_t first, int64_t count) {
  NvtxRange range("melforge cuda compute");
  MELFORGE_CUDA_CHECK(cudaGraphLaunch(s.exec, s.stream));
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.done, s.stream));
  s.pending = true;
  s.out_offset = first * layout_.out_bytes_per_segment();
  s.out_bytes = count * layout_.out_bytes_per_segment();
}

void CudaMelEngine::launch_clips(Slot& s, const ClipLaunchFill& fill, int64_t first_row, ClipPass pass) {
  NvtxRange range("melforge cuda clips");
  const int64_t stat_bytes = fill.pieces * layout_.n_mels * static_cast<int64_t>(sizeof(double));
  const int64_t row_bytes = static_cast<int64_t>(layout_.n_mels) * layout_.out_elem_bytes;
  const auto copy = [&](void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
    if (bytes > 0) MELFORGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, s.stream));
  };
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.marks[0], s.stream));
  copy(s.d_clip_header, s.h_clip_header, CudaClipSizes::header_bytes(), cudaMemcpyHostToDevice);
  copy(s.d_clip_pieces, s.h_clip_pieces, fill.pieces * static_cast<int64_t>(sizeof(ClipPiece)),
       cudaMemcpyHostToDevice);
  copy(s.d_input, s.h_input, fill.input_floats * static_cast<int64_t>(sizeof(float)), cudaMemcpyHostToDevice);
  if (pass == ClipPass::subtract) copy(s.d_stats, s.h_stats, stat_bytes, cudaMemcpyHostToDevice);
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.marks[1], s.stream));
  MELFORGE_CUDA_CHECK(cudaGraphLaunch(pass == ClipPass::sums ? s.clip_sum_exec : s.clip_exec, s.stream));
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.marks[2], s.stream));
  if (pass == ClipPass::sums) {
    copy(s.h_stats, s.d_stats, stat_bytes, cudaMemcpyDeviceToHost);
  } else {
    copy(s.h_output, s.d_output, fill.rows * row_bytes, cudaMemcpyDeviceToHost);
  }
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.marks[3], s.stream));
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.done, s.stream));
  s.pending = true;
  s.pending_sums = pass == ClipPass::sums;
  s.pieces = fill.pieces;
  s.out_offset = first_row * row_bytes;
  s.out_bytes = fill.rows * row_bytes;
}

void CudaMelEngine::finish(Slot& s, void* out) {
  NvtxRange range("melforge cuda download");
  MELFORGE_CUDA_CHECK(cudaEventSynchronize(s.done));
  s.pending = false;
  std::array<float, 3> ms{};
  for (size_t i = 0; i < ms.size(); ++i) {
    MELFORGE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], s.marks[i], s.marks[i + 1]));
  }
  times_.h2d_s += 1e-3 * ms[0];
  times_.compute_s += 1e-3 * ms[1];
  times_.d2h_s += 1e-3 * ms[2];
  const Stopwatch copy_out;
  if (s.pending_sums) {
    s.pending_sums = false;
    const int64_t cols = layout_.n_mels;
    if (s.first_clip < 0 || (s.first_clip + s.pieces) * cols > static_cast<int64_t>(clip_sums_.size())) {
      throw Error("CUDA mel engine: a clip launch's pieces lie outside the batch's clips");
    }
    double* sums = clip_sums_.data() + s.first_clip * cols;
    for (int64_t i = 0; i < s.pieces * cols; ++i) sums[i] += s.h_stats[i];
  } else {
    std::memcpy(static_cast<char*>(out) + s.out_offset, s.h_output, static_cast<size_t>(s.out_bytes));
  }
  times_.d2h_s += copy_out.seconds();
}

void CudaMelEngine::compute(const float* base, std::span<const int64_t> offsets, void* out) {
  if (offsets.empty()) return;
  if (base == nullptr || out == nullptr) throw InvalidArgument("CUDA mel engine: null input or output pointer");
  MELFORGE_CUDA_CHECK(cudaSetDevice(device_));
  const auto n = static_cast<int64_t>(offsets.size());
  const int64_t batches = batch_count(n, sizes_.batch);
  try {
    for (int64_t k = 0; k < batches; ++k) {
      Slot& s = slots_[static_cast<size_t>(k % 2)];
      if (s.pending) finish(s, out);
      const int64_t first = k * sizes_.batch;
      const int64_t count = std::min(sizes_.batch, n - first);
      {
        NvtxRange range("melforge cuda upload");
        const Stopwatch gather;
        fill_batch_input(s.h_input, base, offsets, first, count, layout_.segment_samples, sizes_);
        times_.h2d_s += gather.seconds();
      }
      launch(s, first, count);
    }
    for (int64_t k = std::max<int64_t>(0, batches - 2); k < batches; ++k) {
      Slot& s = slots_[static_cast<size_t>(k % 2)];
      if (s.pending) finish(s, out);
    }
  } catch (...) {
    abandon();
    throw;
  }
}

void CudaMelEngine::compute_clips(const float* samples, const ClipBatch& batch, void* out) {
  check_clip_batch(batch, config_.mel, config_.dtype);
  if (batch.clips() == 0) return;
  if (out == nullptr) throw InvalidArgument("CUDA mel engine: null output pointer");
  if (samples == nullptr && batch.sample_offsets.back() > batch.sample_offsets.front()) {
    throw InvalidArgument("CUDA mel engine: null input pointer");
  }
  MELFORGE_CUDA_CHECK(cudaSetDevice(device_));
  try {
    if (subtract_mean_) {
      clip_sums_.assign(static_cast<size_t>(batch.clips() * layout_.n_mels), 0.0);
      run_clip_pass(samples, batch, out, ClipPass::sums);
      run_clip_pass(samples, batch, out, ClipPass::subtract);
    } else {
      run_clip_pass(samples, batch, out, ClipPass::output);
    }
  } catch (...) {
    abandon();
    throw;
  }
}

void CudaMelEngine::run_clip_pass(const float* samples, const ClipBatch& batch, void* out, ClipPass pass) {
  const ClipFraming framing = clip_framing(config_.mel);
  ClipCursor cursor;
  int64_t row = 0;
  for (int64_t k = 0; row < batch.total_frames(); ++k) {
    Slot& s = slots_[static_cast<size_t>(k % 2)];
    if (s.pending) finish(s, out);
    const int64_t first_clip = cursor.clip;
    ClipLaunchFill fill;
    {
      NvtxRange range("melforge cuda upload");
      const Stopwatch gather;
      fill = fill_clip_launch(batch, samples, clip_sizes_, framing, cursor, *s.h_clip_header, s.h_clip_pieces,
                              s.h_input);
      if (pass == ClipPass::subtract) fill_clip_means(s, batch, first_clip, fill.pieces);
      times_.h2d_s += gather.seconds();
    }
    if (fill.rows < 1) throw Error("CUDA mel engine: a clip launch took no frame (clip " +
                                   std::to_string(cursor.clip) + ", frame " + std::to_string(cursor.frame) + ")");
    s.first_clip = first_clip;
    launch_clips(s, fill, row, pass);
    row += fill.rows;
  }
  for (Slot& s : slots_) {
    if (s.pending) finish(s, out);
  }
}

void CudaMelEngine::fill_clip_means(Slot& s, const ClipBatch& batch, int64_t first_clip, int64_t pieces) {
  const int64_t cols = layout_.n_mels;
  if (pieces * cols > clip_sizes_.stat_doubles || first_clip + pieces > batch.clips()) {
    throw Error("CUDA mel engine: a clip launch's pieces exceed its statistics buffer or the batch");
  }
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t c = first_clip + i;
    const auto frames = static_cast<double>(batch.frames(c));
    const double* sums = clip_sums_.data() + c * cols;
    for (int64_t col = 0; col < cols; ++col) {
      s.h_stats[i * cols + col] = static_cast<double>(static_cast<float>(sums[col] / frames));
    }
  }
}

void CudaMelEngine::abandon() noexcept {
  for (Slot& s : slots_) {
    if (s.stream != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s.stream));
    s.pending = false;
    s.pending_sums = false;
  }
}

void CudaMelEngine::release() noexcept {
  if (!runtime_ok_) return;
  MELFORGE_CUDA_CHECK_NOTHROW(cudaSetDevice(device_));
  for (Slot& s : slots_) {
    if (s.stream != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s.stream));
    if (s.exec != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(s.exec));
    if (s.clip_exec != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(s.clip_exec));
    if (s.clip_sum_exec != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(s.clip_sum_exec));
    if (s.has_plan) MELFORGE_CUFFT_CHECK_NOTHROW(cufftDestroy(s.plan));
    for (void* p : {static_cast<void*>(s.work), static_cast<void*>(s.d_input), static_cast<void*>(s.d_frames),
                    static_cast<void*>(s.d_spectrum), s.d_output, static_cast<void*>(s.d_clip_header),
                    static_cast<void*>(s.d_clip_pieces), static_cast<void*>(s.d_energy),
                    static_cast<void*>(s.d_mean_values), static_cast<void*>(s.d_stats)}) {
      if (p != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaFree(p));
    }
    for (void* p : {static_cast<void*>(s.h_input), s.h_output, static_cast<void*>(s.h_clip_header),
                    static_cast<void*>(s.h_clip_pieces), static_cast<void*>(s.h_stats)}) {
      if (p != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaFreeHost(p));
    }
    for (cudaEvent_t e : s.marks) {
      if (e != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    }
    if (s.done != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaEventDestroy(s.done));
    if (s.stream != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaStreamDestroy(s.stream));
    s = Slot{};
  }
  for (void* p : {static_cast<void*>(d_window_), static_cast<void*>(d_bands_), static_cast<void*>(d_weights_)}) {
    if (p != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaFree(p));
  }
  d_window_ = nullptr;
  d_bands_ = nullptr;
  d_weights_ = nullptr;
}

}  // namespace
}  // namespace cuda

CudaDeviceQuery query_cuda_devices() {
  CudaDeviceQuery q;
  q.built_with_cuda = true;
  if (cudaRuntimeGetVersion(&q.runtime_version) != cudaSuccess) q.runtime_version = 0;
  if (cudaDriverGetVersion(&q.driver_version) != cudaSuccess) q.driver_version = 0;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  if (err != cudaSuccess) {
    q.error_code = static_cast<int>(err);
    q.error_name = cudaGetErrorName(err);
    q.error_message = cudaGetErrorString(err);
    return q;
  }
  q.count = std::max(count, 0);
  return q;
}

int cuda_device_count() { return query_cuda_devices().count; }

bool cuda_available() { return cuda_device_count() > 0; }

std::string cuda_architectures() { return MELFORGE_CUDA_ARCHITECTURES; }

namespace {

/// Why device `s.device` (already current, its capability in `s`) cannot run the mel kernels; empty when it can.
std::string kernel_image_problem(const CudaDeviceSupport& s) {
  cudaFuncAttributes attributes{};
  for (const cudaError_t err : {cudaFuncGetAttributes(&attributes, cuda::gather_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::mel_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::gather_clips_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::mel_frames_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::fbank_gather_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::fbank_mel_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::fbank_mel_frames_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::fbank_segment_mean_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::fbank_piece_sum_kernel),
                                cudaFuncGetAttributes(&attributes, cuda::fbank_piece_subtract_kernel)}) {
    if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
      return no_kernel_image_message(s.cc_major, s.cc_minor, cuda_architectures()) + " (" + cudaGetErrorName(err) +
             ")";
    }
    if (err != cudaSuccess) return std::string("cudaFuncGetAttributes: ") + cudaGetErrorName(err) + ": " +
                                   cudaGetErrorString(err);
  }
  return "";
}

}  // namespace

CudaDeviceSupport cuda_device_support(int device) {
  CudaDeviceSupport s;
  s.device = device;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err == cudaSuccess) {
    s.cc_major = prop.major;
    s.cc_minor = prop.minor;
    s.name = prop.name;
    err = cudaSetDevice(device);
  }
  if (err == cudaSuccess) {
    s.problem = kernel_image_problem(s);
  } else {
    s.problem = std::string("cannot query the device: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  }
  (void)cudaGetLastError();
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
  return s;
}

std::unique_ptr<MelEngine> make_cuda_engine(const EngineConfig& config) {
  return std::make_unique<cuda::CudaMelEngine>(config);
}

}  // namespace melforge::mel
