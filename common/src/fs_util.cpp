#include "melforge/common/fs_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace melforge {

void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw IoError("cannot create '" + tmp.string() + "': " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw IoError("cannot write '" + tmp.string() + "': " + std::strerror(ok ? errno : err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw IoError("cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + ec.message());
  }
}

void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j) {
  write_file_atomically(path, utf8::dump(j, 2) + "\n");
}

}  // namespace melforge
