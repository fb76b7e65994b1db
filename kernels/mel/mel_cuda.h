#pragma once
/// CUDA-free pieces of the CUDA mel engine that the engine (mel_cuda.cu) and the CPU tests share: the sizes of
/// every buffer and the launch limits they must meet, the host-side gather of one device batch into the pinned
/// input, and the check of a captured graph's node counts. Defined inline here or in mel_cuda_host.cpp, which every
/// build compiles (also -DMELFORGE_CUDA=OFF), so that the CPU tests exercise them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "filterbank.h"
#include "mel_engine.h"

namespace melforge::mel::cuda {

/// Threads per block of the gather kernel. One block per FFT row; threads stride over its n_fft samples.
constexpr int kGatherBlock = 128;
/// Threads per block of the mel kernel. One thread per output element.
constexpr int kMelBlock = 256;
/// Threads per block of the fbank gather kernels (a power of two: their block sums halve it, tree_level). One block
/// per FFT row; threads stride over its window_size samples.
constexpr int kFbankBlock = 256;
static_assert((kFbankBlock & (kFbankBlock - 1)) == 0, "kFbankBlock must be a power of two");
/// The most blocks a kernel's one-dimensional grid may have (gridDim.x <= 2^31 - 1 on every architecture).
constexpr int64_t kMaxGridBlocks = 2147483647;
/// Total real FFT input elements (frame_rows * n_fft) above which cuFFT's 64-bit plans need n_fft to factor into
/// primes <= kMaxLargeFftPrime (cuFFT documentation, cufftMakePlanMany64): 2^32.
constexpr int64_t kLargeFftElements = int64_t{1} << 32;
/// See kLargeFftElements.
constexpr int kMaxLargeFftPrime = 127;

/// Blocks of the gather kernel for `frame_rows` rows: one per row.
inline int64_t gather_grid(int64_t frame_rows) { return frame_rows; }
/// Blocks of the mel kernel for `output_elems` elements: ceil(output_elems / kMelBlock).
inline int64_t mel_grid(int64_t output_elems) { return (output_elems + kMelBlock - 1) / kMelBlock; }

/// Element counts of every buffer of the CUDA engine for one device batch. The engine allocates exactly these,
/// the tests index exactly these. "Per slot" buffers exist once per pipeline slot; the others once per engine.
struct CudaBufferSizes {
  /// Segments per device batch (the batch of the cuFFT plan and the CUDA graph).
  int64_t batch = 0;
  /// FFT rows per batch: batch * n_frames (the cuFFT batch and the gather kernel's grid).
  int64_t frame_rows = 0;
  /// Per slot, pinned host and device: input samples [batch][segment_samples], floats.
  int64_t input_floats = 0;
  /// Per slot, device: windowed frames [batch * n_frames][n_fft], floats.
  int64_t frame_floats = 0;
  /// Per slot, device: one-sided spectra [batch * n_frames][n_freqs], complex floats (8 bytes each).
  int64_t spectrum_complex = 0;
  /// Per slot, device and pinned host: output [batch][n_mels][n_frames], elements of `out_elem_bytes`.
  int64_t output_elems = 0;
  /// Bytes per output element (2 for float16, 4 for float32).
  int out_elem_bytes = 0;
  /// Shared, device: the window zero-padded to n_fft, floats.
  int64_t window_floats = 0;
  /// Shared, device: filterbank band table [begin n_mels][end n_mels][offset n_mels + 1], int32.
  int64_t filterbank_ints = 0;
  /// Shared, device: concatenated filterbank weights, floats.
  int64_t filterbank_weights = 0;
  /// Output columns (MelLayout::n_mels; for fbank num_mel_bins plus the energy column).
  int64_t columns = 0;
  /// Per slot, device, fbank with use_energy: the log energy of each FFT row [frame_rows], floats; else 0.
  int64_t energy_floats = 0;
  /// Per slot, device, fbank with subtract_mean: the float values before the mean is subtracted and the dtype
  /// applied, [output_elems] floats; else 0.
  int64_t mean_floats = 0;

