// CUDA-free parts of the CUDA engine, compiled in every build (also -DMELFORGE_CUDA=OFF) so that the CPU tests
// check them: launch limits, the host side of clip launches (fill_clip_launch), the captured graphs' verdicts, and the
// messages that name the compiled architectures.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "mel/mel_cuda.h"
#include "mel/mel_engine.h"
#include "mel/mel_math.h"
#include "melforge/common/errors.h"

namespace melforge::mel {
namespace cuda {

int largest_prime_factor(int64_t n) {
  int64_t largest = 1;
  for (int64_t p = 2; p * p <= n; ++p) {
    while (n % p == 0) {
      largest = p;
      n /= p;
    }
  }
  if (n > 1) largest = n;
  return static_cast<int>(largest);
}

void check_launch_limits(const CudaBufferSizes& sizes, int n_fft) {
  const std::string batch = "device_batch " + std::to_string(sizes.batch);
  if (gather_grid(sizes.frame_rows) > kMaxGridBlocks) {
    throw InvalidArgument(batch + " is too large: its " + std::to_string(sizes.frame_rows) +
                          " FFT rows (batch * n_frames) exceed the gather kernel's grid limit of " +
                          std::to_string(kMaxGridBlocks) + " blocks");
  }
  if (mel_grid(sizes.output_elems) > kMaxGridBlocks) {
    throw InvalidArgument(batch + " is too large: its " + std::to_string(sizes.output_elems) +
                          " output elements exceed the mel kernel's grid limit of " + std::to_string(kMaxGridBlocks) +
                          " blocks of " + std::to_string(kMelBlock));
  }
  if (sizes.frame_floats > kLargeFftElements && largest_prime_factor(n_fft) > kMaxLargeFftPrime) {
    throw InvalidArgument(batch + " is too large for n_fft " + std::to_string(n_fft) +
                          ": cuFFT transforms of more than " + std::to_string(kLargeFftElements) + " elements (here " + std::to_string(sizes.frame_floats) +
                          ") need n_fft to factor into primes <= " + std::to_string(kMaxLargeFftPrime) +
                          "; use a smaller --device-batch");
  }
}

std::string describe(const GraphNodeSummary& s) {
  return std::to_string(s.top_level_nodes) + " top-level nodes, " + std::to_string(s.kernels) +
         " kernels (incl. child graphs), " + std::to_string(s.child_graphs) + " child graphs, " +
         std::to_string(s.copies) + " copies, " + std::to_string(s.memsets) + " memsets, " +
         std::to_string(s.events) + " event records";
}

std::string graph_problem(const GraphNodeSummary& s) {
  if (s.kernels >= kGraphMinKernels && s.copies >= kGraphMinCopies && s.events == kGraphEventRecords) return "";
  return "captured mel graph is incomplete: " + describe(s) + " (expected >= " + std::to_string(kGraphMinKernels) +
         " kernels: gather, cuFFT's and mel; >= " + std::to_string(kGraphMinCopies) + " copies; " +
         std::to_string(kGraphEventRecords) + " event records)";
}

namespace {

/// Frames of clip piece at `frame` (of `left` left in its clip of `samples` samples) that fit in `rows_left` rows and
/// `input_left` input samples: all that fit by rows when their samples fit, else as many as the bound of
/// piece_sample_range allows; 0 when not even one frame fits.
int64_t piece_frames(int64_t frame, int64_t left, int64_t samples, int64_t rows_left, int64_t input_left,
                     const ClipFraming& f) {
  const int64_t k = std::min(left, rows_left);
  int64_t lo = 0, hi = 0;
  piece_sample_range(frame, k, samples, f, lo, hi);
  if (hi - lo <= input_left) return k;
  const int64_t slack = input_left - f.n_fft - 2;
  return slack < 0 ? 0 : std::min(k, slack / f.hop + 1);
}

}  // namespace

ClipLaunchFill fill_clip_launch(const ClipBatch& batch, const float* samples, const CudaClipSizes& sizes,
                                const ClipFraming& framing, ClipCursor& cursor, ClipLaunchHeader& header,
                                ClipPiece* pieces, float* input) {
  ClipLaunchFill fill;
  while (cursor.clip < batch.clips() && fill.rows < sizes.rows && fill.pieces < sizes.pieces) {
    const int64_t c = cursor.clip;
    const int64_t len = batch.samples(c);
    const int64_t k = piece_frames(cursor.frame, batch.frames(c) - cursor.frame, len, sizes.rows - fill.rows,
                                   sizes.input_floats - fill.input_floats, framing);
    if (k == 0) break;
    int64_t lo = 0, hi = 0;
    piece_sample_range(cursor.frame, k, len, framing, lo, hi);
    pieces[fill.pieces] = ClipPiece{fill.rows, cursor.frame, len, lo, fill.input_floats,
                                    clip_reflects(len, framing.pad, framing.reflect) ? 1 : 0};
    if (hi > lo) {
      std::memcpy(input + fill.input_floats, samples + batch.sample_offsets[static_cast<size_t>(c)] + lo,
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
    ++fill.pieces;
    fill.rows += k;
    fill.input_floats += hi - lo;
    cursor.frame += k;
    if (cursor.frame == batch.frames(c)) {
      ++cursor.clip;
      cursor.frame = 0;
    }
  }
  header = ClipLaunchHeader{fill.pieces, fill.rows};
  return fill;
}

std::string clip_graph_problem(const GraphNodeSummary& s) {
  if (s.kernels >= kClipGraphMinKernels && s.events == 0) return "";
  return "captured clip mel graph is incomplete: " + describe(s) + " (expected >= " +
         std::to_string(kClipGraphMinKernels) + " kernels: gather, cuFFT's and mel; 0 event records)";
}

}  // namespace cuda

std::string describe_cuda_architectures(const std::string& architectures) {
  std::vector<std::string> real;
  std::vector<std::string> ptx;
  std::vector<std::string> other;
  std::stringstream in(architectures);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    if (entry.empty()) continue;
    const auto dash = entry.find('-');
    const std::string number = entry.substr(0, dash);
    const std::string suffix = dash == std::string::npos ? "" : entry.substr(dash + 1);
    const bool numeric = !number.empty() && number.find_first_not_of("0123456789") == std::string::npos;
    if (!numeric || (suffix != "" && suffix != "real" && suffix != "virtual")) {
      other.push_back(entry);
      continue;
    }
    if (suffix != "virtual") real.push_back("sm_" + number);
    if (suffix != "real") ptx.push_back("compute_" + number);
  }
  const auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : ", ") + items[i];
    return out;
  };
  std::string text = join(real);
  if (!ptx.empty()) text += (text.empty() ? "PTX for " : " and PTX for ") + join(ptx);
  if (!other.empty()) text += (text.empty() ? "" : "; ") + join(other);
  return text.empty() ? "no CUDA architecture" : text;
}

std::string no_kernel_image_message(int cc_major, int cc_minor, const std::string& architectures) {
  const std::string cc = std::to_string(cc_major) + "." + std::to_string(cc_minor);
  return "no kernel image for compute capability " + cc + " in this build; built for " +
         describe_cuda_architectures(architectures) + "; rebuild with -DCMAKE_CUDA_ARCHITECTURES including " +
         std::to_string(cc_major) + std::to_string(cc_minor) + "-real";
}

}  // namespace melforge::mel
