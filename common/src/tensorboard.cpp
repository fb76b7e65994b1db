#include "melforge/common/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "melforge/common/errors.h"

namespace fs = std::filesystem;

namespace melforge::tensorboard {

namespace {

/// Byte-wise table of the reflected Castagnoli polynomial.
std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}

/// Protocol-buffer wire types.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_key(std::string& out, uint32_t field, Wire wire) { put_varint(out, (uint64_t{field} << 3) | wire); }

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void put_int(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));
}

/// Event{wall_time = 1, step = 2} followed by `what` (the serialized oneof field, key included).
std::string event(double wall_time, int64_t step, const std::string& what) {
  std::string out;
  uint64_t bits = 0;
  std::memcpy(&bits, &wall_time, sizeof bits);
  put_key(out, 1, kFixed64);
  put_le(out, bits, 8);
  put_int(out, 2, step);
  out += what;
  return out;
}

/// Event.summary = 5 holding Summary{value = 1: `value`}.
std::string summary_field(const std::string& value) {
  std::string summary;
  put_bytes(summary, 1, value);
  std::string out;
  put_bytes(out, 5, summary);
  return out;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string name(buf.data());
  for (char& c : name)
    if (c == '/') c = '_';
  return name;
}

/// The largest 10-digit second among the event files of `dir` (-1 when none).
int64_t latest_event_second(const fs::path& dir) {
  const std::string prefix = "events.out.tfevents.";
  int64_t latest = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0 || name.size() < prefix.size() + 10) continue;
    const std::string digits = name.substr(prefix.size(), 10);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    latest = std::max<int64_t>(latest, std::stoll(digits));
  }
  return latest;
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  crc = ~crc;
  for (const char ch : data) crc = table[(crc ^ static_cast<uint8_t>(ch)) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(data.data(), data.size());
  put_le(out, masked_crc32c(data), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  std::string what;
  put_bytes(what, 3, "brain.Event:2");
  return event(wall_time, 0, what);
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(v, 2, kFixed32);
  put_le(v, bits, 4);
  return event(wall_time, step, summary_field(v));
}

std::string image_event(double wall_time, int64_t step, std::string_view tag, int64_t height, int64_t width,
                        int64_t colorspace, std::string_view png) {
  std::string image;
  put_int(image, 1, height);
  put_int(image, 2, width);
  put_int(image, 3, colorspace);
  put_bytes(image, 4, png);
  std::string v;
  put_bytes(v, 1, tag);
  put_bytes(v, 4, image);
  return event(wall_time, step, summary_field(v));
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_int(log, 1, 1);
  std::string what;
  put_bytes(what, 7, log);
  return event(wall_time, step, what);
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventWriter::EventWriter(const fs::path& dir, double flush_seconds) : flush_seconds_(flush_seconds) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create the TensorBoard folder '" + dir.string() + "': " + ec.message());
  const double now = wall_time_now();
  const int64_t second = std::max(static_cast<int64_t>(now), latest_event_second(dir) + 1);
  char digits[32];
  std::snprintf(digits, sizeof digits, "%010lld", static_cast<long long>(second));
  path_ = dir / ("events.out.tfevents." + std::string(digits) + "." + host_name() + "." +
                 std::to_string(static_cast<long long>(getpid())));
  file_ = std::fopen(path_.c_str(), "wbx");
  if (!file_)
    throw IoError("cannot create the TensorBoard event file '" + path_.string() + "': " + std::strerror(errno));
  last_flush_ = now;
  write(file_version_event(now));
  flush();
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::add_scalar(std::string_view tag, int64_t step, double value) {
  write(scalar_event(wall_time_now(), step, tag, static_cast<float>(value)));
}

void EventWriter::add_image(std::string_view tag, int64_t step, std::string_view png, int64_t height, int64_t width,
                            int64_t colorspace) {
  write(image_event(wall_time_now(), step, tag, height, width, colorspace, png));
}

void EventWriter::add_session_start(int64_t step) { write(session_start_event(wall_time_now(), step)); }

void EventWriter::write(const std::string& event) {
  if (!file_) throw IoError("the TensorBoard event file '" + path_.string() + "' is closed");
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    throw IoError("cannot write to the TensorBoard event file '" + path_.string() + "': " + std::strerror(errno));
  if (wall_time_now() - last_flush_ >= flush_seconds_) flush();
}

void EventWriter::flush() {
  if (!file_) return;
  if (std::fflush(file_) != 0)
    throw IoError("cannot write to the TensorBoard event file '" + path_.string() + "': " + std::strerror(errno));
  last_flush_ = wall_time_now();
}

void EventWriter::close() {
  if (!file_) return;
  std::FILE* f = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!flushed || !closed)
    throw IoError("cannot write to the TensorBoard event file '" + path_.string() + "': " + std::strerror(errno));
}

}  // namespace melforge::tensorboard
