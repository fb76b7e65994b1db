#include "melforge/common/fs_walk.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

namespace fs = std::filesystem;

namespace melforge {

namespace {

std::string error_text(int err) { return std::error_code(err, std::generic_category()).message(); }

/// What a non-folder, non-regular file is, for the reason of its skip.
std::string special_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

/// Reads the names in `dir` (without "." and ".."). Records in `out` why the folder could not be opened or read to
/// the end; the names read before a failed read are kept. Returns false when the folder could not be opened.
bool read_names(const fs::path& dir, std::vector<std::string>& names, WalkResult& out) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    out.problems.push_back({dir, "cannot read folder: " + error_text(errno)});
    return false;
  }
  int err = 0;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      err = errno;
      break;
    }
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  if (err != 0)
    out.problems.push_back({dir, "cannot read folder to the end (" + std::to_string(names.size()) +
                                     " entries read and kept): " + error_text(err)});
  return true;
}

}  // namespace

std::optional<FolderId> folder_id(const fs::path& path, std::error_code& ec) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    ec.assign(errno, std::generic_category());
    return std::nullopt;
  }
  ec.clear();
  if (!S_ISDIR(st.st_mode)) return std::nullopt;
  return FolderId{st.st_dev, st.st_ino};
}

bool is_hidden_name(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.' && name != "." && name != "..";
}

FolderWalk::FolderWalk(WalkOptions options) : options_(std::move(options)) {}

std::optional<fs::path> FolderWalk::claim(const fs::path& path) {
  std::error_code ec;
  const std::optional<FolderId> id = folder_id(path, ec);
  if (!id) return std::nullopt;
  const auto [it, inserted] = visited_.emplace(*id, path);
  if (inserted) return std::nullopt;
  return it->second;
}

std::string FolderWalk::display(const fs::path& path) const {
  if (!options_.display_root.empty()) {
    const fs::path rel = path.lexically_relative(options_.display_root);
    if (!rel.empty() && *rel.begin() != "..") return rel.generic_string();
  }
  return path.string();
}

std::vector<WalkEntry> FolderWalk::list(const fs::path& dir, WalkResult& out) {
  if (options_.before_open) options_.before_open(dir);
  std::vector<std::string> names;
  if (!read_names(dir, names, out)) return {};
  std::sort(names.begin(), names.end());
  std::vector<WalkEntry> entries;
  for (const std::string& name : names) {
    const fs::path p = dir / name;
    if (!options_.include_hidden && is_hidden_name(p)) {
      out.hidden.push_back(p);
      continue;
    }
    struct stat ls {};
    struct stat st {};
    if (::lstat(p.c_str(), &ls) != 0) {
      out.problems.push_back({p, "cannot read: " + error_text(errno)});
      continue;
    }
    const bool link = S_ISLNK(ls.st_mode);
    if (::stat(p.c_str(), &st) != 0) {
      out.problems.push_back({p, (link ? "broken symbolic link: " : "cannot read: ") + error_text(errno)});
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      const FolderId id{st.st_dev, st.st_ino};
      const auto ex = std::find_if(options_.excluded.begin(), options_.excluded.end(),
                                   [&id](const auto& e) { return e.first == id; });
      if (ex != options_.excluded.end()) {
        out.excluded.push_back({p, ex->second});
        continue;
      }
      entries.push_back({p, true, link, id});
    } else if (S_ISREG(st.st_mode)) {
      entries.push_back({p, false, link, {}});
    } else {
      out.problems.push_back({p, special_kind(st.st_mode) + ", not a regular file"});
    }
  }
  return entries;
}

void FolderWalk::walk(const fs::path& dir, WalkResult& out) {
  if (const std::optional<fs::path> prev = claim(dir); prev && *prev != dir) {
    out.problems.push_back({dir, "folder already scanned as '" + display(*prev) + "' (not scanned twice)"});
    return;
  }
  std::vector<fs::path> stack{dir};
  while (!stack.empty()) {
    const fs::path d = std::move(stack.back());
    stack.pop_back();
    std::vector<fs::path> sub;
    for (WalkEntry& e : list(d, out)) {
      if (!e.is_folder) {
        out.files.push_back(std::move(e.path));
        continue;
      }
      const auto [it, inserted] = visited_.emplace(e.id, e.path);
      if (!inserted) {
        out.problems.push_back({e.path, std::string(e.is_link ? "symbolic link loop: leads" : "folder reached") +
                                            " to the folder already scanned as '" + display(it->second) +
                                            "' (not scanned twice)"});
        continue;
      }
      out.folders.push_back(e.path);
      sub.push_back(std::move(e.path));
    }
    stack.insert(stack.end(), std::make_move_iterator(sub.rbegin()), std::make_move_iterator(sub.rend()));
  }
}

}  // namespace melforge
