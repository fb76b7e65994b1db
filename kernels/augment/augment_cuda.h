#pragma once
/// CUDA-free pieces of the CUDA augmenter (augment_cuda.cu) that the CPU tests exercise: the sizes of every device
/// and pinned buffer (AugmentBufferSizes, the one place they are computed), the impulse responses' preparation
/// (unit energy, direct path, FFT size), the plan of one apply() call (items packed into device batches, the
/// overlap-add block table and its chunks, the active-power frames) and the kernels' launch limits. Inline here or
/// in augment_cuda_host.cpp, which every build compiles (also -DMELFORGE_CUDA=OFF).
///
/// Device layout. Noise bank: every clip's samples concatenated (float), clip c at noise_offsets[c]. Impulse-response
/// spectra: clip c at its own FFT size ola_fft_size(taps) (augment_math.h), N/2 + 1 complex bins, concatenated at
/// RirInfo::spectrum_offset. One call's items that do work (a noise, an impulse response or a gain; identity items
/// are never touched) are packed back to back, [0, frames) of each, into the signal buffer (max_batch_samples
/// floats); the reverberated signal is accumulated into the output buffer of the same size. The overlap-add runs
/// per FFT size N, in chunks of chunk_blocks(N) blocks: the block buffer holds chunk_blocks(N) zero-padded blocks
/// of N floats, the spectrum buffer their N/2 + 1 bins each; one R2C and one C2R plan per N, batch chunk_blocks(N).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "augment.h"

namespace melforge::augment::cuda {

/// Threads per block of every augmentation kernel.
constexpr int kThreads = 256;
/// Largest one-dimensional grid (gridDim.x <= 2^31 - 1 on every architecture).
constexpr int64_t kMaxGridX = 2147483647;
/// Largest gridDim.y: the per-item kernels (energy, mix) put one item per y index.
constexpr int64_t kMaxGridY = 65535;
/// Most items of one device batch (the per-item tables' capacity, <= kMaxGridY); longer calls are split.
constexpr int64_t kMaxItemsPerBatch = 4096;
/// Floats of zero-padded blocks one overlap-add chunk aims at (32 MiB); a chunk holds at least one block.
constexpr int64_t kOlaChunkFloats = int64_t{1} << 23;
/// gridDim.x of the per-item kernels: blocks stride over an item's samples (mix) or frames (energy).
constexpr int64_t kItemGridX = 1024;

/// One complex bin as cuFFT stores it (cufftComplex, float2): real then imaginary part, 8-byte aligned.
struct alignas(8) Complex {
  /// Real part.
  float re;
  /// Imaginary part.
  float im;
};

/// An impulse response as the augmenters use it.
struct PreparedRir {
  /// Taps scaled to unit energy (sum of squares 1; all zeros when the clip is silent).
  std::vector<float> taps;
  /// Direct path: index of the first tap of largest |h|.
  int64_t direct = 0;
};

/// Index of the first sample of largest magnitude in `h` (0 for an empty span).
int64_t direct_path(std::span<const float> h);

/// `h` times the float 1 / sqrt(sum h^2) (sum in double), as the CPU augmenter scales it, and its direct path. A
/// silent clip stays all zeros.
PreparedRir prepare_rir(std::span<const float> h);

/// Where one impulse response lives on the device and how it is convolved.
struct RirInfo {
  /// Taps.
  int64_t taps = 0;
  /// Overlap-add FFT size: ola_fft_size(taps).
  int64_t fft_size = 0;
  /// Signal samples per block: ola_hop(taps).
  int64_t hop = 0;
  /// Direct path tap (prepare_rir).
  int64_t direct = 0;
  /// First bin of its spectrum in the concatenated spectra, complex elements.
  int64_t spectrum_offset = 0;
};

/// Samples of one active-power frame at `sample_rate`: round(sample_rate * kActiveFrameMs / 1000), at least 1.
int64_t active_frame_samples(int sample_rate);

/// Element counts of every buffer of the CUDA augmenter. The augmenter allocates exactly these (pinned host
/// buffers marked so, device buffers otherwise), and plan_batches never exceeds them.
struct AugmentBufferSizes {
  /// Most samples one apply() call's items may hold (sum of their spans' sizes).
  int64_t max_batch_samples = 0;
  /// Device and pinned: the packed signal of one device batch, floats (= max_batch_samples).
  int64_t signal_floats = 0;
  /// Device: the reverberated signal, accumulated by the overlap-add, floats (= max_batch_samples).
  int64_t out_floats = 0;
  /// Device: the noise bank's clips concatenated, floats.
  int64_t noise_floats = 0;
  /// Device: the impulse responses' spectra concatenated, complex (sum over clips of fft_size / 2 + 1).
  int64_t rir_spectrum_complex = 0;
  /// Floats of zero-padded blocks an overlap-add chunk aims at (kOlaChunkFloats unless a test asks otherwise).
  int64_t chunk_floats = 0;
  /// Distinct overlap-add FFT sizes of the impulse responses, ascending (one R2C and one C2R plan each).
  std::vector<int64_t> fft_sizes;
  /// Device: zero-padded blocks of one chunk, floats: the largest chunk_blocks(N, chunk_floats) * N.
  int64_t block_floats = 0;
  /// Device: spectra of one chunk, complex: the largest chunk_blocks(N, chunk_floats) * (N / 2 + 1).
  int64_t spectrum_complex = 0;
  /// Device and pinned: overlap-add block table entries (OlaBlock) of one device batch:
  /// max_batch_samples / smallest hop + items + 1 (0 without impulse responses).
  int64_t block_entries = 0;
  /// Device and pinned: per-item table entries (ItemParams) and scale pairs of one device batch.
  int64_t items = 0;
  /// Samples of one active-power frame (active_frame_samples).
  int64_t frame_samples = 0;
  /// Device and pinned: active-power frames of one device batch, each two doubles (signal and noise energy):
  /// max_batch_samples / frame_samples + items.
  int64_t energy_frames = 0;

