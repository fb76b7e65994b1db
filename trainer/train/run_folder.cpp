#include "train/run_folder.h"

#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

namespace {

/// Files and folders a run writes into its folder; --overwrite removes these and nothing else.
const std::vector<std::string> kRunFiles = {"config.json",        "metrics.jsonl",     "checkpoints",
                                            "report.json",        "confusion_val.csv", "confusion_test.csv",
                                            "confusion_val_files.csv", "confusion_test_files.csv",
                                            "timings.json",       "trace.json"};

/// The TensorBoard event files of `dir` (events.out.tfevents.*; a run writes one per start, into its folder).
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(entry.path());
  return out;
}

}  // namespace

RunFolderLock lock_run_dir(const fs::path& dir) {
  RunFolderLock r;
  std::error_code ec;
  r.created = fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create the run folder '" + dir.string() + "': " + ec.message());
  try {
    r.lock = std::make_unique<FolderLock>(dir, kRunLockName, "melforge-train", "run folder");
  } catch (...) {
    if (r.created) fs::remove(dir, ec);
    throw;
  }
  return r;
}

void discard_run_dir(const fs::path& dir, RunFolderLock& lock, bool cleared) noexcept {
  if (!lock.lock) return;
  std::error_code ec;
  if (cleared)
    for (const auto& name : kRunFiles) fs::remove_all(dir / name, ec);
  if (cleared)
    for (const auto& f : event_files(dir)) fs::remove(f, ec);
  lock.lock.reset();
  if (lock.created) fs::remove(dir, ec);
}

fs::path resume_checkpoint(const fs::path& resume) {
  if (fs::is_directory(resume)) return resume / "checkpoints" / "last.pt";
  return resume;
}

fs::path run_dir_of(const fs::path& checkpoint) {
  const fs::path parent = fs::absolute(checkpoint).parent_path();
  return parent.filename() == "checkpoints" ? parent.parent_path() : parent;
}

void check_run_dir(const fs::path& dir, bool overwrite) {
  if (!fs::exists(dir)) return;
  if (!fs::is_directory(dir)) throw InvalidArgument("--out: '" + dir.string() + "' exists and is not a folder");
  if (overwrite) return;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename() != kRunLockName) throw InvalidArgument("--out: '" + dir.string() +
                          "' is not empty; pass --overwrite to replace the run in it, or --resume to continue it");
}

void clear_run_files(const fs::path& dir) {
  for (const auto& name : kRunFiles) {
    std::error_code ec;
    fs::remove_all(dir / name, ec);
    if (ec) throw IoError("cannot remove '" + (dir / name).string() + "': " + ec.message());
  }
  for (const auto& f : event_files(dir)) {
    std::error_code ec;
    fs::remove(f, ec);
    if (ec) throw IoError("cannot remove '" + f.string() + "': " + ec.message());
  }
}

void append_line(const fs::path& path, const std::string& line) {
  std::ofstream f(path, std::ios::app);
  f << line << "\n";
  f.flush();
  if (!f) throw IoError("cannot append to " + path.string());
}

void truncate_metrics(const fs::path& path, int64_t epochs) {
  if (!fs::exists(path)) return;
  std::istringstream in(read_regular_file(path, "the run's metrics file"));
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("epoch") && j["epoch"].is_number_integer() &&
        j["epoch"].get<int64_t>() <= epochs)
      kept += line + "\n";
  }
  write_file_atomically(path, kept);
}

}  // namespace melforge::trainer
