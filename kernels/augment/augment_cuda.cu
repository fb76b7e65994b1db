// The CUDA augmenter: reverberation by overlap-add FFT convolution (gather -> cuFFT R2C -> product -> cuFFT C2R ->
// overlap-add), per-frame energies for the noise's SNR (reduced on the device, selected on the host by the same
// rule as the CPU), then noise and gain, on one stream of its own with persistent buffers (augment_cuda.h sizes them
// all). Compiled with --fmad=false like the mel engine: mix_sample, gain_sample and spectrum_product are the same
// IEEE operations as on the CPU.
// Launched on the stream directly, not captured into a CUDA graph like the mel engine: the number of overlap-add
// chunks (and of FFT sizes) varies from one device batch to the next. One apply() call at a time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cufft.h>

#include "augment.h"
#include "augment_cuda.h"
#include "augment_cuda_kernels.h"
#include "augment_math.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge::augment {
namespace cuda {
namespace {

static_assert(sizeof(Complex) == sizeof(cufftComplex) && alignof(Complex) == alignof(cufftComplex),
              "Complex must match cufftComplex");

/// Throws CudaError naming the call, file, line and error when `err` is not cudaSuccess (clearing the error state).
void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  throw CudaError(std::string(call) + " at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(err) +
                  ": " + cudaGetErrorString(err));
}

/// Throws CudaError naming the call, file, line and result when `r` is not CUFFT_SUCCESS.
void check_cufft(cufftResult r, const char* call, const char* file, int line) {
  if (r == CUFFT_SUCCESS) return;
  throw CudaError(std::string(call) + " at " + file + ":" + std::to_string(line) + ": cuFFT error " +
                  std::to_string(static_cast<int>(r)));
}

/// Destructor variant: never throws; silent while the runtime unloads, else prints to stderr.
void warn_cuda(cudaError_t err, const char* call) noexcept {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  std::fprintf(stderr, "melforge: CUDA augmenter: %s: %s\n", call, cudaGetErrorString(err));
}

}  // namespace
}  // namespace cuda

#define MELFORGE_AUG_CUDA(call) ::melforge::augment::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define MELFORGE_AUG_CUFFT(call) ::melforge::augment::cuda::check_cufft((call), #call, __FILE__, __LINE__)
#define MELFORGE_AUG_LAUNCHED() MELFORGE_AUG_CUDA(cudaGetLastError())

