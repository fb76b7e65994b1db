#pragma once
/// The output folder of melforge-build and melforge-build merge: locked while in use, outputs staged in
/// OUT/.partial/ and moved in only when all are complete.
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace melforge::builder {

/// Name of the report every finished build or merge writes last into its output folder.
inline constexpr const char* kReportName = "build_report.json";
/// Name of the trial list a build of a layout with one (VoxCeleb1's veri_test2.txt) installs in its output folder.
inline constexpr const char* kTrialsName = "trials.txt";
/// Folder of OUT where melforge-build merge (without --copy) keeps the shard files its virtual datasets read.
inline constexpr const char* kSourcesName = "sources";

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
  /// Installs a complete build or merge: writes `report` into the staging folder as build_report.json, syncs it
  /// and the complete files `staged` (in the staging folder, or in a sub-folder of it such as sources/, moved to the
  /// same place in OUT) to disk, then moves them into OUT with rename(2), which
  /// replaces an old file of the same name atomically: first removes OUT/build_report.json, then renames each of
  /// `staged`, then the report last, so that OUT holds a report only when every output beside it is new and
  /// complete. The old files are kept as hard links in OUT/.partial/.previous until the report is in place; when a
  /// step fails, the files already moved are replaced by the old ones again (or removed where there was none) and
  /// the old report is put back, so OUT is as before. Throws IoError naming the file and the cause (and, when the
  /// old files could not all be put back, where they are). Once installed, files of OUT/sources/ that were not
  /// installed now (left by an earlier merge into OUT) are removed, and the folder when it is left empty; so is an
  /// OUT/trials.txt this build did not write (an earlier layout build's).
  void install(const std::vector<std::filesystem::path>& staged, const nlohmann::json& report);

 private:
  /// Takes the exclusive flock on the lock file, retrying when the file was replaced meanwhile. Throws IoError
  /// naming the holder's pid when another run holds it.
  void lock();
  /// Writes our pid into the lock file for the message of a refused second run. Failures (a full disk) are ignored:
  /// the pid is informational and the flock alone is the lock.
  void write_pid() const;
  /// Hard-links each existing OUT/<name> of `names` into OUT/.partial/.previous. Returns the names that exist but
  /// could not be linked (a file system without hard links): restore() cannot put those back. Throws IoError.
  std::vector<std::string> keep_previous(const std::vector<std::string>& names) const;
  /// Undoes a failed install(): each of `moved` (names already renamed into OUT) is replaced by its old file from
  /// .previous, or removed where there was none, and the old report is put back; `unkept` are the names
  /// keep_previous() could not link. Returns "" or what could not be put back and where the rest is.
  std::string restore(const std::vector<std::string>& moved, const std::vector<std::string>& unkept);
  /// Removes the files of OUT/sources/ not among `installed` (names relative to OUT), then the folder if empty.
  void remove_stale_sources(const std::vector<std::string>& installed) const;
  /// Removes OUT/trials.txt when `installed` does not name it: an earlier layout build's trial list, which would
  /// otherwise outlive the dataset it was checked against.
  void remove_stale_trials(const std::vector<std::string>& installed) const;

  std::filesystem::path folder_;
  std::filesystem::path lock_path_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
  /// Set when restore() failed: the staging folder holds the only copy of old outputs and is kept.
  bool keep_staging_ = false;
};

}  // namespace melforge::builder
