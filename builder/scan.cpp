#include "scan.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include "build_options.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/fs_walk.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// `s` without leading and trailing spaces and tabs.
std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

/// The labels of manifest label field `field` (`dog;bark`), trimmed, in order. Throws FormatError (`where` first)
/// for an empty field, an empty label between separators, or a label given twice.
std::vector<std::string> split_labels(const std::string& field, const std::string& where) {
  std::vector<std::string> labels;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = field.find(kLabelSeparator, start);
    labels.push_back(trim(field.substr(start, end == std::string::npos ? std::string::npos : end - start)));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (labels.size() == 1 && labels[0].empty()) throw FormatError(where + "empty label");
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i].empty())
      throw FormatError(where + "empty label in '" + utf8::for_terminal(field) +
                        "' (labels are separated by ';', e.g. dog;bark)");
    for (std::size_t j = 0; j < i; ++j)
      if (labels[j] == labels[i])
        throw FormatError(where + "label '" + utf8::for_terminal(labels[i]) + "' is listed twice in '" +
                          utf8::for_terminal(field) + "'");
  }
  return labels;
}

/// One manifest row `f` (path,label[,split]; `where` is "manifest:line: " for messages) as an input file; relative
/// paths are resolved against `base`. The label and split are trimmed. Throws FormatError.
InputFile manifest_row(const std::vector<std::string>& f, const std::string& where, const fs::path& base) {
  if (f.size() < 2 || f.size() > 3)
    throw FormatError(where + "expected path,label[,split], got " + std::to_string(f.size()) + " fields");
  if (f[0].empty()) throw FormatError(where + "empty path");
  const std::vector<std::string> labels = split_labels(f[1], where);
  int split = -1;
  if (f.size() == 3 && !trim(f[2]).empty()) {
    split = split_index(lower(trim(f[2])));
    if (split < 0)
      throw FormatError(where + "unknown split '" + utf8::for_terminal(f[2]) + "' (use train, val or test)");
  }
  fs::path p(f[0]);
  if (p.is_relative()) p = base / p;
  InputFile row{p, f[0], labels[0], split, {}};
  if (labels.size() > 1) row.labels = labels;
  return row;
}

/// The UTF-8 byte order mark some editors write at the start of a text file.
constexpr std::string_view kUtf8Bom = "\xef\xbb\xbf";

/// The encoding `text` is in when it is UTF-16 or UTF-32 (by its byte order mark, or by NUL bytes in every other
/// position of its first characters), or "" when it is neither.
std::string wide_encoding(const std::string& text) {
  const auto starts = [&text](std::string_view prefix) { return text.rfind(prefix, 0) == 0; };
  if (starts(std::string_view("\xff\xfe\0\0", 4))) return "UTF-32 (little-endian byte order mark FF FE 00 00)";
  if (starts(std::string_view("\0\0\xfe\xff", 4))) return "UTF-32 (big-endian byte order mark 00 00 FE FF)";
  if (starts("\xff\xfe")) return "UTF-16 (little-endian byte order mark FF FE)";
  if (starts("\xfe\xff")) return "UTF-16 (big-endian byte order mark FE FF)";
  if (text.size() >= 4 && text[0] != '\0' && text[1] == '\0' && text[2] != '\0' && text[3] == '\0')
    return "UTF-16 little-endian (no byte order mark; a NUL byte after every character)";
  if (text.size() >= 4 && text[0] == '\0' && text[1] != '\0' && text[2] == '\0' && text[3] != '\0')
    return "UTF-16 big-endian (no byte order mark; a NUL byte before every character)";
  return {};
}

/// The text of manifest `manifest`, read with read_regular_file (a FIFO, a device or a folder is refused before
/// reading). Throws FormatError for a UTF-16 or UTF-32 file, naming the encoding.
std::string manifest_text(const fs::path& manifest) {
  std::string text = read_regular_file(manifest, "manifest");
  if (const std::string wide = wide_encoding(text); !wide.empty())
    throw FormatError("manifest '" + utf8::for_terminal(manifest.string()) + "' is " + wide +
                      "; save it as UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)");
  return text;
}

