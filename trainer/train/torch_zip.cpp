#include "train/torch_zip.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace melforge::trainer {

namespace {

/// Read access to the bytes of a zip archive; every read past the end throws FormatError naming the file.
class ZipBytes {
 public:
  ZipBytes(const std::string& bytes, const std::filesystem::path& path) : b_(bytes), path_(path) {}
  [[noreturn]] void corrupt(const std::string& why) const {
    throw FormatError("checkpoint '" + utf8::for_terminal(path_.string()) +
                      "' is not a readable torch archive (truncated or corrupt?): " + why);
  }
  /// Throws unless bytes [pos, pos + n) exist.
  void need(uint64_t pos, uint64_t n) const {
    if (pos > b_.size() || n > b_.size() - pos) corrupt("its zip directory points past the end of the file");
  }
  /// The little-endian unsigned integer of `n` bytes at `pos`.
  uint64_t u(uint64_t pos, int n) const {
    need(pos, static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b_[pos + static_cast<uint64_t>(i)]);
    return v;
  }
  const char* at(uint64_t pos) const { return b_.data() + pos; }
  uint64_t size() const { return b_.size(); }

 private:
  const std::string& b_;
  const std::filesystem::path& path_;
};

/// One entry of a zip's central directory.
struct ZipEntry {
  std::string name;
  uint64_t method = 0, crc = 0, size = 0, local_offset = 0;
};

/// Where the central directory of the zip starts and how many entries it has (zip64 included).
std::pair<uint64_t, uint64_t> zip_directory(const ZipBytes& z) {
  if (z.size() < 22) z.corrupt("too short for a zip archive");
  uint64_t end = z.size() - 22;
  const uint64_t lowest = end > 65535 ? end - 65535 : 0;
  while (z.u(end, 4) != 0x06054b50u) {
    if (end == lowest) z.corrupt("no end of the zip directory");
    --end;
  }
  uint64_t entries = z.u(end + 10, 2), offset = z.u(end + 16, 4);
  if ((entries == 0xFFFF || offset == 0xFFFFFFFFu) && end >= 20 && z.u(end - 20, 4) == 0x07064b50u) {
    const uint64_t zip64 = z.u(end - 12, 8);
    entries = z.u(zip64 + 32, 8);
    offset = z.u(zip64 + 48, 8);
  }
  return {offset, entries};
}

/// The entries of the zip's central directory.
std::vector<ZipEntry> zip_entries(const ZipBytes& z) {
  auto [pos, count] = zip_directory(z);
  std::vector<ZipEntry> out;
  for (uint64_t i = 0; i < count; ++i) {
    if (z.u(pos, 4) != 0x02014b50u) z.corrupt("a broken zip directory entry");
    ZipEntry e;
    e.method = z.u(pos + 10, 2);
    e.crc = z.u(pos + 16, 4);
    uint64_t compressed = z.u(pos + 20, 4);
    e.size = z.u(pos + 24, 4);
    e.local_offset = z.u(pos + 42, 4);
    const uint64_t name_len = z.u(pos + 28, 2), extra_len = z.u(pos + 30, 2), comment_len = z.u(pos + 32, 2);
    z.need(pos + 46, name_len + extra_len);
    e.name.assign(z.at(pos + 46), name_len);
    for (uint64_t x = pos + 46 + name_len; x + 4 <= pos + 46 + name_len + extra_len; x += 4 + z.u(x + 2, 2)) {
      if (z.u(x, 2) != 0x0001) continue;
      uint64_t field = x + 4;
      for (uint64_t* v : {&e.size, &compressed, &e.local_offset}) {
        if (*v != 0xFFFFFFFFu) continue;
        *v = z.u(field, 8);
        field += 8;
      }
    }
    out.push_back(e);
    pos += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

}  // namespace

void verify_zip_crcs(const std::string& bytes, const std::filesystem::path& path) {
  const ZipBytes z(bytes, path);
  for (const ZipEntry& e : zip_entries(z)) {
    const std::string where =
        "checkpoint '" + utf8::for_terminal(path.string()) + "': entry '" + utf8::for_terminal(e.name, 80) + "'";
    if (e.method != 0)
      throw FormatError(where + " is compressed (method " + std::to_string(e.method) +
                        "); melforge checkpoints store their entries uncompressed");
    if (z.u(e.local_offset, 4) != 0x04034b50u)
      z.corrupt("entry '" + utf8::for_terminal(e.name, 80) + "' has no local header");
    const uint64_t data = e.local_offset + 30 + z.u(e.local_offset + 26, 2) + z.u(e.local_offset + 28, 2);
    z.need(data, e.size);
    uLong actual = crc32(0L, nullptr, 0);
    for (uint64_t done = 0; done < e.size;) {
      const auto n = static_cast<uInt>(std::min<uint64_t>(e.size - done, uint64_t{1} << 30));
      actual = crc32(actual, reinterpret_cast<const Bytef*>(z.at(data + done)), n);
      done += n;
    }
    if (actual != e.crc) {
      char text[80];
      std::snprintf(text, sizeof text, " fails its CRC-32 check (stored %08llx, computed %08lx)",
                    static_cast<unsigned long long>(e.crc), static_cast<unsigned long>(actual));
      throw FormatError(where + text + ": the file is corrupt");
    }
  }
}

}  // namespace melforge::trainer
