#pragma once
/// PNG images written natively: 8-bit RGB, one IDAT chunk compressed with libdeflate's zlib stream, and a heat-map
/// picture of a matrix (the confusion matrix that the trainer shows in TensorBoard).
#include <cstdint>
#include <string>
#include <vector>

namespace melforge {

/// An 8-bit RGB picture.
struct RgbImage {
  /// Pixels per row and rows.
  int64_t width = 0, height = 0;
  /// Row-major R, G, B bytes: [height][width][3].
  std::vector<uint8_t> rgb;
};

/// The PNG file of `image`: signature, IHDR (8-bit truecolour, no interlace), one IDAT (filter 0 on every row, zlib
/// stream from libdeflate), IEND; each chunk with its CRC-32. Throws InvalidArgument when the size is not positive,
/// exceeds 2^31 - 1, or does not match the pixels.
std::string encode_png(const RgbImage& image);

/// The colour of `v` in [0, 1] (clamped; NaN is drawn grey) on a white-to-dark-blue scale, as R, G, B.
std::vector<uint8_t> heat_colour(double v);

/// A `rows` x `cols` matrix of `values` (row-major, each in [0, 1]) drawn as a heat map of `cell` x `cell`-pixel
/// squares (heat_colour) with a one-pixel light grey grid between them and around: (cols * (cell + 1) + 1) pixels
/// wide, (rows * (cell + 1) + 1) high. Throws InvalidArgument for sizes < 1 or a value count other than rows * cols.
RgbImage heat_map(const std::vector<double>& values, int64_t rows, int64_t cols, int64_t cell);

/// The side of a heat-map cell that keeps a matrix of `n` x `n` readable at about 400 pixels: 400 / n, clamped to
/// [4, 48].
int64_t heat_map_cell(int64_t n);

}  // namespace melforge