  /// Bytes of the signal buffer (device and pinned alike).
  int64_t signal_bytes() const { return signal_floats * 4; }
  /// Bytes of the output buffer.
  int64_t out_bytes() const { return out_floats * 4; }
  /// Bytes of the noise bank.
  int64_t noise_bytes() const { return noise_floats * 4; }
  /// Bytes of the impulse responses' spectra.
  int64_t rir_spectrum_bytes() const { return rir_spectrum_complex * 8; }
  /// Bytes of the block buffer.
  int64_t block_bytes() const { return block_floats * 4; }
  /// Bytes of the chunk spectrum buffer.
  int64_t spectrum_bytes() const { return spectrum_complex * 8; }
  /// Bytes of the block table (device and pinned alike).
  int64_t block_table_bytes() const;
  /// Bytes of the item table (device and pinned alike).
  int64_t item_table_bytes() const;
  /// Bytes of the per-item scales: [items][2] floats (noise factor, gain amplitude), device and pinned alike.
  int64_t scale_bytes() const { return items * 8; }
  /// Bytes of the frame energies: [energy_frames][2] doubles, device and pinned alike.
  int64_t energy_bytes() const { return energy_frames * 16; }
  /// Device bytes, not counting cuFFT's work area (known once the plans exist).
  int64_t device_bytes() const;
  /// Pinned host bytes.
  int64_t pinned_bytes() const;
};

/// Blocks of one overlap-add chunk at FFT size `fft_size` for chunks of `chunk_floats`: max(1, chunk_floats /
/// fft_size) (the batch of its plans).
inline int64_t chunk_blocks(int64_t fft_size, int64_t chunk_floats) {
  const int64_t n = chunk_floats / fft_size;
  return n < 1 ? 1 : n;
}

/// Sizes for banks of clips of `noise_lengths` and `rir_lengths` samples, at `sample_rate`, for calls of up to
/// `max_batch_samples` samples, overlap-add chunks of `chunk_floats` (the tests shrink it to cut short signals into
/// several chunks). Throws InvalidArgument when max_batch_samples, sample_rate or chunk_floats is < 1.
AugmentBufferSizes augment_buffer_sizes(std::span<const int64_t> noise_lengths, std::span<const int64_t> rir_lengths,
                                        int sample_rate, int64_t max_batch_samples,
                                        int64_t chunk_floats = kOlaChunkFloats);

/// Smallest overlap-add hop (ola_hop) over impulse responses of `rir_lengths` taps; 0 without impulse responses.
int64_t smallest_hop(std::span<const int64_t> rir_lengths);

/// Host bytes one apply() call of the CUDA augmenter holds per item of `frames` frames beyond the item itself
/// (Augmenter::item_bytes): its ItemParams, its index, and its overlap-add block entries (frames / `min_hop` + 1,
/// none when min_hop is 0: no impulse responses).
int64_t device_item_bytes(int64_t frames, int64_t min_hop);

/// Blocks of a one-dimensional launch of `elements` threads: ceil(elements / kThreads).
inline int64_t grid_for(int64_t elements) { return (elements + kThreads - 1) / kThreads; }

/// Throws InvalidArgument naming the buffer and the limit when a kernel launched over `sizes` would exceed a grid
/// limit: the block kernels' ceil(block_floats / kThreads) blocks > kMaxGridX, or items > kMaxGridY.
void check_launch_limits(const AugmentBufferSizes& sizes);

/// The device's view of one item of a device batch.
struct ItemParams {
  /// First sample of the item in the packed signal (and output) buffer.
  int64_t offset = 0;
  /// Samples of the item (its Item::frames).
  int64_t frames = 0;
  /// First sample of its noise clip in the noise bank (0 without noise).
  int64_t noise_begin = 0;
  /// Samples of its noise clip (0 without noise).
  int64_t noise_size = 0;
  /// Recipe::noise_offset (0 without noise).
  int64_t noise_offset = 0;
  /// First of its active-power frames in the energy table.
  int64_t energy_offset = 0;
  /// 1 when the item was reverberated (its signal is in the output buffer), else 0.
  int32_t reverb = 0;
  /// 1 when noise is mixed in, else 0.
  int32_t noise = 0;
};

/// One zero-padded block of the overlap-add of one item.
struct OlaBlock {
  /// First sample of the item in the packed signal and output buffers.
  int64_t offset = 0;
  /// Samples of the item.
  int64_t frames = 0;
  /// Block index b within the item: it reads samples [b * hop, (b + 1) * hop).
  int64_t block = 0;
  /// Signal samples per block of the item's impulse response (ola_hop).
  int64_t hop = 0;
  /// Direct path of the item's impulse response.
  int64_t direct = 0;
  /// First bin of the impulse response's spectrum in the concatenated spectra.
  int64_t spectrum_offset = 0;
  /// 1 when the item's block b - 1 is the previous entry of the same chunk (its tail is added here), else 0.
  int32_t prev_in_chunk = 0;
  /// 1 when the item's block b + 1 is not in the same chunk (this block adds its own tail), else 0.
  int32_t last_in_chunk = 0;
};

/// A run of the block table convolved together: one R2C, product, C2R and overlap-add at one FFT size.
struct OlaChunk {
  /// FFT size of its blocks.
  int64_t fft_size = 0;
  /// First entry in the block table.
  int64_t first = 0;
  /// Entries (1..chunk_blocks(fft_size, chunk_floats)).
  int64_t count = 0;
};

/// One device batch of an apply() call: what is uploaded, convolved, measured, mixed and downloaded.
struct BatchPlan {
  /// Indices into the call's items, in packing order (only items that do work).
  std::vector<int64_t> items;
  /// Per packed item, same order.
  std::vector<ItemParams> params;
  /// Overlap-add blocks, grouped by FFT size (ascending), each group in chunk order.
  std::vector<OlaBlock> blocks;
  /// Chunks over `blocks`.
  std::vector<OlaChunk> chunks;
  /// Packed samples (sum of the items' frames).
  int64_t samples = 0;
  /// Active-power frames (sum over items of ceil(frames / frame_samples)).
  int64_t energy_frames = 0;
  /// Largest item frames.
  int64_t max_frames = 0;
  /// True when some item is reverberated.
  bool reverb = false;
  /// True when some item gets noise.
  bool noise = false;
};

/// True when the augmenter changes the item: an impulse response, a noise or a gain other than 0 dB, and at least
/// one frame (speed was applied by the decode).
bool does_work(const Augmenter::Item& item);

/// Checks a call's items before any work: each frames in [0, samples.size()], recipe indices inside the banks
/// (`noise_lengths`, `rir_count` clips), noise_offset inside its clip, and the sum of the spans' sizes <=
/// sizes.max_batch_samples. Throws InvalidArgument naming the item and the problem.
void check_items(std::span<const Augmenter::Item> items, std::span<const int64_t> noise_lengths, int64_t rir_count,
                 const AugmentBufferSizes& sizes);

/// Splits the items that do work into device batches of at most sizes.items items, packed in call order, and
/// builds their tables. `noise_offsets` / `noise_lengths`: each noise clip's first sample in the bank and length.
std::vector<BatchPlan> plan_batches(std::span<const Augmenter::Item> items, std::span<const RirInfo> rirs,
                                    std::span<const int64_t> noise_offsets, std::span<const int64_t> noise_lengths,
                                    const AugmentBufferSizes& sizes);

/// Where the banks' clips live on the device, computed once by the augmenter from its banks.
struct BankLayout {
  /// Samples of each noise clip.
  std::vector<int64_t> noise_lengths;
  /// First sample of each noise clip in the concatenated bank.
  std::vector<int64_t> noise_offsets;
  /// Taps of each impulse response.
  std::vector<int64_t> rir_lengths;
  /// Each impulse response's FFT size, hop, direct path and spectrum offset.
  std::vector<RirInfo> rirs;
  /// Each impulse response prepared (prepare_rir), to be zero-padded to its FFT size and transformed.
  std::vector<PreparedRir> prepared;
};

/// The layout of `noise` and `rir` (clips in bank order, spectra concatenated in clip order).
BankLayout bank_layout(const Bank& noise, const Bank& rir);

/// Per packed item of `plan`, [noise factor, gain amplitude] as the mix kernel reads them: noise_factor() of
/// active_power_from_energies() over the item's frames of `energy` (signal energies at [0, plan.energy_frames),
/// noise energies after them) as a float, 0 without noise; float(db_to_amplitude(gain_db)).
std::vector<float> item_scales(const BatchPlan& plan, std::span<const Augmenter::Item> items,
                               std::span<const double> energy, int64_t frame_samples);

/// ActivePower from per-frame energies of the signal and of the noise excerpt (frames of `frame_samples` samples,
/// the last one shorter, `frames` samples in all): the selection active_power() makes, on energies summed
/// elsewhere (the device).
ActivePower active_power_from_energies(std::span<const double> signal_energy, std::span<const double> noise_energy,
                                       int64_t frames, int64_t frame_samples);

}  // namespace melforge::augment::cuda
