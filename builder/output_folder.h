#pragma once
/// The output folder of melforge-build and melforge-build merge: locked while in use, outputs staged in
/// OUT/.partial/ and moved in only when all are complete.
#include <filesystem>
#include <string>
#include <vector>

namespace melforge::builder {

/// Name of the report every finished build or merge writes last into its output folder.
inline constexpr const char* kReportName = "build_report.json";

/// Checks an output folder before any work: `flag` names the option in messages. The folder may be absent, or empty
/// apart from the lock file and staging folder a killed run leaves behind, or anything with `overwrite`. Throws
/// InvalidArgument when the path is empty, is not a folder, or is a non-empty folder without `overwrite`.
void check_output_folder(const std::filesystem::path& folder, bool overwrite, const std::string& flag);

/// The output folder of a running build or merge: created if needed, locked with an exclusive flock on
/// OUT/.melforge-build.lock for the life of the object (released by the kernel when the process dies, so a killed run
/// never blocks the next one; a second run into the same folder is refused with IoError naming the holder's pid).
/// Unless install() succeeds, the destructor removes the staging folder (while still holding the lock) and then an
/// output folder this object created, if it is left empty.
class OutputFolder {
 public:
  /// Creates and locks `folder`. Throws IoError when it cannot be created or is locked by another run.
  explicit OutputFolder(const std::filesystem::path& folder);
  ~OutputFolder();
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  /// OUT/.partial: where the outputs are written before they are moved into OUT.
  std::filesystem::path staging() const;
  /// Empties and creates the staging folder; returns it. Throws IoError.
  std::filesystem::path fresh_staging() const;
  /// Moves the complete files `staged` (in the staging folder) into OUT: removes OUT/build_report.json first, then
  /// the old files of the same names, renames each (atomically replacing), removes the staging folder. The folder
  /// is then kept. Returns the path of the report, which the caller writes last (write_json_atomically). Throws
  /// IoError.
  std::filesystem::path install(const std::vector<std::filesystem::path>& staged);

 private:
  /// Takes the exclusive flock on the lock file, retrying when the file was replaced meanwhile. Throws IoError
  /// naming the holder's pid when another run holds it.
  void lock();
  /// Writes our pid into the lock file for the message of a refused second run. Failures (a full disk) are ignored:
  /// the pid is informational and the flock alone is the lock.
  void write_pid() const;

  std::filesystem::path folder_;
  std::filesystem::path lock_path_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

}  // namespace melforge::builder
