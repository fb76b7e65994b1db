#pragma once
/// An exclusive lock on a folder through flock(2) on a lock file inside it: a second process that wants the same
/// folder is refused at once, naming the holder's pid. The kernel drops the lock when its holder dies, so a lock file
/// left by a killed process never blocks.
#include <filesystem>
#include <string>

namespace melforge {

/// Holds the lock on `folder` while it lives; the lock file holds the holder's pid. Removes the lock file on
/// destruction.
class FolderLock {
 public:
  /// Locks `folder` through `folder / file_name` (the folder must exist). `program` names who holds such locks in
  /// the message (e.g. "melforge-train"), `what` the folder (e.g. "run folder"). Throws IoError when another process
  /// holds the lock ("<what> '<folder>' is in use by another <program> (pid N)") or when the lock file cannot be
  /// made.
  FolderLock(const std::filesystem::path& folder, const std::string& file_name, const std::string& program,
             const std::string& what);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  /// The lock file.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace melforge
