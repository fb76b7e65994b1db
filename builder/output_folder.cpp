#include "output_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "build_options.h"
#include "melforge/common/errors.h"

namespace fs = std::filesystem;

namespace melforge::builder {

void check_output_folder(const fs::path& folder, bool overwrite, const std::string& flag) {
  if (folder.empty()) throw InvalidArgument(flag + " DIR is required");
  std::error_code ec;
  if (!fs::exists(folder, ec)) return;
  if (!fs::is_directory(folder, ec)) throw InvalidArgument(flag + ": '" + folder.string() + "' is not a folder");
  if (overwrite) return;
  for (fs::directory_iterator it(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name != kLockFileName && name != kStagingName)
      throw InvalidArgument(flag + ": '" + folder.string() + "' exists and is not empty (use --overwrite)");
  }
}

OutputFolder::OutputFolder(const fs::path& folder) : folder_(folder), lock_path_(folder / kLockFileName) {
  std::error_code ec;
  created_ = fs::create_directories(folder_, ec);
  if (ec) throw IoError("cannot create output folder '" + folder_.string() + "': " + ec.message());
  try {
    lock();
  } catch (...) {
    if (created_) fs::remove(folder_, ec);
    throw;
  }
}

OutputFolder::~OutputFolder() {
  std::error_code ec;
  if (!committed_) fs::remove_all(staging(), ec);
  ::unlink(lock_path_.c_str());
  ::close(fd_);
  if (created_ && !committed_) fs::remove(folder_, ec);
}

fs::path OutputFolder::staging() const { return folder_ / kStagingName; }

fs::path OutputFolder::fresh_staging() const {
  std::error_code ec;
  const fs::path dir = staging();
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create '" + dir.string() + "': " + ec.message());
  return dir;
}

fs::path OutputFolder::install(const std::vector<fs::path>& staged) {
  std::error_code ec;
  const fs::path report_path = folder_ / kReportName;
  fs::remove(report_path, ec);
  if (ec) throw IoError("cannot remove the old '" + report_path.string() + "': " + ec.message());
  for (const auto& p : staged) {
    fs::remove(folder_ / p.filename(), ec);
    if (ec) throw IoError("cannot remove the old '" + (folder_ / p.filename()).string() + "': " + ec.message());
  }
  for (const auto& p : staged) {
    fs::rename(p, folder_ / p.filename(), ec);
    if (ec) throw IoError("cannot move '" + p.string() + "' into '" + folder_.string() + "': " + ec.message());
  }
  committed_ = true;
  fs::remove_all(staging(), ec);
  return report_path;
}

void OutputFolder::lock() {
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError("cannot create lock file '" + lock_path_.string() + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char pid[32] = {};
      const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
      std::string holder(pid, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK) {
        throw IoError("output folder '" + folder_.string() + "' is in use by another melforge-build" +
                      (holder.empty() ? "" : " (pid " + holder + ")") + " holding " + lock_path_.string() +
                      "; wait for it to finish, or stop it, and run again");
      }
      throw IoError("cannot lock '" + lock_path_.string() + "': " + std::strerror(err));
    }
    struct stat held {};
    struct stat named {};
    if (::fstat(fd_, &held) == 0 && ::stat(lock_path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev)
      break;
    ::close(fd_);
    fd_ = -1;
    if (attempt == 100) throw IoError("cannot lock '" + lock_path_.string() + "': it keeps being replaced");
  }
  write_pid();
}

void OutputFolder::write_pid() const {
  const std::string pid = std::to_string(::getpid()) + "\n";
  [[maybe_unused]] const bool written =
      ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size());
}

}  // namespace melforge::builder
