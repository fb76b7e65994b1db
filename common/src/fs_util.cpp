#include "melforge/common/fs_util.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

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

namespace {

/// Text for a file type that is not a regular file.
std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// `<role> '<path>'` with the path made printable.
std::string named(const std::filesystem::path& path, std::string_view role) {
  return std::string(role) + " '" + utf8::for_terminal(path.string()) + "'";
}

/// An open descriptor on `path` that is a regular file; throws as read_regular_file documents.
int open_regular(const std::filesystem::path& path, std::string_view role, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == EISDIR) throw InvalidArgument(named(path, role) + " is a folder; give a regular file");
    throw IoError("cannot open " + named(path, role) + ": " + std::strerror(err));
  }
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError("cannot stat " + named(path, role) + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InvalidArgument(named(path, role) + " is " + kind_of(st.st_mode) +
                          ", not a regular file; melforge reads only regular files it is given");
  }
  return fd;
}

}  // namespace

std::string read_regular_file(const std::filesystem::path& path, std::string_view role, std::uintmax_t max_bytes) {
  struct stat st {};
  const int fd = open_regular(path, role, st);
  if (static_cast<std::uintmax_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw FormatError(named(path, role) + " holds " + std::to_string(st.st_size) + " bytes, more than the " +
                      std::to_string(max_bytes) + " bytes melforge reads from such a file");
  }
  std::string text;
  text.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (true) {
    if (got == text.size()) {
      if (text.size() >= max_bytes) break;
      text.resize(std::min<std::uintmax_t>(max_bytes, text.size() + 65536));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw IoError("cannot read " + named(path, role) + ": " + std::strerror(err));
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (got == text.size() && got >= max_bytes && static_cast<std::uintmax_t>(st.st_size) < got)
    throw FormatError(named(path, role) + " grew past the " + std::to_string(max_bytes) +
                      " bytes melforge reads from such a file while it was read");
  text.resize(got);
  return text;
}

void require_regular_file(const std::filesystem::path& path, std::string_view role) {
  struct stat st {};
  ::close(open_regular(path, role, st));
}

}  // namespace melforge