namespace cuda {
namespace {

__global__ void __launch_bounds__(kThreads) gather_kernel(ChunkArgs a) {
  gather_element(a, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kThreads) product_kernel(ChunkArgs a) {
  product_element(a, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

__global__ void __launch_bounds__(kThreads) overlap_add_kernel(ChunkArgs a) {
  overlap_add_element(a, blockIdx.x, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

/// One block per (frame, item): energy_partial per thread, summed by a tree in shared memory. Items without noise
/// are skipped (they have no frames in the table).
__global__ void __launch_bounds__(kThreads) energy_kernel(ItemArgs a, int64_t stride) {
  __shared__ double signal_sum[kThreads];
  __shared__ double noise_sum[kThreads];
  const int64_t item = blockIdx.y;
  const ItemParams& p = a.items[item];
  if (p.noise == 0) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int64_t frames = energy_frame_count(p.frames, a.frame_samples);
  for (int64_t f = blockIdx.x; f < frames; f += gridDim.x) {
    energy_partial(a, item, f, thread, kThreads, &signal_sum[thread], &noise_sum[thread]);
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (thread < half) {
        signal_sum[thread] += signal_sum[thread + half];
        noise_sum[thread] += noise_sum[thread + half];
      }
      __syncthreads();
    }
    if (thread == 0) {
      a.energy[p.energy_offset + f] = signal_sum[0];
      a.energy[stride + p.energy_offset + f] = noise_sum[0];
    }
    __syncthreads();
  }
}

/// Blocks of x stride over the item y's samples.
__global__ void __launch_bounds__(kThreads) mix_kernel(ItemArgs a) {
  const int64_t item = blockIdx.y;
  const int64_t frames = a.items[item].frames;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t t = flat_index(blockIdx.x, static_cast<int>(threadIdx.x), kThreads); t < frames; t += step) {
    mix_element(a, item, t);
  }
}

/// The R2C and C2R plans of one FFT size, batch chunk_blocks(fft_size).
struct FftPlans {
  int64_t fft_size = 0;
  cufftHandle forward = 0;
  cufftHandle inverse = 0;
  bool has_forward = false;
  bool has_inverse = false;
};

class CudaAugmenter final : public Augmenter {
 public:
  CudaAugmenter(const Bank& noise, const Bank& rir, int sample_rate, int device, int64_t max_batch_samples)
      : noise_(noise), rir_(rir), sample_rate_(sample_rate) {
    try {
      init(device, max_batch_samples);
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaAugmenter() override { release(); }
  CudaAugmenter(const CudaAugmenter&) = delete;
  CudaAugmenter& operator=(const CudaAugmenter&) = delete;

  void apply(std::span<Item> items) override;
  std::string name() const override { return "cuda-cufft"; }
  int64_t item_bytes(int64_t frames) const override;
  int64_t device_bytes() const override { return device_bytes_; }
  int64_t host_bytes() const override { return sizes_.pinned_bytes(); }

 private:
  void init(int device, int64_t max_batch_samples);
  void init_plans();
  void upload_rir_spectra(const std::vector<PreparedRir>& prepared);
  void run_batch(const BatchPlan& plan, std::span<Item> items);
  void reverberate(const BatchPlan& plan);
  void noise_factors(const BatchPlan& plan, std::span<Item> items);
  const FftPlans& plans_for(int64_t fft_size) const;
  ChunkArgs chunk_args(const OlaChunk& chunk) const;
  ItemArgs item_args(const BatchPlan& plan) const;
  void release() noexcept;
  template <class T>
  T* device_alloc(int64_t bytes);
  template <class T>
  T* pinned_alloc(int64_t bytes);

  const Bank& noise_;
  const Bank& rir_;
  int sample_rate_ = 0;
  int device_ = 0;
  bool runtime_ok_ = false;
  AugmentBufferSizes sizes_;
  BankLayout layout_;
  cudaStream_t stream_ = nullptr;
  std::vector<FftPlans> plans_;
  void* work_ = nullptr;
  float* d_noise_ = nullptr;
  Complex* d_rir_spectra_ = nullptr;
  float* d_signal_ = nullptr;
  float* d_out_ = nullptr;
  float* d_blocks_ = nullptr;
  Complex* d_spectra_ = nullptr;
  OlaBlock* d_table_ = nullptr;
  ItemParams* d_items_ = nullptr;
  float* d_scales_ = nullptr;
  double* d_energy_ = nullptr;
  float* h_signal_ = nullptr;
  OlaBlock* h_table_ = nullptr;
  ItemParams* h_items_ = nullptr;
  float* h_scales_ = nullptr;
  double* h_energy_ = nullptr;
  int64_t device_bytes_ = 0;
  int64_t min_hop_ = 0;
};

template <class T>
T* CudaAugmenter::device_alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  MELFORGE_AUG_CUDA(cudaMalloc(&p, static_cast<size_t>(bytes)));
  device_bytes_ += bytes;
  return static_cast<T*>(p);
}

template <class T>
T* CudaAugmenter::pinned_alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  MELFORGE_AUG_CUDA(cudaMallocHost(&p, static_cast<size_t>(bytes)));
  return static_cast<T*>(p);
}

void CudaAugmenter::init(int device, int64_t max_batch_samples) {
  layout_ = bank_layout(noise_, rir_);
  sizes_ = augment_buffer_sizes(layout_.noise_lengths, layout_.rir_lengths, sample_rate_, max_batch_samples);
  check_launch_limits(sizes_);
  min_hop_ = smallest_hop(layout_.rir_lengths);

  const mel::CudaDeviceQuery query = mel::query_cuda_devices();
  if (!query.usable()) throw CudaError("CUDA augmenter: no usable CUDA device: " + query.describe());
  if (device >= query.count) {
    throw InvalidArgument("CUDA augmenter: CUDA device " + std::to_string(device) + " does not exist (" +
                          std::to_string(query.count) + " found)");
  }
  if (device >= 0) MELFORGE_AUG_CUDA(cudaSetDevice(device));
  runtime_ok_ = true;
  MELFORGE_AUG_CUDA(cudaGetDevice(&device_));
  MELFORGE_AUG_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

  d_noise_ = device_alloc<float>(sizes_.noise_bytes());
  d_rir_spectra_ = device_alloc<Complex>(sizes_.rir_spectrum_bytes());
  d_signal_ = device_alloc<float>(sizes_.signal_bytes());
  d_out_ = device_alloc<float>(sizes_.out_bytes());
  d_blocks_ = device_alloc<float>(sizes_.block_bytes());
  d_spectra_ = device_alloc<Complex>(sizes_.spectrum_bytes());
  d_table_ = device_alloc<OlaBlock>(sizes_.block_table_bytes());
  d_items_ = device_alloc<ItemParams>(sizes_.item_table_bytes());
  d_scales_ = device_alloc<float>(sizes_.scale_bytes());
  d_energy_ = device_alloc<double>(sizes_.energy_bytes());
  h_signal_ = pinned_alloc<float>(sizes_.signal_bytes());
  h_table_ = pinned_alloc<OlaBlock>(sizes_.block_table_bytes());
  h_items_ = pinned_alloc<ItemParams>(sizes_.item_table_bytes());
  h_scales_ = pinned_alloc<float>(sizes_.scale_bytes());
  h_energy_ = pinned_alloc<double>(sizes_.energy_bytes());

  for (size_t c = 0; c < noise_.clips.size(); ++c) {
    const std::vector<float>& s = noise_.clips[c].samples;
    MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_noise_ + layout_.noise_offsets[c], s.data(), s.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_));
  }
  init_plans();
  upload_rir_spectra(layout_.prepared);
  layout_.prepared.clear();
  MELFORGE_AUG_CUDA(cudaStreamSynchronize(stream_));
}

void CudaAugmenter::init_plans() {
  size_t work_bytes = 0;
  for (const int64_t n : sizes_.fft_sizes) {
    plans_.push_back(FftPlans{n});
    FftPlans& p = plans_.back();
    long long size[1] = {n};
    long long real_embed[1] = {n};
    long long complex_embed[1] = {n / 2 + 1};
    const long long batch = chunk_blocks(n, sizes_.chunk_floats);
    size_t bytes = 0;
    MELFORGE_AUG_CUFFT(cufftCreate(&p.forward));
    p.has_forward = true;
    MELFORGE_AUG_CUFFT(cufftSetAutoAllocation(p.forward, 0));
    MELFORGE_AUG_CUFFT(cufftMakePlanMany64(p.forward, 1, size, real_embed, 1, n, complex_embed, 1, n / 2 + 1,
                                           CUFFT_R2C, batch, &bytes));
    work_bytes = std::max(work_bytes, bytes);
    MELFORGE_AUG_CUFFT(cufftCreate(&p.inverse));
    p.has_inverse = true;
    MELFORGE_AUG_CUFFT(cufftSetAutoAllocation(p.inverse, 0));
    MELFORGE_AUG_CUFFT(cufftMakePlanMany64(p.inverse, 1, size, complex_embed, 1, n / 2 + 1, real_embed, 1, n,
                                           CUFFT_C2R, batch, &bytes));
    work_bytes = std::max(work_bytes, bytes);
  }
  if (plans_.empty()) return;
  work_ = device_alloc<void>(static_cast<int64_t>(std::max<size_t>(work_bytes, 256)));
  for (FftPlans& p : plans_) {
    for (const cufftHandle h : {p.forward, p.inverse}) {
      MELFORGE_AUG_CUFFT(cufftSetWorkArea(h, work_));
      MELFORGE_AUG_CUFFT(cufftSetStream(h, stream_));
    }
  }
}

void CudaAugmenter::upload_rir_spectra(const std::vector<PreparedRir>& prepared) {
  std::vector<float> padded;
  for (const FftPlans& p : plans_) {
    const int64_t n = p.fft_size;
    const int64_t bins = n / 2 + 1;
    const int64_t cap = chunk_blocks(n, sizes_.chunk_floats);
    std::vector<size_t> clips;
    for (size_t c = 0; c < layout_.rirs.size(); ++c) {
      if (layout_.rirs[c].fft_size == n) clips.push_back(c);
    }
    for (size_t first = 0; first < clips.size(); first += static_cast<size_t>(cap)) {
      const size_t count = std::min(clips.size() - first, static_cast<size_t>(cap));
      padded.assign(static_cast<size_t>(cap * n), 0.0f);
      for (size_t k = 0; k < count; ++k) {
        const std::vector<float>& taps = prepared[clips[first + k]].taps;
        std::copy(taps.begin(), taps.end(), padded.begin() + static_cast<int64_t>(k) * n);
      }
      MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_blocks_, padded.data(), padded.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, stream_));
      MELFORGE_AUG_CUFFT(cufftExecR2C(p.forward, d_blocks_, reinterpret_cast<cufftComplex*>(d_spectra_)));
      for (size_t k = 0; k < count; ++k) {
        MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_rir_spectra_ + layout_.rirs[clips[first + k]].spectrum_offset,
                                          d_spectra_ + static_cast<int64_t>(k) * bins, bins * sizeof(Complex),
                                          cudaMemcpyDeviceToDevice, stream_));
      }
      MELFORGE_AUG_CUDA(cudaStreamSynchronize(stream_));
    }
  }
}