  /// Bytes of one slot's input buffer (host and device alike).
  int64_t input_bytes() const { return input_floats * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of one slot's frame buffer.
  int64_t frame_bytes() const { return frame_floats * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of one slot's spectrum buffer.
  int64_t spectrum_bytes() const { return spectrum_complex * 2 * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of one slot's output buffer (host and device alike).
  int64_t output_bytes() const { return output_elems * out_elem_bytes; }
  /// Bytes of the window table.
  int64_t window_bytes() const { return window_floats * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of the filterbank band table.
  int64_t filterbank_index_bytes() const { return filterbank_ints * static_cast<int64_t>(sizeof(int32_t)); }
  /// Bytes of the filterbank weights.
  int64_t filterbank_weight_bytes() const { return filterbank_weights * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of one slot's fbank energy buffer.
  int64_t energy_bytes() const { return energy_floats * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of one slot's fbank subtract_mean buffer.
  int64_t mean_bytes() const { return mean_floats * static_cast<int64_t>(sizeof(float)); }
  /// Device bytes of one slot, not counting the cuFFT work area (known only once the plan exists).
  int64_t slot_device_bytes() const {
    return input_bytes() + frame_bytes() + spectrum_bytes() + output_bytes() + energy_bytes() + mean_bytes();
  }
  /// Device bytes shared by the slots.
  int64_t shared_device_bytes() const {
    return window_bytes() + filterbank_index_bytes() + filterbank_weight_bytes();
  }
  /// Pinned host bytes of one slot.
  int64_t slot_pinned_bytes() const { return input_bytes() + output_bytes(); }
};

/// Sizes for `layout`, FFT size `n_fft`, `batch` segments per device batch and a filterbank of `filterbank_nnz`
/// weights; `fbank` (MelArgs::fbank when features is fbank, else nullptr) adds the fbank buffers (energies with
/// use_energy, the float values with subtract_mean) and sizes the band table for its num_mel_bins. The one place
/// where the CUDA engine's buffers are sized.
inline CudaBufferSizes cuda_buffer_sizes(const MelLayout& layout, int n_fft, int64_t batch, int64_t filterbank_nnz,
                                         const fbank::FbankArgs* fbank = nullptr) {
  CudaBufferSizes s;
  s.batch = batch;
  s.frame_rows = batch * layout.n_frames;
  s.input_floats = batch * layout.segment_samples;
  s.frame_floats = layout.frame_floats(batch, n_fft);
  s.spectrum_complex = layout.spectrum_complex(batch);
  s.output_elems = batch * layout.out_elems_per_segment();
  s.out_elem_bytes = layout.out_elem_bytes;
  s.window_floats = n_fft;
  const int64_t bands = fbank != nullptr ? fbank->num_mel_bins : layout.n_mels;
  s.filterbank_ints = 3 * bands + 1;
  s.filterbank_weights = filterbank_nnz;
  s.columns = layout.n_mels;
  s.energy_floats = fbank != nullptr && fbank->use_energy ? s.frame_rows : 0;
  s.mean_floats = fbank != nullptr && fbank->subtract_mean ? s.output_elems : 0;
  return s;
}

/// The filterbank's band table as the mel kernel reads it: [begin n_mels][end n_mels][offset n_mels + 1].
inline std::vector<int32_t> filterbank_band_table(const Filterbank& fb) {
  std::vector<int32_t> bands;
  bands.reserve(fb.begin.size() + fb.end.size() + fb.offset.size());
  bands.insert(bands.end(), fb.begin.begin(), fb.begin.end());
  bands.insert(bands.end(), fb.end.begin(), fb.end.end());
  bands.insert(bands.end(), fb.offset.begin(), fb.offset.end());
  return bands;
}

/// Largest prime factor of n >= 1 (1 for n = 1).
int largest_prime_factor(int64_t n);

/// Throws InvalidArgument naming the device batch and the limit when one device batch of `sizes` (FFT size
/// `n_fft`) cannot run: the gather grid (frame_rows blocks) or the mel grid exceeds kMaxGridBlocks, or frame_rows *
/// n_fft exceeds kLargeFftElements while n_fft has a prime factor > kMaxLargeFftPrime. The FFT plan is 64-bit
/// (cufftMakePlanMany64) and every size here is int64, so frame_rows * n_fft may exceed 2^31 (and 2^32).
void check_launch_limits(const CudaBufferSizes& sizes, int n_fft);

/// Node counts of a captured graph. Kernels, copies and memsets are counted through child graphs
/// (cudaGraphNodeTypeGraph nodes, where cuFFT may put its kernels), event records at the top level only (the
/// engine's four timing marks are recorded on its own stream).
struct GraphNodeSummary {
  /// Nodes of the top-level graph.
  int64_t top_level_nodes = 0;
  /// Kernel nodes, including those inside child graphs.
  int64_t kernels = 0;
  /// Child graph nodes, at any depth.
  int64_t child_graphs = 0;
  /// Memcpy nodes, including those inside child graphs.
  int64_t copies = 0;
  /// Memset nodes, including those inside child graphs.
  int64_t memsets = 0;
  /// Event record nodes of the top-level graph.
  int64_t events = 0;
};

/// Kernels one slot's graph must hold at least: gather, cuFFT's own (at least one), mel. Fewer means cuFFT ran
/// outside the capture.
constexpr int64_t kGraphMinKernels = 3;
/// Copies one slot's graph must hold at least: our H2D and D2H (cuFFT may add copies of its own).
constexpr int64_t kGraphMinCopies = 2;
/// Event records one slot's graph must hold: the engine's four timing marks.
constexpr int64_t kGraphEventRecords = 4;

/// One line naming every count: "N top-level nodes, K kernels (incl. child graphs), C child graphs, P copies,
/// M memsets, E event records".
std::string describe(const GraphNodeSummary& summary);

/// Empty when a slot's captured graph is complete (kernels >= kGraphMinKernels, copies >= kGraphMinCopies,
/// events == kGraphEventRecords); else the reason, naming every count and what was expected.
std::string graph_problem(const GraphNodeSummary& summary);

/// Number of device batches for `count` segments: ceil(count / batch).
inline int64_t batch_count(int64_t count, int64_t batch) { return (count + batch - 1) / batch; }

/// Fills one batch's input [sizes.batch][segment_samples]: row j < count is samples
/// [offsets[first + j], offsets[first + j] + segment_samples) of `base`; rows count..batch-1 are zeros.
inline void fill_batch_input(float* dst, const float* base, std::span<const int64_t> offsets, int64_t first,
                             int64_t count, int64_t segment_samples, const CudaBufferSizes& sizes) {
  const auto row_bytes = static_cast<size_t>(segment_samples) * sizeof(float);
  for (int64_t j = 0; j < count; ++j) {
    std::memcpy(dst + j * segment_samples, base + offsets[static_cast<size_t>(first + j)], row_bytes);
  }
  std::fill(dst + count * segment_samples, dst + sizes.input_floats, 0.0f);
}

/// One clip's run of consecutive frames in one clip launch (compute_clips): what the gather kernel needs to frame the
/// piece's rows. Plain data, copied to the device as it is (48 bytes, no padding).
struct ClipPiece {
  /// First FFT row of the launch that holds the piece.
  int64_t row = 0;
  /// Frame of the clip that row `row` holds.
  int64_t frame = 0;
  /// Samples of the whole clip.
  int64_t samples = 0;
  /// Sample of the clip at input index `input`: the first of the clip's samples uploaded for this piece.
  int64_t origin = 0;
  /// Index into the launch's input of the clip's sample `origin`.
  int64_t input = 0;
  /// 1: the clip's edges are reflected (clip_reflects); 0: zeros beyond them.
  int64_t reflect = 0;
};

/// What one clip launch holds, read by the gather kernel from device memory.
struct ClipLaunchHeader {
  /// Pieces in the launch's piece table, >= 1.
  int64_t pieces = 0;
  /// FFT rows holding frames, <= CudaClipSizes::rows; the rows after them are zero frames (the padding of the launch).
  int64_t rows = 0;
};

/// Element counts of the buffers compute_clips adds to each slot of the CUDA engine, for the slot's plan of
/// CudaBufferSizes::frame_rows rows (the frame budget of one launch). The engine allocates exactly these.
struct CudaClipSizes {
  /// FFT rows per launch: the plan's batch (CudaBufferSizes::frame_rows).
  int64_t rows = 0;
  /// Most input samples one launch uploads: (rows - 1) * hop + n_fft + 2, enough for a piece of `rows` frames
  /// (piece_sample_range).
  int64_t input_floats = 0;
  /// Per slot, pinned host and device: the input buffer shared with compute(), max(CudaBufferSizes::input_floats,
  /// input_floats) floats.
  int64_t staging_input_floats = 0;
  /// Per slot, pinned host and device: piece table capacity, one per row (a piece holds at least one row).
  int64_t pieces = 0;
  /// Per slot, pinned host and device, fbank with subtract_mean: [pieces][columns] doubles, each piece's column sums
  /// (first pass) or its clip's column means (second pass); else 0.
  int64_t stat_doubles = 0;

  /// Bytes of one slot's (shared) input buffer.
  int64_t staging_input_bytes() const { return staging_input_floats * static_cast<int64_t>(sizeof(float)); }
  /// Bytes of one slot's piece table.
  int64_t piece_bytes() const { return pieces * static_cast<int64_t>(sizeof(ClipPiece)); }
  /// Bytes of one slot's launch header.
  static constexpr int64_t header_bytes() { return sizeof(ClipLaunchHeader); }
  /// Bytes of one slot's subtract_mean statistics.
  int64_t stat_bytes() const { return stat_doubles * static_cast<int64_t>(sizeof(double)); }
  /// Bytes one slot holds beyond CudaBufferSizes::slot_pinned_bytes (pinned) and slot_device_bytes (device) alike:
  /// the larger input buffer, the piece table, the header and the subtract_mean statistics.
  int64_t extra_slot_bytes(const CudaBufferSizes& sizes) const {
    return staging_input_bytes() - sizes.input_bytes() + piece_bytes() + header_bytes() + stat_bytes();
  }
};

/// Sizes of the clip buffers for a slot of `sizes`, FFT size `n_fft` and hop `hop`. The one place where they are
/// sized.
inline CudaClipSizes cuda_clip_sizes(const CudaBufferSizes& sizes, int n_fft, int hop) {
  CudaClipSizes c;
  c.rows = sizes.frame_rows;
  c.input_floats = (c.rows - 1) * hop + n_fft + 2;
  c.staging_input_floats = std::max(sizes.input_floats, c.input_floats);
  c.pieces = c.rows;
  c.stat_doubles = sizes.mean_floats > 0 ? c.pieces * sizes.columns : 0;
  return c;
}

/// Edges and padding of the clips of a launch: the MelArgs values the host planning and the gather kernel share.
struct ClipFraming {
  /// FFT size, samples.
  int n_fft = 0;
  /// Hop between frames, samples.
  int hop = 0;
  /// Padding on each side of a clip (n_fft/2 when centred, else 0).
  int pad = 0;
  /// Reflect padding asked (center and pad_mode reflect); a clip uses it when clip_reflects.
  bool reflect = false;
};

/// The framing of `args`'s clips. Mel: {n_fft, hop, pad, center && pad_mode reflect}. Fbank: a frame reads
/// window_size samples from frame_start(t) = t * shift - pad, pad = window_size / 2 - shift / 2 with snip_edges false
/// (0 otherwise), so {window_size, shift, pad, !snip_edges}: Kaldi's mirror image of a position left of the clip lies
/// inside its own frame and one right of it at most one sample before its frame (2 frame_start + window_size <= 2
/// samples + 1 for every frame of the clip), which piece_sample_range's one sample of slack covers.
inline ClipFraming clip_framing(const MelArgs& args) {
  if (!args.is_fbank()) {
    return ClipFraming{args.n_fft, args.hop(), args.pad(), args.center && args.pad_mode == PadMode::reflect};
  }
  const fbank::FbankArgs& f = args.fbank;
  return ClipFraming{f.window_size(args.sample_rate), f.window_shift(args.sample_rate),
                     static_cast<int>(-f.frame_start(0, args.sample_rate)), !f.snip_edges};
}

/// The samples [lo, hi) of a clip of `samples` samples that frames [frame, frame + frames) read, reflections
/// included: frame t reads positions [t*hop - pad, t*hop - pad + n_fft), and a reflected position lands at most one
/// sample outside its frame, so [first start - 1, last start + n_fft + 1) clipped to [0, samples). hi - lo <=
/// (frames - 1) * hop + n_fft + 2.
inline void piece_sample_range(int64_t frame, int64_t frames, int64_t samples, const ClipFraming& f, int64_t& lo,
                               int64_t& hi) {
  const int64_t first = frame * f.hop - f.pad;
  const int64_t last = (frame + frames - 1) * f.hop - f.pad;
  lo = std::clamp<int64_t>(first - 1, 0, samples);
  hi = std::clamp<int64_t>(last + f.n_fft + 1, lo, samples);
}

/// Where the host is in a clip batch: the next clip and frame to place in a launch.
struct ClipCursor {
  /// Clip index.
  int64_t clip = 0;
  /// Frame of that clip.
  int64_t frame = 0;
};

/// What fill_clip_launch put in a launch.
struct ClipLaunchFill {
  /// Frames placed (rows of the launch), >= 1 while the batch had frames left.
  int64_t rows = 0;
  /// Pieces placed.
  int64_t pieces = 0;
  /// Input samples placed.
  int64_t input_floats = 0;
};

/// Fills one clip launch from the frames of `batch` at `cursor` on: as many frames as fit in sizes.rows rows and
/// sizes.input_floats samples, clip after clip (a clip that does not fit is split, its frames continuing in the next
/// launch). Writes the header, pieces [0, pieces) and input [0, input_floats) (each piece's piece_sample_range of
/// `samples`), and advances `cursor`. A launch from a fresh budget always takes at least one frame.
ClipLaunchFill fill_clip_launch(const ClipBatch& batch, const float* samples, const CudaClipSizes& sizes,
                                const ClipFraming& framing, ClipCursor& cursor, ClipLaunchHeader& header,
                                ClipPiece* pieces, float* input);

/// Kernels a clip launch's graph must hold at least: gather, cuFFT's own (at least one), mel.
constexpr int64_t kClipGraphMinKernels = 3;

/// Empty when a slot's captured clip graph is complete (kernels >= kClipGraphMinKernels, no event record: its copies
/// and timing marks run outside it); else the reason, naming every count and what was expected.
std::string clip_graph_problem(const GraphNodeSummary& summary);

}  // namespace melforge::mel::cuda