/// The column names a manifest header may give, lower case: [0] the path, [1] the label, [2] the split.
const std::array<std::set<std::string>, 3>& header_names() {
  static const std::array<std::set<std::string>, 3> names{
      std::set<std::string>{"path", "file", "filename", "file_name", "filepath", "file_path", "audio", "audio_path",
                            "wav", "fname"},
      std::set<std::string>{"label", "labels", "class", "class_name", "classname", "category", "target", "tag",
                            "tags"},
      std::set<std::string>{"split", "subset", "set", "partition"}};
  return names;
}

/// True for a word a header row names a column with: letters, digits, ' ', '_' and '-', starting with a letter
/// (no '.', no '/': never a file name with an extension).
bool header_word(const std::string& field) {
  const std::string w = trim(field);
  if (w.empty() || !std::isalpha(static_cast<unsigned char>(w[0]))) return false;
  return std::all_of(w.begin(), w.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == ' ' || c == '_' || c == '-';
  });
}

/// Whether the first row `f` of a manifest is a header: 2 or 3 fields, each a header_word, and its path field names
/// no existing file (resolved against `base`). A file that exists is always data.
bool is_header_row(const std::vector<std::string>& f, const fs::path& base) {
  if (f.size() < 2 || f.size() > 3 || !std::all_of(f.begin(), f.end(), header_word)) return false;
  fs::path p(trim(f[0]));
  if (p.is_relative()) p = base / p;
  std::error_code ec;
  return !fs::exists(p, ec);
}

/// The field index of the path, label and split columns a header row `f` names: by their names when every field is
/// a known column name (header_names, any letter case, any order; `filename,class`), else in the order
/// path,label,split.
std::array<int, 3> header_columns(const std::vector<std::string>& f) {
  std::array<int, 3> columns{-1, -1, -1};
  for (std::size_t i = 0; i < f.size(); ++i)
    for (std::size_t c = 0; c < 3; ++c)
      if (header_names()[c].contains(lower(trim(f[i]))) && columns[c] < 0) columns[c] = static_cast<int>(i);
  const int named = static_cast<int>(std::count_if(columns.begin(), columns.end(), [](int c) { return c >= 0; }));
  if (columns[0] < 0 || columns[1] < 0 || named != static_cast<int>(f.size())) return {0, 1, 2};
  return columns;
}

/// True for the header the manifest format documents: `path,label` or `path,label,split` (any letter case).
bool documented_header(const std::vector<std::string>& f) {
  static const std::array<std::string, 3> names{"path", "label", "split"};
  for (std::size_t i = 0; i < f.size(); ++i)
    if (lower(trim(f[i])) != names[i]) return false;
  return true;
}

/// Row `f` reordered to path,label[,split] by `columns` (header_columns); a row whose field count the header does
/// not account for is returned as is, for manifest_row to refuse.
std::vector<std::string> in_columns(const std::vector<std::string>& f, const std::array<int, 3>& columns) {
  if (columns == std::array<int, 3>{0, 1, 2}) return f;
  const int wanted = columns[2] >= 0 ? 3 : 2;
  if (static_cast<int>(f.size()) != wanted) return f;
  std::vector<std::string> out;
  for (int c = 0; c < wanted; ++c) out.push_back(f[static_cast<std::size_t>(columns[static_cast<std::size_t>(c)])]);
  return out;
}

/// Adds what `walk` found below `root` to `out`: regular files with an audio extension as `label` / `split`, the
/// rest as skipped with the reason.
void absorb(const fs::path& root, const WalkResult& walk, const std::string& label, int split,
            const std::set<std::string>& exts, ScanResult& out) {
  const auto rel = [&root](const fs::path& p) { return p.lexically_relative(root).generic_string(); };
  const auto audio_ext = [&exts](const fs::path& p) {
    const std::string ext = lower(p.extension().string());
    return !ext.empty() && exts.contains(ext.substr(1));
  };
  for (const auto& p : walk.files) {
    if (audio_ext(p)) out.files.push_back({p, rel(p), label, split, {}});
    else out.skipped.push_back({rel(p), "not an audio file extension", "scan"});
  }
  for (const auto& p : walk.folders)
    if (audio_ext(p))
      out.skipped.push_back({rel(p), "is a directory, not an audio file (its contents are still scanned)", "scan"});
  for (const auto& pr : walk.problems) out.skipped.push_back({rel(pr.path), pr.reason, "scan"});
  for (const auto& p : walk.hidden) out.hidden.push_back(rel(p));
  for (const auto& ex : walk.excluded) out.excluded.push_back({rel(ex.path), ex.reason, "scan"});
}