const FftPlans& CudaAugmenter::plans_for(int64_t fft_size) const {
  for (const FftPlans& p : plans_) {
    if (p.fft_size == fft_size) return p;
  }
  throw CudaError("CUDA augmenter: no FFT plan of size " + std::to_string(fft_size));
}

ChunkArgs CudaAugmenter::chunk_args(const OlaChunk& chunk) const {
  ChunkArgs a;
  a.signal = d_signal_;
  a.out = d_out_;
  a.blocks = d_blocks_;
  a.spectra = d_spectra_;
  a.rir_spectra = d_rir_spectra_;
  a.table = d_table_ + chunk.first;
  a.count = chunk.count;
  a.capacity = chunk_blocks(chunk.fft_size, sizes_.chunk_floats);
  a.fft_size = chunk.fft_size;
  a.scale = 1.0f / static_cast<float>(chunk.fft_size);
  return a;
}

ItemArgs CudaAugmenter::item_args(const BatchPlan& plan) const {
  ItemArgs a;
  a.signal = d_signal_;
  a.out = d_out_;
  a.noise = d_noise_;
  a.items = d_items_;
  a.scales = d_scales_;
  a.energy = d_energy_;
  a.count = static_cast<int64_t>(plan.items.size());
  a.frame_samples = sizes_.frame_samples;
  return a;
}

