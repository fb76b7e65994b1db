#pragma once
/// Helpers shared by the libFuzzer targets of tests/fuzz: an in-memory file with a path, and a check that aborts.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace melforge::fuzz {

/// Aborts with `message` when `ok` is false. libFuzzer reports the abort as a crash and saves the input.
inline void require(bool ok, const std::string& message) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n", message.c_str());
  std::abort();
}

/// A memfd holding the given bytes, reachable through the path /proc/self/fd/N: code that takes a path reads it
/// like a regular file, and nothing touches the disk. The descriptor is reused across inputs.
class MemFile {
 public:
  MemFile() {
    fd_ = ::memfd_create("melforge-fuzz", MFD_CLOEXEC);
    require(fd_ >= 0, "memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  /// Replaces the contents with `size` bytes at `data`.
  void assign(const uint8_t* data, size_t size) {
    require(::ftruncate(fd_, 0) == 0, "ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      require(n > 0, "pwrite failed");
      done += static_cast<size_t>(n);
    }
  }
  /// The path that opens the contents.
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace melforge::fuzz
