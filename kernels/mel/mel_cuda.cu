// The CUDA log-mel engine: gather kernel -> batched cuFFT R2C -> power/mel/log kernel, captured once per slot into
// a CUDA graph together with its host<->device copies, and replayed for every device batch.
// The library links libcudart and libcufft dynamically: machines without the CUDA toolkit need a build configured
// with -DMELFORGE_CUDA=OFF (mel_cuda_stub.cpp), where cuda_available() is false.
#include <algorithm>
#include <array>
#include <climits>
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

/// NVTX range for the lifetime of the scope.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

/// Graph nodes one slot's capture must contain: our two copies, our four timing events, and at least three kernels
/// (gather, cuFFT's own kernels, mel). Fewer kernels means cuFFT ran outside the capture. cuFFT may add copies or
/// memsets of its own, so copies are a minimum too.
constexpr size_t kGraphMemcpyNodes = 2;
constexpr size_t kGraphEventNodes = 4;
constexpr size_t kGraphMinKernelNodes = 3;

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
  /// Device [batch][segment_samples] input.
  float* d_input = nullptr;
  /// Device [batch * n_frames][n_fft] frames.
  float* d_frames = nullptr;
  /// Device [batch * n_frames][n_freqs] spectra.
  cufftComplex* d_spectrum = nullptr;
  /// Device [batch][n_mels][n_frames] output.
  void* d_output = nullptr;
  /// Pinned [batch][segment_samples] input, read by the graph's H2D copy at replay time.
  float* h_input = nullptr;
  /// Pinned [batch][n_mels][n_frames] output, written by the graph's D2H copy.
  void* h_output = nullptr;
  /// Timing events recorded inside the graph: before H2D, after H2D, after the mel kernel, after D2H.
  std::array<cudaEvent_t, 4> marks{};
  /// Recorded on `stream` after each replay (outside the graph); the host waits on it before reusing the slot.
  cudaEvent_t done = nullptr;
  /// The captured pipeline.
  cudaGraphExec_t exec = nullptr;
  /// Gather kernel arguments, fixed for the slot's buffers.
  GatherParams gather{};
  /// Mel kernel arguments, fixed for the slot's buffers.
  MelParams mel{};
  /// A replay was launched and its output not yet copied out.
  bool pending = false;
  /// First segment index of the pending batch.
  int64_t first = 0;
  /// Valid segments of the pending batch.
  int64_t count = 0;
};

/// The CUDA engine. Everything is allocated, planned, warmed up and captured in the constructor; compute() only
/// fills pinned input, replays graphs and copies results out, alternating between the two slots.
/// times(), summed over every device batch since construction:
///   h2d_s: host wall time gathering the batch's segments into pinned input, plus the graph's H2D copy (events);
///   compute_s: gather kernel + cuFFT + mel kernel on the device (events around them inside the graph);
///   d2h_s: the graph's D2H copy (events), plus host wall time copying pinned output to the caller.
/// Device times of the two slots overlap each other, so their sum can exceed the wall time of compute().
/// A partial last batch is padded with zero segments and costs as much device time as a full one.
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
  std::string name() const override { return "cuda-cufft"; }
  EngineTimes times() const override { return times_; }
  int64_t device_bytes() const override { return device_bytes_; }
  const MelLayout& layout() const override { return layout_; }

 private:
  void init();
  void init_slot(Slot& s);
  void enqueue(Slot& s, bool capturing);
  void capture(Slot& s);
  void launch(Slot& s, int64_t first, int64_t count);
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
  std::shared_ptr<const Filterbank> filterbank_;
  int device_ = 0;
  bool runtime_ok_ = false;
  float* d_window_ = nullptr;
  int32_t* d_bands_ = nullptr;
  float* d_weights_ = nullptr;
  std::array<Slot, 2> slots_{};
  EngineTimes times_;
  int64_t device_bytes_ = 0;
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
  return static_cast<T*>(p);
}