void CudaAugmenter::reverberate(const BatchPlan& plan) {
  MELFORGE_AUG_CUDA(cudaMemsetAsync(d_out_, 0, static_cast<size_t>(plan.samples) * sizeof(float), stream_));
  std::copy(plan.blocks.begin(), plan.blocks.end(), h_table_);
  MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_table_, h_table_, plan.blocks.size() * sizeof(OlaBlock),
                                    cudaMemcpyHostToDevice, stream_));
  for (const OlaChunk& chunk : plan.chunks) {
    const FftPlans& p = plans_for(chunk.fft_size);
    const ChunkArgs a = chunk_args(chunk);
    const int64_t bins = chunk.fft_size / 2 + 1;
    const auto grid = [](int64_t elements) { return static_cast<unsigned>(grid_for(elements)); };
    gather_kernel<<<grid(a.capacity * a.fft_size), kThreads, 0, stream_>>>(a);
    MELFORGE_AUG_LAUNCHED();
    MELFORGE_AUG_CUFFT(cufftExecR2C(p.forward, d_blocks_, reinterpret_cast<cufftComplex*>(d_spectra_)));
    product_kernel<<<grid(chunk.count * bins), kThreads, 0, stream_>>>(a);
    MELFORGE_AUG_LAUNCHED();
    MELFORGE_AUG_CUFFT(cufftExecC2R(p.inverse, reinterpret_cast<cufftComplex*>(d_spectra_), d_blocks_));
    overlap_add_kernel<<<grid(chunk.count * chunk.fft_size), kThreads, 0, stream_>>>(a);
    MELFORGE_AUG_LAUNCHED();
  }
}

void CudaAugmenter::noise_factors(const BatchPlan& plan, std::span<Item> items) {
  const auto n_items = static_cast<int64_t>(plan.items.size());
  const int64_t stride = plan.energy_frames;
  if (plan.noise) {
    const dim3 grid(static_cast<unsigned>(std::min(kItemGridX, energy_frame_count(plan.max_frames,
                                                                                  sizes_.frame_samples))),
                    static_cast<unsigned>(n_items));
    energy_kernel<<<grid, kThreads, 0, stream_>>>(item_args(plan), stride);
    MELFORGE_AUG_LAUNCHED();
    MELFORGE_AUG_CUDA(cudaMemcpyAsync(h_energy_, d_energy_, static_cast<size_t>(2 * stride) * sizeof(double),
                                      cudaMemcpyDeviceToHost, stream_));
    MELFORGE_AUG_CUDA(cudaStreamSynchronize(stream_));
  }
  const std::vector<float> scales =
      item_scales(plan, items, std::span<const double>(h_energy_, static_cast<size_t>(plan.noise ? 2 * stride : 0)),
                  sizes_.frame_samples);
  std::copy(scales.begin(), scales.end(), h_scales_);
  MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_scales_, h_scales_, static_cast<size_t>(n_items) * 2 * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
}

