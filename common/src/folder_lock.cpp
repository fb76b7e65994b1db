#include "melforge/common/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "melforge/common/errors.h"

namespace melforge {

namespace {

/// The pid text a lock file holds (its first line), empty when unreadable.
std::string holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, static_cast<std::size_t>(n > 0 ? n : 0));
  const auto end = text.find_first_of("\n\0", 0, 2);
  return end == std::string::npos ? text : text.substr(0, end);
}

/// Whether `fd` is still the file named `path` (a holder that just finished may have unlinked it).
bool still_named(int fd, const std::filesystem::path& path) {
  struct stat held {};
  struct stat named {};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
         held.st_dev == named.st_dev;
}

}  // namespace

FolderLock::FolderLock(const std::filesystem::path& folder, const std::string& file_name, const std::string& program,
                       const std::string& what)
    : path_(folder / file_name) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError("cannot create the lock file '" + path_.string() + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string pid = holder_pid(fd_);
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK) throw IoError("cannot lock '" + path_.string() + "': " + std::strerror(err));
      throw IoError(what + " '" + folder.string() + "' is in use by another " + program +
                    (pid.empty() ? "" : " (pid " + pid + ")") + " holding " + path_.string() +
                    "; wait for it to finish, or stop it, and run again");
    }
    if (still_named(fd_, path_)) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      [[maybe_unused]] const bool written =
          ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  throw IoError("cannot lock '" + path_.string() + "': it keeps being replaced");
}

FolderLock::~FolderLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace melforge