/// The identities of the folders in `paths` that exist, with the reason for leaving them out.
std::vector<std::pair<FolderId, std::string>> excluded_ids(const std::vector<fs::path>& paths) {
  std::vector<std::pair<FolderId, std::string>> out;
  for (const auto& p : paths) {
    std::error_code ec;
    if (const auto id = folder_id(p, ec))
      out.emplace_back(*id, "the build's output folder '" + p.string() + "' is inside the input folder: not scanned");
  }
  return out;
}

/// A class folder to walk.
struct ClassDir {
  fs::path path;
  std::string label;
  int split = -1;
};

/// The top-level folders of a pre-split layout (`splits`, each a train/val/test alias), checked: no other folder
/// beside them (`others`), no split given twice. Throws FormatError naming the folders.
void check_presplit(const fs::path& root, const std::vector<WalkEntry>& splits, const std::vector<WalkEntry>& others) {
  const auto names = [](const std::vector<WalkEntry>& v) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "'" : ", '") + e.path.filename().string() + "'";
    return s;
  };
  if (!others.empty())
    throw FormatError("input folder '" + root.string() + "' holds split folders (" + names(splits) +
                      ") and other folders (" + names(others) + "): in a pre-split layout every top-level folder "
                      "must be train, val (or valid, validation) or test, each holding class folders; move the "
                      "others away or into a split (hidden folders, starting with '.', are ignored)");
  for (std::size_t i = 0; i < splits.size(); ++i)
    for (std::size_t j = i + 1; j < splits.size(); ++j)
      if (split_index(splits[i].path.filename().string()) == split_index(splits[j].path.filename().string()))
        throw FormatError("input folder '" + root.string() + "' has two folders for one split: '" +
                          splits[i].path.filename().string() + "' and '" + splits[j].path.filename().string() + "'");
}

/// Sorts the `entries` of `dir` (the root, or a split folder of a pre-split layout) listed into `listed`: its
/// folders become classes of `split`, its files are skipped as `loose_reason`.
void add_classes(const fs::path& root, const std::vector<WalkEntry>& entries, const WalkResult& listed, int split,
                 const std::string& loose_reason, const std::set<std::string>& exts, std::vector<ClassDir>& classes,
                 ScanResult& out) {
  for (const auto& e : entries) {
    if (e.is_folder) classes.push_back({e.path, e.path.filename().string(), split});
    else out.skipped.push_back({e.path.lexically_relative(root).generic_string(), loose_reason, "scan"});
  }
  absorb(root, listed, "", split, exts, out);
}

/// The class folders of a pre-split layout: those of each split folder of `splits` (checked by check_presplit).
void add_presplit_classes(FolderWalk& walk, const fs::path& root, const std::vector<WalkEntry>& splits,
                          const std::set<std::string>& exts, std::vector<ClassDir>& classes, ScanResult& out) {
  for (const auto& s : splits) {
    if (const auto prev = walk.claim(s.path)) {
      out.skipped.push_back({s.path.filename().string(),
                             "split folder leads to the folder already scanned as '" + walk.display(*prev) +
                                 "' (not scanned twice)", "scan"});
      continue;
    }
    WalkResult listed;
    const std::vector<WalkEntry> entries = walk.list(s.path, listed);
    add_classes(root, entries, listed, split_index(s.path.filename().string()), "not inside a class folder", exts,
                classes, out);
  }
}

}  // namespace

int split_index(const std::string& name) {
  if (name == "validation" || name == "valid") return 1;
  for (std::size_t i = 0; i < kSplitNames.size(); ++i)
    if (kSplitNames[i] == name) return static_cast<int>(i);
  return -1;
}

ScanResult scan_folder(const fs::path& root, const std::vector<std::string>& extensions) {
  ScanOptions options;
  options.extensions = extensions;
  return scan_folder(root, options);
}