void CudaAugmenter::run_batch(const BatchPlan& plan, std::span<Item> items) {
  const auto n_items = static_cast<int64_t>(plan.items.size());
  for (int64_t k = 0; k < n_items; ++k) {
    const Item& item = items[static_cast<size_t>(plan.items[static_cast<size_t>(k)])];
    std::memcpy(h_signal_ + plan.params[static_cast<size_t>(k)].offset, item.samples.data(),
                static_cast<size_t>(item.frames) * sizeof(float));
  }
  std::copy(plan.params.begin(), plan.params.end(), h_items_);
  MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_signal_, h_signal_, static_cast<size_t>(plan.samples) * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  MELFORGE_AUG_CUDA(cudaMemcpyAsync(d_items_, h_items_, static_cast<size_t>(n_items) * sizeof(ItemParams),
                                    cudaMemcpyHostToDevice, stream_));
  if (static_cast<int64_t>(plan.blocks.size()) > sizes_.block_entries ||
      2 * plan.energy_frames > 2 * sizes_.energy_frames || plan.samples > sizes_.signal_floats) {
    throw CudaError("CUDA augmenter: a device batch exceeds its buffers (augment_buffer_sizes)");
  }
  if (plan.reverb) reverberate(plan);
  noise_factors(plan, items);
  const dim3 grid(static_cast<unsigned>(std::min(kItemGridX, grid_for(plan.max_frames))),
                  static_cast<unsigned>(n_items));
  mix_kernel<<<grid, kThreads, 0, stream_>>>(item_args(plan));
  MELFORGE_AUG_LAUNCHED();
  MELFORGE_AUG_CUDA(cudaMemcpyAsync(h_signal_, d_signal_, static_cast<size_t>(plan.samples) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  MELFORGE_AUG_CUDA(cudaStreamSynchronize(stream_));
  for (int64_t k = 0; k < n_items; ++k) {
    Item& item = items[static_cast<size_t>(plan.items[static_cast<size_t>(k)])];
    std::memcpy(item.samples.data(), h_signal_ + plan.params[static_cast<size_t>(k)].offset,
                static_cast<size_t>(item.frames) * sizeof(float));
  }
}

void CudaAugmenter::apply(std::span<Item> items) {
  check_items(items, layout_.noise_lengths, static_cast<int64_t>(layout_.rirs.size()), sizes_);
  const std::vector<BatchPlan> plans =
      plan_batches(items, layout_.rirs, layout_.noise_offsets, layout_.noise_lengths, sizes_);
  if (plans.empty()) return;
  MELFORGE_AUG_CUDA(cudaSetDevice(device_));
  try {
    for (const BatchPlan& plan : plans) run_batch(plan, items);
  } catch (...) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaGetLastError();
    throw;
  }
}

int64_t CudaAugmenter::item_bytes(int64_t frames) const { return device_item_bytes(frames, min_hop_); }

void CudaAugmenter::release() noexcept {
  if (!runtime_ok_) return;
  warn_cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (stream_ != nullptr) warn_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  for (const FftPlans& p : plans_) {
    if (p.has_forward) (void)cufftDestroy(p.forward);
    if (p.has_inverse) (void)cufftDestroy(p.inverse);
  }
  plans_.clear();
  for (void* p : {work_, static_cast<void*>(d_noise_), static_cast<void*>(d_rir_spectra_),
                  static_cast<void*>(d_signal_), static_cast<void*>(d_out_), static_cast<void*>(d_blocks_),
                  static_cast<void*>(d_spectra_), static_cast<void*>(d_table_), static_cast<void*>(d_items_),
                  static_cast<void*>(d_scales_), static_cast<void*>(d_energy_)}) {
    if (p != nullptr) warn_cuda(cudaFree(p), "cudaFree");
  }
  for (void* p : {static_cast<void*>(h_signal_), static_cast<void*>(h_table_), static_cast<void*>(h_items_),
                  static_cast<void*>(h_scales_), static_cast<void*>(h_energy_)}) {
    if (p != nullptr) warn_cuda(cudaFreeHost(p), "cudaFreeHost");
  }
  if (stream_ != nullptr) warn_cuda(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  stream_ = nullptr;
  runtime_ok_ = false;
}

}  // namespace
}  // namespace cuda

std::unique_ptr<Augmenter> make_cuda_augmenter(const Bank& noise, const Bank& rir, int sample_rate, int device,
                                               int64_t max_batch_samples) {
  return std::make_unique<cuda::CudaAugmenter>(noise, rir, sample_rate, device, max_batch_samples);
}

}  // namespace melforge::augment