void CudaMelEngine::init() {
  config_.mel.validate(config_.segment_samples);
  layout_ = make_layout(config_);
  if (config_.device_batch < 1) {
    throw InvalidArgument("device_batch must be >= 1, got " + std::to_string(config_.device_batch));
  }
  const int devices = cuda_device_count();
  if (devices == 0) throw CudaError("no usable CUDA device (no driver, no device, or a failed device query)");
  if (config_.cuda_device >= devices) {
    throw InvalidArgument("CUDA device " + std::to_string(config_.cuda_device) + " does not exist (" +
                          std::to_string(devices) + " found)");
  }
  if (config_.cuda_device >= 0) MELFORGE_CUDA_CHECK(cudaSetDevice(config_.cuda_device));
  runtime_ok_ = true;
  MELFORGE_CUDA_CHECK(cudaGetDevice(&device_));

  filterbank_ = cached_filterbank(config_.mel);
  const int n_fft = config_.mel.n_fft;
  sizes_ = cuda_buffer_sizes(layout_, n_fft, config_.device_batch, filterbank_->nnz());
  if (sizes_.frame_rows > INT_MAX || mel_grid(sizes_.output_elems) > INT_MAX) {
    throw InvalidArgument("device_batch " + std::to_string(config_.device_batch) +
                          " is too large: batch * n_frames and the kernel grids must fit in int");
  }

  const std::vector<float> window = window_table(config_.mel);
  const Filterbank& fb = *filterbank_;
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

  for (Slot& s : slots_) init_slot(s);
  for (Slot& s : slots_) {
    std::memset(s.h_input, 0, static_cast<size_t>(sizes_.input_bytes()));
    enqueue(s, false);
    MELFORGE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  }
  for (Slot& s : slots_) capture(s);
}

void CudaMelEngine::init_slot(Slot& s) {
  MELFORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  for (cudaEvent_t& e : s.marks) MELFORGE_CUDA_CHECK(cudaEventCreate(&e));
  MELFORGE_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));

  MELFORGE_CUFFT_CHECK(cufftCreate(&s.plan));
  s.has_plan = true;
  MELFORGE_CUFFT_CHECK(cufftSetAutoAllocation(s.plan, 0));
  int n[1] = {config_.mel.n_fft};
  int inembed[1] = {config_.mel.n_fft};
  int onembed[1] = {layout_.n_freqs};
  MELFORGE_CUFFT_CHECK(cufftMakePlanMany(s.plan, 1, n, inembed, 1, config_.mel.n_fft, onembed, 1, layout_.n_freqs,
                                         CUFFT_R2C, static_cast<int>(sizes_.frame_rows), &s.work_bytes));
  s.work = device_alloc<void>(static_cast<int64_t>(std::max<size_t>(s.work_bytes, 256)));
  MELFORGE_CUFFT_CHECK(cufftSetWorkArea(s.plan, s.work));
  MELFORGE_CUFFT_CHECK(cufftSetStream(s.plan, s.stream));

  s.d_input = device_alloc<float>(sizes_.input_bytes());
  s.d_frames = device_alloc<float>(sizes_.frame_bytes());
  s.d_spectrum = device_alloc<cufftComplex>(sizes_.spectrum_bytes());
  s.d_output = device_alloc<void>(sizes_.output_bytes());
  s.h_input = pinned_alloc<float>(sizes_.input_bytes());
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

void CudaMelEngine::enqueue(Slot& s, bool capturing) {
  const auto mark = [&](int i) {
    if (capturing) MELFORGE_CUDA_CHECK(cudaEventRecordWithFlags(s.marks[i], s.stream, cudaEventRecordExternal));
  };
  mark(0);
  MELFORGE_CUDA_CHECK(
      cudaMemcpyAsync(s.d_input, s.h_input, sizes_.input_bytes(), cudaMemcpyHostToDevice, s.stream));
  mark(1);
  gather_kernel<<<static_cast<unsigned>(gather_grid(sizes_.frame_rows)), kGatherBlock, 0, s.stream>>>(s.gather);
  if (!capturing) MELFORGE_CUDA_CHECK(cudaGetLastError());
  MELFORGE_CUFFT_CHECK(cufftExecR2C(s.plan, s.d_frames, s.d_spectrum));
  mel_kernel<<<static_cast<unsigned>(mel_grid(sizes_.output_elems)), kMelBlock, 0, s.stream>>>(s.mel);
  if (!capturing) MELFORGE_CUDA_CHECK(cudaGetLastError());
  mark(2);
  MELFORGE_CUDA_CHECK(
      cudaMemcpyAsync(s.h_output, s.d_output, sizes_.output_bytes(), cudaMemcpyDeviceToHost, s.stream));
  mark(3);
}

