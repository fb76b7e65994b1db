#pragma once
/// The run folder of `train` (RUN): finding it from --out or --resume, checking and clearing it, and the
/// metrics.jsonl lines it accumulates.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "melforge/common/folder_lock.h"

namespace melforge::trainer {

/// The lock file of a run folder (RUN/.melforge-train.lock; it holds the pid of the process training in it).
inline constexpr const char* kRunLockName = ".melforge-train.lock";

/// The lock of a run folder, and whether taking it created the folder.
struct RunFolderLock {
  /// The held lock (released, and its file removed, on destruction).
  std::unique_ptr<FolderLock> lock;
  /// True when the folder did not exist and was created to hold the lock.
  bool created = false;
};

/// Locks the run folder `dir` for one `train` (creating it and its parents when absent). Throws IoError naming the
/// folder and the pid of the other melforge-train when one holds it, or when it cannot be created.
RunFolderLock lock_run_dir(const std::filesystem::path& dir);

/// The checkpoint a --resume argument names: a file as given, or RUN/checkpoints/last.pt for a folder.
std::filesystem::path resume_checkpoint(const std::filesystem::path& resume);

/// The run folder of a checkpoint: RUN for RUN/checkpoints/X.pt, else the checkpoint's folder (absolute).
std::filesystem::path run_dir_of(const std::filesystem::path& checkpoint);

/// Checks a fresh run's folder: absent, empty (its lock file aside), or any folder when `overwrite` (its run files are removed later by
/// clear_run_files). Throws InvalidArgument naming --out otherwise.
void check_run_dir(const std::filesystem::path& dir, bool overwrite);

/// Removes the files and folders a run writes into `dir` (config.json, metrics.jsonl, checkpoints/, report.json,
/// the confusion CSVs, timings.json, trace.json, the TensorBoard files events.out.tfevents.*), and nothing else.
/// Throws IoError naming what it cannot remove.
void clear_run_files(const std::filesystem::path& dir);

/// Undoes a fresh run that failed before its first checkpoint, so that the same command can run again: removes its
/// run files (clear_run_files; only when `cleared`, i.e. once the run had taken over the folder), releases the lock
/// and removes the folder when the lock created it and it is empty. Never throws.
void discard_run_dir(const std::filesystem::path& dir, RunFolderLock& lock, bool cleared) noexcept;

/// Appends `line` and a newline to `path`. Throws IoError when it cannot.
void append_line(const std::filesystem::path& path, const std::string& line);

/// Keeps the lines of metrics.jsonl (epoch and step lines) whose epoch is at most `epochs` (a resumed run rewrites
/// the rest), through
/// an atomic rewrite; nothing when the file does not exist.
void truncate_metrics(const std::filesystem::path& path, int64_t epochs);

}  // namespace melforge::trainer