ScanResult scan_folder(const fs::path& input_root, const ScanOptions& options) {
  const std::set<std::string> exts(options.extensions.begin(), options.extensions.end());
  fs::path root = input_root.lexically_normal();
  if (!root.has_filename() && root.has_parent_path()) root = root.parent_path();
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw IoError("input folder '" + root.string() + "' does not exist");
  FolderWalk walk({options.include_hidden, excluded_ids(options.exclude), root, options.before_open});
  walk.claim(root);
  WalkResult top;
  const std::vector<WalkEntry> entries = walk.list(root, top);
  for (const auto& p : top.problems)
    if (p.path == root) throw IoError("cannot read input folder '" + root.string() + "': " + p.reason);
  ScanResult out;
  std::vector<WalkEntry> splits, others;
  for (const auto& e : entries)
    if (e.is_folder) (split_index(e.path.filename().string()) >= 0 ? splits : others).push_back(e);
  std::vector<ClassDir> classes;
  if (!splits.empty()) {
    check_presplit(root, splits, others);
    out.presplit = true;
    absorb(root, top, "", -1, exts, out);
    for (const auto& e : entries)
      if (!e.is_folder) out.skipped.push_back({e.path.filename().string(), "not inside a split/class folder", "scan"});
    add_presplit_classes(walk, root, splits, exts, classes, out);
  } else {
    add_classes(root, entries, top, -1, "not inside a class folder", exts, classes, out);
  }
  std::vector<ClassDir> claimed;
  for (const auto& c : classes) {
    if (const auto prev = walk.claim(c.path))
      out.skipped.push_back({c.path.lexically_relative(root).generic_string(),
                             "class folder leads to the folder already scanned as '" + walk.display(*prev) +
                                 "' (not scanned twice)", "scan"});
    else
      claimed.push_back(c);
  }
  for (const auto& c : claimed) {
    WalkResult r;
    walk.walk(c.path, r);
    absorb(root, r, c.label, c.split, exts, out);
  }
  std::sort(out.files.begin(), out.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.rel_path < b.rel_path; });
  std::sort(out.skipped.begin(), out.skipped.end(),
            [](const SkippedFile& a, const SkippedFile& b) { return a.path < b.path; });
  std::sort(out.hidden.begin(), out.hidden.end());
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
  const std::string text = manifest_text(manifest);
  const fs::path base = manifest.parent_path();
  const fs::path abs_base = fs::absolute(manifest).parent_path();
  ScanResult out;
  int64_t line_no = 0;
  bool first_row = true;
  std::array<int, 3> columns{0, 1, 2};
  std::map<fs::path, std::pair<int64_t, std::string>> seen;
  for (std::size_t start = text.rfind(kUtf8Bom, 0) == 0 ? kUtf8Bom.size() : 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = manifest.string() + ":" + std::to_string(line_no) + ": ";
    if (const std::size_t nul = line.find('\0'); nul != std::string::npos)
      throw FormatError(where + "NUL byte in the row (byte " + std::to_string(nul + 1) +
                        "); a manifest is UTF-8 text: path,label[,split] per line");
    std::vector<std::string> f;
    try {
      f = parse_csv_line(line);
    } catch (const FormatError& e) {
      throw FormatError(where + e.what());
    }
    if (std::exchange(first_row, false) && is_header_row(f, base)) {
      columns = header_columns(f);
      if (!documented_header(f))
        out.warnings.push_back("manifest " + manifest.string() + ":" + std::to_string(line_no) + ": '" +
                             utf8::for_terminal(line) + "' read as a header row (not a file)");
      continue;
    }
    const InputFile row = manifest_row(in_columns(f, columns), where, base);
    if (row.split >= 0) out.presplit = true;
    if (!row.labels.empty()) out.multilabel = true;
    const fs::path key = (fs::path(row.rel_path).is_relative() ? abs_base / row.rel_path : fs::path(row.rel_path))
                             .lexically_normal();
    const auto [it, inserted] = seen.emplace(key, std::make_pair(line_no, row.rel_path));
    if (!inserted)
      throw FormatError(where + "line " + std::to_string(line_no) + " ('" + utf8::for_terminal(row.rel_path) +
                        "') lists the same file as line " + std::to_string(it->second.first) + " ('" +
                        utf8::for_terminal(it->second.second) + "'): " + utf8::for_terminal(key.string()) +
                        "; list each file once, or it would land in several classes or splits");
    out.files.push_back(row);
  }
  std::sort(out.files.begin(), out.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.rel_path < b.rel_path; });
  return out;
}

}  // namespace melforge::builder
