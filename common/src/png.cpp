#include "melforge/common/png.h"

#include <libdeflate.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "melforge/common/errors.h"

namespace melforge {

namespace {

void put_be32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

/// Appends a chunk: length, type, data, CRC-32 of type and data.
void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.append(type, 4);
  out += data;
  put_be32(out, libdeflate_crc32(0, out.data() + start, out.size() - start));
}

std::string zlib_compress(const std::string& raw) {
  const std::unique_ptr<libdeflate_compressor, decltype(&libdeflate_free_compressor)> c(
      libdeflate_alloc_compressor(6), &libdeflate_free_compressor);
  if (!c) throw Error("PNG: cannot allocate a libdeflate compressor");
  std::string out(libdeflate_zlib_compress_bound(c.get(), raw.size()), '\0');
  const std::size_t n = libdeflate_zlib_compress(c.get(), raw.data(), raw.size(), out.data(), out.size());
  if (n == 0) throw Error("PNG: zlib compression failed");
  out.resize(n);
  return out;
}

}  // namespace

std::string encode_png(const RgbImage& image) {
  const int64_t w = image.width, h = image.height;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (w < 1 || h < 1 || w > kMax || h > kMax)
    throw InvalidArgument("PNG: image size " + std::to_string(w) + " x " + std::to_string(h) + " out of range");
  if (static_cast<int64_t>(image.rgb.size()) != w * h * 3)
    throw InvalidArgument("PNG: " + std::to_string(image.rgb.size()) + " bytes for " + std::to_string(w) + " x " +
                          std::to_string(h) + " RGB pixels");
  std::string raw;
  raw.reserve(static_cast<std::size_t>(h * (w * 3 + 1)));
  const auto* px = reinterpret_cast<const char*>(image.rgb.data());
  for (int64_t y = 0; y < h; ++y) {
    raw.push_back('\0');
    raw.append(px + y * w * 3, static_cast<std::size_t>(w * 3));
  }
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(w));
  put_be32(ihdr, static_cast<uint32_t>(h));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);
  std::string png("\x89PNG\r\n\x1a\n", 8);
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib_compress(raw));
  put_chunk(png, "IEND", "");
  return png;
}

std::vector<uint8_t> heat_colour(double v) {
  if (std::isnan(v)) return {160, 160, 160};
  v = std::clamp(v, 0.0, 1.0);
  const auto mix = [v](double from, double to) { return static_cast<uint8_t>(std::lround(from + (to - from) * v)); };
  return {mix(255, 8), mix(255, 48), mix(255, 107)};
}

RgbImage heat_map(const std::vector<double>& values, int64_t rows, int64_t cols, int64_t cell) {
  if (rows < 1 || cols < 1 || cell < 1)
    throw InvalidArgument("heat map: rows, columns and cell size must be >= 1");
  if (static_cast<int64_t>(values.size()) != rows * cols)
    throw InvalidArgument("heat map: " + std::to_string(values.size()) + " values for " + std::to_string(rows) +
                          " x " + std::to_string(cols));
  RgbImage img;
  img.width = cols * (cell + 1) + 1;
  img.height = rows * (cell + 1) + 1;
  img.rgb.assign(static_cast<std::size_t>(img.width * img.height * 3), 200);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const std::vector<uint8_t> colour = heat_colour(values[static_cast<std::size_t>(r * cols + c)]);
      for (int64_t y = 0; y < cell; ++y) {
        uint8_t* row = img.rgb.data() + ((r * (cell + 1) + 1 + y) * img.width + c * (cell + 1) + 1) * 3;
        for (int64_t x = 0; x < cell; ++x) std::copy(colour.begin(), colour.end(), row + x * 3);
      }
    }
  return img;
}

int64_t heat_map_cell(int64_t n) { return std::clamp<int64_t>(400 / std::max<int64_t>(n, 1), 4, 48); }

}  // namespace melforge
