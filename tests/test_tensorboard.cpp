// The native TensorBoard event files (common/tensorboard.h) and PNG images (common/png.h): CRC-32C against published
// vectors and a bit-by-bit reference, the TFRecord framing and the hand-encoded Event messages against bytes worked
// out by hand from event.proto and summary.proto, the event writer's files read back record by record, and the PNG
// decoded with zlib. The files are also read back by TensorBoard's own reader in python/tests/test_tensorboard.py.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/png.h"
#include "melforge/common/tensorboard.h"
#include "test_util.h"

namespace melforge_test_tensorboard {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;
namespace tb = melforge::tensorboard;

namespace {

/// CRC-32C one bit at a time (the naive reference).
uint32_t crc32c_bitwise(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (const char ch : data) {
    crc ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (const int v : b) s.push_back(static_cast<char>(v));
  return s;
}

uint64_t le(const std::string& s, std::size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

uint32_t be32(const std::string& s, std::size_t at) {
  uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The data of every record of a TFRecord file, each record's length and data CRCs checked.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < file.size()) {
    REQUIRE(file.size() - at >= 16);
    const uint64_t n = le(file, at, 8);
    CHECK(le(file, at + 8, 4) == mask(crc32c_bitwise(file.substr(at, 8))));
    REQUIRE(file.size() - at >= 16 + n);
    const std::string data = file.substr(at + 12, n);
    CHECK(le(file, at + 12 + n, 4) == mask(crc32c_bitwise(data)));
    out.push_back(data);
    at += 16 + n;
  }
  return out;
}

/// Event{wall_time 1.5, step `step_varint`} prefix: 09, the double's 8 bytes little-endian, 10, the varint.
std::string event_head(const std::string& step_varint) {
  return bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10}) + step_varint;
}

}  // namespace

TEST_CASE("crc32c matches the published check values and a bit-by-bit reference", "[tensorboard]") {
  CHECK(tb::crc32c("123456789") == 0xe3069283u);
  CHECK(tb::crc32c("") == 0u);
  CHECK(tb::crc32c(std::string(32, '\0')) == 0x8a9136aau);
  CHECK(tb::crc32c(std::string(32, '\xff')) == 0x62a8ab43u);
  const auto n = GENERATE(1, 7, 64, 1000);
  std::string data;
  for (int i = 0; i < n; ++i) data.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  CHECK(tb::crc32c(data) == crc32c_bitwise(data));
  CHECK(tb::crc32c(data.substr(n / 2), tb::crc32c(data.substr(0, n / 2))) == crc32c_bitwise(data));
  CHECK(tb::masked_crc32c(data) == mask(crc32c_bitwise(data)));
}

TEST_CASE("a TFRecord is the length, its masked CRC, the data and the data's masked CRC", "[tensorboard]") {
  const std::string data = GENERATE(std::string(), std::string("abc"), std::string(300, 'x'));
  const std::string r = tb::tfrecord(data);
  REQUIRE(r.size() == data.size() + 16);
  CHECK(le(r, 0, 8) == data.size());
  CHECK(le(r, 8, 4) == mask(crc32c_bitwise(r.substr(0, 8))));
  CHECK(r.substr(12, data.size()) == data);
  CHECK(le(r, 12 + data.size(), 4) == mask(crc32c_bitwise(data)));
}

TEST_CASE("the Event messages are encoded as event.proto and summary.proto say", "[tensorboard]") {
  CHECK(tb::file_version_event(1.5) == event_head(bytes({0})) + bytes({0x1a, 13}) + "brain.Event:2");
  CHECK(tb::scalar_event(1.5, 300, "a", 1.0f) ==
        event_head(bytes({0xac, 0x02})) + bytes({0x2a, 10, 0x0a, 8, 0x0a, 1, 'a', 0x15, 0, 0, 0x80, 0x3f}));
  CHECK(tb::scalar_event(1.5, 1, "loss/x", -2.0f) ==
        event_head(bytes({1})) + bytes({0x2a, 15, 0x0a, 13, 0x0a, 6}) + "loss/x" + bytes({0x15, 0, 0, 0, 0xc0}));
  CHECK(tb::image_event(1.5, 7, "im", 2, 3, 3, "xy") ==
        event_head(bytes({7})) + bytes({0x2a, 18, 0x0a, 16, 0x0a, 2, 'i', 'm', 0x22, 10, 0x08, 2, 0x10, 3, 0x18, 3,
                                        0x22, 2, 'x', 'y'}));
  CHECK(tb::session_start_event(1.5, 5) == event_head(bytes({5})) + bytes({0x3a, 2, 0x08, 1}));
  const std::string big = tb::image_event(1.5, 0, "t", 1, 1, 3, std::string(200, 'p'));
  CHECK(big.substr(9, 5) == bytes({0x10, 0, 0x2a, 0xda, 0x01}));
}

