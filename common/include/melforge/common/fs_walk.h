#pragma once
/// A recursive folder walk that loses nothing silently, shared by melforge-build's scan and melforge-train predict:
/// every folder it cannot read (permissions, too many open files, I/O errors, a folder removed meanwhile), every
/// broken link and special file, and every symbolic link that leads back to a folder already walked is listed with
/// its reason; hidden entries (a name starting with '.') are listed and not read unless asked for. Symbolic links to
/// folders are followed; a folder is walked once, whatever the number of paths leading to it, which also stops
/// link loops. Each folder is read completely and closed before its sub-folders are opened, so the walk holds one
/// folder handle at a time, whatever the depth.
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace melforge {

/// Identity of a folder on this system: (st_dev, st_ino) of the folder a path leads to, links followed.
using FolderId = std::pair<dev_t, ino_t>;

/// The identity of the folder `path` leads to (stat, links followed); std::nullopt with `ec` set when it cannot be
/// stat'ed, or with `ec` clear when it is not a folder.
std::optional<FolderId> folder_id(const std::filesystem::path& path, std::error_code& ec);

/// True when the last component of `path` starts with '.' (".DS_Store", "._x.wav", ".git"); "." and ".." are not.
bool is_hidden_name(const std::filesystem::path& path);

/// Settings of a FolderWalk.
struct WalkOptions {
  /// Walk entries whose name starts with '.' like any other; false lists them in WalkResult::hidden, unread.
  bool include_hidden = false;
  /// Folders left out of the walk, by identity (e.g. a build's output folder inside its input), each with the
  /// reason stated in WalkResult::excluded.
  std::vector<std::pair<FolderId, std::string>> excluded;
  /// Paths in messages are written relative to this folder when they lie below it (empty: as walked).
  std::filesystem::path display_root;
  /// Test seam: called with each folder's path just before the walk opens it; may be empty.
  std::function<void(const std::filesystem::path&)> before_open;
};

/// An entry found but not walked or not usable, and why ("cannot read folder: Permission denied").
struct WalkProblem {
  /// The entry's path as walked (through the links followed).
  std::filesystem::path path;
  /// Human-readable reason.
  std::string reason;
};

/// What a walk found. Paths are as walked: the starting folder joined with the names on the way (links are not
/// resolved), so they stay below the starting folder.
struct WalkResult {
  /// Regular files and links to regular files, in walk order (each folder's entries sorted by name, depth first).
  std::vector<std::filesystem::path> files;
  /// Folders walked below the starting folders (links to folders included), in walk order.
  std::vector<std::filesystem::path> folders;
  /// Entries that could not be read or used, with the reason.
  std::vector<WalkProblem> problems;
  /// Hidden entries left unread (a hidden folder is one entry; nothing inside it is read).
  std::vector<std::filesystem::path> hidden;
  /// Folders left out through WalkOptions::excluded, with its reason.
  std::vector<WalkProblem> excluded;
};

/// One entry of a folder listing (FolderWalk::list).
struct WalkEntry {
  /// The entry's path: the listed folder joined with its name.
  std::filesystem::path path;
  /// True for a folder or a link to one; false for a regular file or a link to one.
  bool is_folder = false;
  /// True when the entry itself is a symbolic link.
  bool is_link = false;
  /// The folder's identity (is_folder only).
  FolderId id{};
};

/// A folder walk with its memory of the folders already walked (shared by every walk() of the object).
class FolderWalk {
 public:
  /// A walk with `options`.
  explicit FolderWalk(WalkOptions options = {});

  /// Marks the folder `path` leads to as walked under `path`. Returns the path it was marked under before (not
  /// marked again), or std::nullopt when this call marked it. A path that cannot be stat'ed is not marked (nullopt;
  /// walk() or list() then report why).
  std::optional<std::filesystem::path> claim(const std::filesystem::path& path);

  /// Lists the folder `dir` (not recursively), sorted by name: its folders and regular files are returned; hidden
  /// and excluded entries, broken links, special files and entries that cannot be stat'ed go to `out` with their
  /// reason, as does `dir` itself when it cannot be opened or read to the end (the entries read before a failed
  /// read are still returned).
  std::vector<WalkEntry> list(const std::filesystem::path& dir, WalkResult& out);

  /// Walks `dir` recursively (claiming it): regular files to out.files, folders to out.folders, everything else
  /// to out as list() does; a folder already claimed is not walked again but listed in out.problems ("symbolic link
  /// loop: ... already scanned").
  void walk(const std::filesystem::path& dir, WalkResult& out);

  /// `path` as messages write it: relative to WalkOptions::display_root when below it.
  std::string display(const std::filesystem::path& path) const;

 private:
  WalkOptions options_;
  std::map<FolderId, std::filesystem::path> visited_;
};

}  // namespace melforge
