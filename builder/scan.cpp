#include "scan.h"

#include <algorithm>
#include <fstream>
#include <set>

#include "build_options.h"
#include "melforge/common/errors.h"

namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int split_index(const std::string& name) {
  for (std::size_t i = 0; i < kSplitNames.size(); ++i)
    if (kSplitNames[i] == name) return static_cast<int>(i);
  return -1;
}

/// Walks `class_dir` recursively, adding audio files as `label` and everything else to skipped.
void walk_class(const fs::path& root, const fs::path& class_dir, const std::string& label, int split,
                const std::set<std::string>& exts, ScanResult& out) {
  std::error_code ec;
  fs::recursive_directory_iterator it(class_dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    out.skipped.push_back({class_dir.lexically_relative(root).generic_string(), "cannot read folder: " + ec.message(),
                           "scan"});
    return;
  }
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) {
      out.skipped.push_back({it->path().generic_string(), "cannot read folder: " + ec.message(), "scan"});
      ec.clear();
      continue;
    }
    const fs::path& p = it->path();
    std::error_code lec;
    const std::string rel = p.lexically_relative(root).generic_string();
    const auto link_status = fs::symlink_status(p, lec);
    const bool is_link = fs::is_symlink(link_status);
    const auto target_status = fs::status(p, lec);
    if (fs::is_directory(link_status)) {
      const std::string dext = lower(p.extension().string());
      if (!dext.empty() && exts.contains(dext.substr(1)))
        out.skipped.push_back({rel, "is a directory, not an audio file (its contents are still scanned)", "scan"});
      continue;
    }
    if (is_link && lec) {
      out.skipped.push_back({rel, "broken symbolic link: " + lec.message(), "scan"});
      continue;
    }
    if (is_link && fs::is_directory(target_status)) {
      out.skipped.push_back({rel, "symbolic link to a folder (not followed)", "scan"});
      continue;
    }
    const std::string ext = lower(p.extension().string());
    if (ext.empty() || !exts.contains(ext.substr(1))) {
      out.skipped.push_back({rel, "not an audio file extension", "scan"});
      continue;
    }
    out.files.push_back({p, rel, label, split});
  }
}

void scan_classes(const fs::path& root, const fs::path& dir, int split, const std::set<std::string>& exts,
                  ScanResult& out) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    entries.push_back(it->path());
  if (ec) throw IoError("cannot read folder '" + dir.string() + "': " + ec.message());
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries) {
    std::error_code sec;
    const std::string rel = e.lexically_relative(root).generic_string();
    if (fs::is_directory(fs::symlink_status(e, sec))) {
      walk_class(root, e, e.filename().string(), split, exts, out);
    } else {
      out.skipped.push_back({rel, "not inside a class folder", "scan"});
    }
  }
}

}  // namespace

ScanResult scan_folder(const fs::path& input_root, const std::vector<std::string>& extensions) {
  const std::set<std::string> exts(extensions.begin(), extensions.end());
  fs::path root = input_root.lexically_normal();
  if (!root.has_filename() && root.has_parent_path()) root = root.parent_path();
  ScanResult out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw IoError("input folder '" + root.string() + "' does not exist");
  std::vector<fs::path> subdirs;
  bool any_file = false;
  for (fs::directory_iterator it(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (fs::is_directory(fs::symlink_status(it->path(), ec))) subdirs.push_back(it->path());
    else any_file = true;
  }
  if (ec) throw IoError("cannot read input folder '" + root.string() + "': " + ec.message());
  const bool presplit = !subdirs.empty() && std::all_of(subdirs.begin(), subdirs.end(), [](const fs::path& d) {
    return split_index(d.filename().string()) >= 0;
  });
  if (presplit) {
    out.presplit = true;
    std::sort(subdirs.begin(), subdirs.end());
    for (const auto& d : subdirs) scan_classes(root, d, split_index(d.filename().string()), exts, out);
    if (any_file) {
      for (fs::directory_iterator it(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
        if (!fs::is_directory(fs::symlink_status(it->path(), ec)))
          out.skipped.push_back({it->path().filename().string(), "not inside a split/class folder", "scan"});
    }
  } else {
    scan_classes(root, root, -1, exts, out);
  }
  std::sort(out.files.begin(), out.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.rel_path < b.rel_path; });
  std::sort(out.skipped.begin(), out.skipped.end(),
            [](const SkippedFile& a, const SkippedFile& b) { return a.path < b.path; });
  return out;
}

std::vector<std::string> parse_csv_line(const std::string& line) {
  std::vector<std::string> fields;
  std::string cur;
  bool quoted = false;
  bool was_quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < line.size() && line[i + 1] == '"') {
          cur += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        cur += c;
      }
    } else if (c == '"' && cur.empty() && !was_quoted) {
      quoted = true;
      was_quoted = true;
    } else if (c == ',') {
      fields.push_back(cur);
      cur.clear();
      was_quoted = false;
    } else {
      cur += c;
    }
  }
  if (quoted) throw FormatError("unterminated quote");
  fields.push_back(cur);
  return fields;
}

ScanResult scan_manifest(const fs::path& manifest) {
  std::ifstream in(manifest, std::ios::binary);
  if (!in) throw IoError("cannot open manifest '" + manifest.string() + "'");
  const fs::path base = manifest.parent_path();
  ScanResult out;
  std::string line;
  int64_t line_no = 0;
  std::set<std::string> seen;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.size() >= 3 && static_cast<unsigned char>(line[0]) == 0xEF) line.erase(0, 3);
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = manifest.string() + ":" + std::to_string(line_no) + ": ";
    std::vector<std::string> f;
    try {
      f = parse_csv_line(line);
    } catch (const FormatError& e) {
      throw FormatError(where + e.what());
    }
    if (line_no == 1 && !f.empty() && lower(f[0]) == "path") continue;
    if (f.size() < 2 || f.size() > 3)
      throw FormatError(where + "expected path,label[,split], got " + std::to_string(f.size()) + " fields");
    if (f[0].empty()) throw FormatError(where + "empty path");
    if (f[1].empty()) throw FormatError(where + "empty label");
    int split = -1;
    if (f.size() == 3 && !f[2].empty()) {
      split = split_index(lower(f[2]));
      if (split < 0) throw FormatError(where + "unknown split '" + f[2] + "' (use train, val or test)");
      out.presplit = true;
    }
    if (!seen.insert(f[0]).second) {
      out.skipped.push_back({f[0], "listed more than once in the manifest (line " + std::to_string(line_no) + ")",
                             "scan"});
      continue;
    }
    fs::path p(f[0]);
    if (p.is_relative()) p = base / p;
    out.files.push_back({p, f[0], f[1], split});
  }
  std::sort(out.files.begin(), out.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.rel_path < b.rel_path; });
  return out;
}

}  // namespace melforge::builder