void CudaMelEngine::capture(Slot& s) {
  const auto destroy_graph = [](cudaGraph_t g) {
    if (g != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphDestroy(g));
  };
  std::unique_ptr<CUgraph_st, decltype(destroy_graph)> graph(nullptr, destroy_graph);

  MELFORGE_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue(s, true);
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

  size_t n_nodes = 0;
  MELFORGE_CUDA_CHECK(cudaGraphGetNodes(graph.get(), nullptr, &n_nodes));
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  MELFORGE_CUDA_CHECK(cudaGraphGetNodes(graph.get(), nodes.data(), &n_nodes));
  size_t kernels = 0;
  size_t copies = 0;
  size_t events = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    MELFORGE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
    copies += type == cudaGraphNodeTypeMemcpy;
    events += type == cudaGraphNodeTypeEventRecord;
  }
  if (kernels < kGraphMinKernelNodes || copies < kGraphMemcpyNodes || events != kGraphEventNodes) {
    throw CudaError("captured mel graph is incomplete: " + std::to_string(n_nodes) + " nodes, " +
                    std::to_string(kernels) + " kernels (expected >= " + std::to_string(kGraphMinKernelNodes) +
                    "), " + std::to_string(copies) + " copies (expected >= " + std::to_string(kGraphMemcpyNodes) +
                    "), " + std::to_string(events) + " event records (expected " +
                    std::to_string(kGraphEventNodes) + ")");
  }
  MELFORGE_CUDA_CHECK(cudaGraphInstantiate(&s.exec, graph.get(), 0));
  MELFORGE_CUDA_CHECK(cudaGraphUpload(s.exec, s.stream));
  MELFORGE_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void CudaMelEngine::launch(Slot& s, int64_t first, int64_t count) {
  NvtxRange range("melforge cuda compute");
  MELFORGE_CUDA_CHECK(cudaGraphLaunch(s.exec, s.stream));
  MELFORGE_CUDA_CHECK(cudaEventRecord(s.done, s.stream));
  s.pending = true;
  s.first = first;
  s.count = count;
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
  const int64_t bytes_per_segment = layout_.out_bytes_per_segment();
  std::memcpy(static_cast<char*>(out) + s.first * bytes_per_segment, s.h_output,
              static_cast<size_t>(s.count * bytes_per_segment));
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

void CudaMelEngine::abandon() noexcept {
  for (Slot& s : slots_) {
    if (s.stream != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s.stream));
    s.pending = false;
  }
}

void CudaMelEngine::release() noexcept {
  if (!runtime_ok_) return;
  MELFORGE_CUDA_CHECK_NOTHROW(cudaSetDevice(device_));
  for (Slot& s : slots_) {
    if (s.stream != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(s.stream));
    if (s.exec != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaGraphExecDestroy(s.exec));
    if (s.has_plan) MELFORGE_CUFFT_CHECK_NOTHROW(cufftDestroy(s.plan));
    for (void* p : {static_cast<void*>(s.work), static_cast<void*>(s.d_input), static_cast<void*>(s.d_frames),
                    static_cast<void*>(s.d_spectrum), s.d_output}) {
      if (p != nullptr) MELFORGE_CUDA_CHECK_NOTHROW(cudaFree(p));
    }
    for (void* p : {static_cast<void*>(s.h_input), s.h_output}) {
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

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return std::max(count, 0);
}

bool cuda_available() { return cuda_device_count() > 0; }

std::unique_ptr<MelEngine> make_cuda_engine(const EngineConfig& config) {
  return std::make_unique<cuda::CudaMelEngine>(config);
}

}  // namespace melforge::mel
