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
#include "melforge/common/fs_util.h"

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
  if (!committed_ && !keep_staging_) fs::remove_all(staging(), ec);
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

namespace {

/// Name of the folder inside the staging folder that holds hard links to the outputs a build replaces.
constexpr const char* kPreviousName = ".previous";

/// Flushes `path` (a file or a folder) to disk with fsync(2). Throws IoError.
void sync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open '" + path.string() + "' to sync it: " + std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok && err != EINVAL) throw IoError("cannot sync '" + path.string() + "' to disk: " + std::strerror(err));
}

}  // namespace

void OutputFolder::install(const std::vector<fs::path>& staged, const nlohmann::json& report) {
  write_json_atomically(staging() / kReportName, report);
  std::vector<std::string> names;
  for (const auto& p : staged) names.push_back(p.lexically_relative(staging()).generic_string());
  names.push_back(kReportName);
  for (const auto& name : names) sync_path(staging() / name);
  for (const auto& name : names)
    if (const fs::path parent = fs::path(name).parent_path(); !parent.empty()) sync_path(staging() / parent);
  sync_path(staging());
  const std::vector<std::string> unkept = keep_previous(names);
  std::vector<std::string> moved;
  std::error_code ec;
  fs::remove(folder_ / kReportName, ec);
  for (std::size_t i = 0; !ec && i < names.size(); ++i) {
    if (const fs::path parent = fs::path(names[i]).parent_path(); !parent.empty())
      fs::create_directories(folder_ / parent, ec);
    if (!ec) fs::rename(staging() / names[i], folder_ / names[i], ec);
    if (!ec) moved.push_back(names[i]);
  }
  if (ec) {
    const std::string failed = moved.size() < names.size() ? names[moved.size()] : kReportName;
    const std::string left = restore(moved, unkept);
    throw IoError("cannot install '" + (folder_ / failed).string() + "': " + ec.message() +
                  (left.empty() ? "; the previous outputs were put back" : "; " + left));
  }
  committed_ = true;
  sync_path(folder_);
  fs::remove_all(staging(), ec);
  remove_stale_sources(names);
  remove_stale_trials(names);
}

void OutputFolder::remove_stale_sources(const std::vector<std::string>& installed) const {
  const fs::path sources = folder_ / kSourcesName;
  std::error_code ec;
  if (!fs::is_directory(sources, ec)) return;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(sources, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = std::string(kSourcesName) + "/" + it->path().filename().string();
    if (std::find(installed.begin(), installed.end(), name) == installed.end()) stale.push_back(it->path());
  }
  for (const auto& p : stale) fs::remove(p, ec);
  fs::remove(sources, ec);
}

void OutputFolder::remove_stale_trials(const std::vector<std::string>& installed) const {
  if (std::find(installed.begin(), installed.end(), kTrialsName) != installed.end()) return;
  std::error_code ec;
  fs::remove(folder_ / kTrialsName, ec);
}

std::vector<std::string> OutputFolder::keep_previous(const std::vector<std::string>& names) const {
  const fs::path previous = staging() / kPreviousName;
  std::error_code ec;
  fs::create_directory(previous, ec);
  if (ec) throw IoError("cannot create '" + previous.string() + "': " + ec.message());
  std::vector<std::string> unkept;
  for (const auto& name : names) {
    if (const fs::path parent = fs::path(name).parent_path(); !parent.empty()) {
      fs::create_directories(previous / parent, ec);
      if (ec) throw IoError("cannot create '" + (previous / parent).string() + "': " + ec.message());
    }
    if (::link((folder_ / name).c_str(), (previous / name).c_str()) == 0 || errno == ENOENT) continue;
    if (errno != EPERM && errno != EXDEV && errno != EMLINK && errno != ENOTSUP)
      throw IoError("cannot keep the previous '" + (folder_ / name).string() + "' until the new one is installed: " +
                    std::strerror(errno));
    unkept.push_back(name);
  }
  return unkept;
}

std::string OutputFolder::restore(const std::vector<std::string>& moved, const std::vector<std::string>& unkept) {
  const fs::path previous = staging() / kPreviousName;
  std::string left;
  std::vector<std::string> names = moved;
  if (std::find(names.begin(), names.end(), kReportName) == names.end()) names.push_back(kReportName);
  for (const auto& name : names) {
    std::error_code ec;
    if (fs::exists(previous / name, ec)) {
      fs::rename(previous / name, folder_ / name, ec);
    } else if (std::find(unkept.begin(), unkept.end(), name) != unkept.end()) {
      ec = std::make_error_code(std::errc::operation_not_permitted);
    } else if (name != kReportName) {
      fs::remove(folder_ / name, ec);
    }
    if (ec) left += (left.empty() ? "" : ", ") + name + " (" + ec.message() + ")";
  }
  if (left.empty()) return "";
  keep_staging_ = true;
  return "could not put back the previous " + left + "; what was kept of the previous files is in '" +
         previous.string() + "': move it into '" + folder_.string() + "' before the next build, which empties '" +
         staging().string() + "'";
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