TEST_CASE("the event writer's file holds every record, named to sort after the folder's earlier files",
          "[tensorboard]") {
  TempDir d;
  const fs::path dir = d.path() / "tb";
  fs::path first;
  {
    tb::EventWriter w(dir);
    first = w.path();
    CHECK(first.parent_path() == dir);
    CHECK(first.filename().string().rfind("events.out.tfevents.", 0) == 0);
    CHECK(read_records(file_bytes(first)).size() == 1);
    w.add_scalar("train/loss", 10, 0.25);
    w.add_image("im", 10, "png", 1, 1);
    w.flush();
    CHECK(read_records(file_bytes(first)).size() == 3);
    w.add_session_start(11);
    w.close();
    w.close();
    CHECK_THROWS_AS(w.add_scalar("x", 1, 1), IoError);
  }
  const auto records = read_records(file_bytes(first));
  REQUIRE(records.size() == 4);
  CHECK(records[0].substr(9) == bytes({0x10, 0, 0x1a, 13}) + "brain.Event:2");
  CHECK(records[1].substr(9) == tb::scalar_event(0, 10, "train/loss", 0.25f).substr(9));
  CHECK(records[3].substr(9) == tb::session_start_event(0, 11).substr(9));
  tb::EventWriter second(dir);
  CHECK(second.path() != first);
  CHECK(second.path().filename().string() > first.filename().string());
}

TEST_CASE("the event writer refuses a folder it cannot create", "[tensorboard]") {
  TempDir d;
  test::write_text(d.path() / "file", "x");
  CHECK_THROWS_AS(tb::EventWriter(d.path() / "file" / "tb"), IoError);
}

TEST_CASE("encode_png writes an RGB PNG that zlib decodes to the same pixels", "[tensorboard][png]") {
  const auto [w, h] = GENERATE(table<int64_t, int64_t>({{1, 1}, {3, 2}, {17, 5}}));
  RgbImage img;
  img.width = w;
  img.height = h;
  for (int64_t i = 0; i < w * h * 3; ++i) img.rgb.push_back(static_cast<uint8_t>((i * 37) & 0xff));
  const std::string png = encode_png(img);
  REQUIRE(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  std::size_t at = 8;
  std::vector<std::string> types;
  std::string idat;
  while (at < png.size()) {
    const uint32_t n = be32(png, at);
    const std::string type = png.substr(at + 4, 4), data = png.substr(at + 8, n);
    const auto* p = reinterpret_cast<const Bytef*>(png.data() + at + 4);
    CHECK(be32(png, at + 8 + n) == static_cast<uint32_t>(crc32(0, p, n + 4)));
    if (type == "IHDR") {
      CHECK(be32(data, 0) == static_cast<uint32_t>(w));
      CHECK(be32(data, 4) == static_cast<uint32_t>(h));
      CHECK(data.substr(8) == bytes({8, 2, 0, 0, 0}));
    }
    if (type == "IDAT") idat += data;
    types.push_back(type);
    at += 12 + n;
  }
  CHECK(types == std::vector<std::string>{"IHDR", "IDAT", "IEND"});
  std::string raw(static_cast<std::size_t>(h * (w * 3 + 1)), '\0');
  uLongf size = raw.size();
  REQUIRE(uncompress(reinterpret_cast<Bytef*>(raw.data()), &size, reinterpret_cast<const Bytef*>(idat.data()),
                     idat.size()) == Z_OK);
  REQUIRE(size == raw.size());
  for (int64_t y = 0; y < h; ++y) {
    CHECK(raw[static_cast<std::size_t>(y * (w * 3 + 1))] == '\0');
    CHECK(raw.substr(static_cast<std::size_t>(y * (w * 3 + 1) + 1), static_cast<std::size_t>(w * 3)) ==
          std::string(img.rgb.begin() + y * w * 3, img.rgb.begin() + (y + 1) * w * 3));
  }
}

TEST_CASE("encode_png and heat_map refuse inconsistent sizes", "[tensorboard][png]") {
  RgbImage img;
  img.width = 2;
  img.height = 2;
  img.rgb.assign(11, 0);
  CHECK_THROWS_AS(encode_png(img), InvalidArgument);
  img.width = 0;
  img.rgb.clear();
  CHECK_THROWS_AS(encode_png(img), InvalidArgument);
  CHECK_THROWS_AS(heat_map({0.5, 0.5}, 1, 3, 4), InvalidArgument);
  CHECK_THROWS_AS(heat_map({0.5}, 1, 1, 0), InvalidArgument);
}

TEST_CASE("heat_map draws each value as a cell of its colour inside a one-pixel grid", "[tensorboard][png]") {
  const std::vector<double> v = {0.0, 1.0, 0.25, 0.75, 0.5, std::nan("")};
  const int64_t cell = 3;
  const RgbImage img = heat_map(v, 2, 3, cell);
  CHECK(img.width == 3 * 4 + 1);
  CHECK(img.height == 2 * 4 + 1);
  const auto pixel = [&](int64_t x, int64_t y) {
    const auto* p = img.rgb.data() + (y * img.width + x) * 3;
    return std::vector<uint8_t>(p, p + 3);
  };
  CHECK(pixel(0, 0) == std::vector<uint8_t>{200, 200, 200});
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      INFO(r << " " << c);
      CHECK(pixel(c * 4 + 1, r * 4 + 1) == heat_colour(v[static_cast<std::size_t>(r * 3 + c)]));
      CHECK(pixel(c * 4 + 3, r * 4 + 3) == heat_colour(v[static_cast<std::size_t>(r * 3 + c)]));
      CHECK(pixel(c * 4 + 4, r * 4 + 2) == std::vector<uint8_t>{200, 200, 200});
    }
  CHECK(heat_colour(0.0) == std::vector<uint8_t>{255, 255, 255});
  CHECK(heat_colour(1.0) == std::vector<uint8_t>{8, 48, 107});
  CHECK(heat_colour(2.0) == heat_colour(1.0));
  CHECK(heat_map_cell(2) == 48);
  CHECK(heat_map_cell(20) == 20);
  CHECK(heat_map_cell(500) == 4);
}

}  // namespace melforge_test_tensorboard
