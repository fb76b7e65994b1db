#include "scan.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <regex>
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

/// The labels of manifest label field `field` (`dog;bark`, separated by `sep`), trimmed, in order. Throws
/// FormatError (`where` first) for an empty field, an empty label between separators, or a label given twice.
std::vector<std::string> split_labels(const std::string& field, char sep, const std::string& where) {
  std::vector<std::string> labels;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = field.find(sep, start);
    labels.push_back(trim(field.substr(start, end == std::string::npos ? std::string::npos : end - start)));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (labels.size() == 1 && labels[0].empty()) throw FormatError(where + "empty label");
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i].empty())
      throw FormatError(where + "empty label in '" + utf8::for_terminal(field) + "' (labels are separated by '" +
                        std::string(1, sep) + "', e.g. dog" + std::string(1, sep) + "bark)");
    for (std::size_t j = 0; j < i; ++j)
      if (labels[j] == labels[i])
        throw FormatError(where + "label '" + utf8::for_terminal(labels[i]) + "' is listed twice in '" +
                          utf8::for_terminal(field) + "'");
  }
  return labels;
}

/// Which field of a manifest row holds what; -1 for none. `width` 0: a row has 2 or 3 fields (path,label[,split]);
/// else exactly `width` (the header's).
struct ColumnIndex {
  int path = 0;
  int label = 1;
  int split = 2;
  int fold = -1;
  int group = -1;
  std::size_t width = 0;
};

/// Largest fold number a manifest may give.
constexpr int kMaxFold = 1000;

/// The fold of fold field `text` (trimmed): 0 for an empty field, else an integer 1..kMaxFold. Throws FormatError.
int parse_fold(const std::string& text, const std::string& where) {
  const std::string t = trim(text);
  if (t.empty()) return 0;
  if (t.size() > 4 || t.find_first_not_of("0123456789") != std::string::npos)
    throw FormatError(where + "fold '" + utf8::for_terminal(text) + "' is not an integer 1.." +
                      std::to_string(kMaxFold));
  const int fold = std::stoi(t);
  if (fold == 0)
    throw FormatError(where + "fold 0: folds are numbered from 1 (as ESC-50 and UrbanSound8K number them); a "
                      "0-based fold column needs 1 added to every fold");
  if (fold > kMaxFold) throw FormatError(where + "fold " + t + " is above " + std::to_string(kMaxFold));
  return fold;
}

/// The file a manifest path `written` names, resolved against `base`: as written, or `<path>.wav` when the path
/// has no extension, does not exist, and `<path>.wav` does. Returns the path to open and the path to store.
std::pair<fs::path, std::string> resolve_manifest_path(const std::string& written, const fs::path& base) {
  fs::path p(written);
  if (p.is_relative()) p = base / p;
  std::error_code ec;
  if (fs::path(written).extension().empty() && !fs::exists(p, ec)) {
    fs::path with_wav = p;
    with_wav += ".wav";
    if (fs::exists(with_wav, ec)) return {with_wav, written + ".wav"};
  }
  return {p, written};
}

/// One manifest row `f` (`where` is "manifest:line: " for messages) as an input file, its fields found by `c`;
/// relative paths are resolved against `base`. The label and split are trimmed. Labels must be in `classes` when
/// it is not empty. Throws FormatError.
InputFile manifest_row(const std::vector<std::string>& f, const ColumnIndex& c, const std::string& where,
                       const fs::path& base, const ManifestOptions& options, const std::set<std::string>& classes) {
  if (c.width == 0 && (f.size() < 2 || f.size() > 3))
    throw FormatError(where + "expected path,label[,split], got " + std::to_string(f.size()) + " fields");
  if (c.width != 0 && f.size() != c.width)
    throw FormatError(where + "expected " + std::to_string(c.width) + " fields (as the header row), got " +
                      std::to_string(f.size()));
  const auto field = [&f](int i) { return i >= 0 && static_cast<std::size_t>(i) < f.size() ? f[i] : std::string(); };
  const std::string written = field(c.path);
  if (written.empty()) throw FormatError(where + "empty path");
  const std::vector<std::string> labels = split_labels(field(c.label), options.label_sep, where);
  for (const auto& l : labels)
    if (!classes.empty() && !classes.contains(l))
      throw FormatError(where + "label '" + utf8::for_terminal(l) + "' is not in the classes file " +
                        utf8::for_terminal(options.classes_name));
  int split = -1;
  if (const std::string s = trim(field(c.split)); !s.empty()) {
    split = split_index(lower(s));
    if (split < 0) throw FormatError(where + "unknown split '" + utf8::for_terminal(s) + "' (use train, val or test)");
  }
  auto [path, stored] = resolve_manifest_path(written, base);
  InputFile row{path, stored, labels[0], split, {}, 0, {}};
  if (labels.size() > 1) row.labels = labels;
  row.fold = parse_fold(field(c.fold), where);
  row.group = trim(field(c.group));
  return row;
}

/// The UTF-8 byte order mark some editors write at the start of a text file.

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

/// The column names a manifest header may give, lower case: [0] the path, [1] the label, [2] the split, [3] the
/// fold, [4] the group.
const std::array<std::set<std::string>, 5>& header_names() {
  static const std::array<std::set<std::string>, 5> names{
      std::set<std::string>{"path", "file", "filename", "file_name", "filepath", "file_path", "audio", "audio_path",
                            "wav", "fname"},
      std::set<std::string>{"label", "labels", "class", "class_name", "classname", "category", "target", "tag",
                            "tags"},
      std::set<std::string>{"split", "subset", "set", "partition"}, std::set<std::string>{"fold"},
      std::set<std::string>{"group"}};
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

/// The field index of each known column (header_names) a header row `f` names, -1 where none; [5] the number of
/// fields that are known names.
std::array<int, 6> known_columns(const std::vector<std::string>& f) {
  std::array<int, 6> columns{-1, -1, -1, -1, -1, 0};
  for (std::size_t i = 0; i < f.size(); ++i)
    for (std::size_t c = 0; c < 5; ++c)
      if (header_names()[c].contains(lower(trim(f[i]))) && columns[c] < 0) {
        columns[c] = static_cast<int>(i);
        ++columns[5];
      }
  return columns;
}

/// True when every field of `f` is a known column name, path and label among them.
bool all_known(const std::vector<std::string>& f) {
  const std::array<int, 6> k = known_columns(f);
  return k[0] >= 0 && k[1] >= 0 && k[5] == static_cast<int>(f.size());
}

/// Whether the first row `f` of a manifest is a header: 2 or 3 fields (up to 5 when all are known column names),
/// each a header_word, and its path field names no existing file (resolved against `base`). A file that exists is
/// always data.
bool is_header_row(const std::vector<std::string>& f, const fs::path& base) {
  if (f.size() < 2 || f.size() > 5 || !std::all_of(f.begin(), f.end(), header_word)) return false;
  if (f.size() > 3 && !all_known(f)) return false;
  fs::path p(trim(f[0]));
  if (p.is_relative()) p = base / p;
  std::error_code ec;
  return !fs::exists(p, ec);
}

/// The columns a header row `f` names: by their names when every field is a known column name (header_names, any
/// letter case, any order; `filename,class`), else in the order path,label[,split].
ColumnIndex header_columns(const std::vector<std::string>& f) {
  if (!all_known(f)) return {};
  const std::array<int, 6> k = known_columns(f);
  return {k[0], k[1], k[2], k[3], k[4], f.size()};
}

/// The columns --columns `spec` names in header row `f` (exact match after trimming). Throws InvalidArgument naming
/// --columns and the header's columns for a name the header lacks.
ColumnIndex named_columns(const std::vector<std::string>& f, const ManifestColumns& spec, const std::string& where) {
  const auto find = [&](const std::string& name, const std::string& key) {
    if (name.empty()) return -1;
    for (std::size_t i = 0; i < f.size(); ++i)
      if (trim(f[i]) == name) return static_cast<int>(i);
    std::string have;
    for (const auto& h : f) have += (have.empty() ? "" : ", ") + utf8::for_terminal(trim(h));
    throw InvalidArgument("--columns " + key + "=" + name + ": the header row of " + where + " has no column '" +
                          name + "' (its columns: " + have + "); a manifest read with --columns starts with its "
                          "header row");
  };
  return {find(spec.path, "path"), find(spec.label, "label"), find(spec.split, "split"), find(spec.fold, "fold"),
          find(spec.group, "group"), f.size()};
}

/// True for the header the manifest format documents: `path,label` or `path,label,split` (any letter case).
bool documented_header(const std::vector<std::string>& f) {
  static const std::array<std::string, 3> names{"path", "label", "split"};
  if (f.size() > 3) return false;
  for (std::size_t i = 0; i < f.size(); ++i)
    if (lower(trim(f[i])) != names[i]) return false;
  return true;
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
    if (audio_ext(p)) out.files.push_back({p, rel(p), label, split, {}, 0, {}});
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

std::vector<TextLine> text_lines(const std::string& text) {
  constexpr std::string_view kUtf8Bom = "\xef\xbb\xbf";
  std::vector<TextLine> lines;
  int64_t number = 0;
  for (std::size_t start = text.rfind(kUtf8Bom, 0) == 0 ? kUtf8Bom.size() : 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back({number, std::move(line)});
  }
  return lines;
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

namespace {

/// The manifest's header row `f` (line `line_no`) read: the columns it names (by --columns, or by known names) and
/// --group-by when it names one of them; notes a header other than the documented one in out.warnings.
ColumnIndex read_header(const std::vector<std::string>& f, const std::string& line, int64_t line_no,
                        const fs::path& manifest, const ManifestOptions& options, ScanResult& out) {
  ColumnIndex c = options.columns.given() ? named_columns(f, options.columns, manifest.string())
                                          : header_columns(f);
  if (!options.columns.given() && !documented_header(f))
    out.warnings.push_back("manifest " + manifest.string() + ":" + std::to_string(line_no) + ": '" +
                           utf8::for_terminal(line) + "' read as a header row (not a file)");
  if (c.group >= 0) out.group_by = "column " + trim(f[static_cast<std::size_t>(c.group)]);
  for (std::size_t i = 0; i < f.size() && !options.group_by.empty(); ++i)
    if (trim(f[i]) == options.group_by) {
      c.group = static_cast<int>(i);
      c.width = f.size();
      if (c.split == c.group) c.split = -1;
      out.group_by = "column " + options.group_by;
    }
  return c;
}

/// Throws FormatError when `key` (a manifest row's file, absolute and normalised) was listed before.
void require_new_file(std::map<fs::path, std::pair<int64_t, std::string>>& seen, const fs::path& key,
                      const InputFile& row, int64_t line_no, const std::string& where) {
  const auto [it, inserted] = seen.emplace(key, std::make_pair(line_no, row.rel_path));
  if (!inserted)
    throw FormatError(where + "line " + std::to_string(line_no) + " ('" + utf8::for_terminal(row.rel_path) +
                      "') lists the same file as line " + std::to_string(it->second.first) + " ('" +
                      utf8::for_terminal(it->second.second) + "'): " + utf8::for_terminal(key.string()) +
                      "; list each file once, or it would land in several classes or splits");
}

}  // namespace

ScanResult scan_manifest(const fs::path& manifest, const ManifestOptions& options) {
  const std::string text = manifest_text(manifest);
  const fs::path base = options.audio_root.empty() ? manifest.parent_path() : options.audio_root;
  const fs::path cwd = fs::current_path();
  const std::set<std::string> classes(options.classes.begin(), options.classes.end());
  ScanResult out;
  bool first_row = true;
  ColumnIndex columns;
  std::map<fs::path, std::pair<int64_t, std::string>> seen;
  for (auto& [line_no, line] : text_lines(text)) {
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
    if (std::exchange(first_row, false) && (options.columns.given() || is_header_row(f, base))) {
      columns = read_header(f, line, line_no, manifest, options, out);
      continue;
    }
    const InputFile row = manifest_row(f, columns, where, base, options, classes);
    if (row.split >= 0) out.presplit = true;
    if (!row.labels.empty()) out.multilabel = true;
    out.folds = std::max(out.folds, row.fold);
    const fs::path key = (row.path.is_relative() ? cwd / row.path : row.path).lexically_normal();
    require_new_file(seen, key, row, line_no, where);
    out.files.push_back(row);
  }
  std::sort(out.files.begin(), out.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.rel_path < b.rel_path; });
  if (!options.classes.empty()) out.class_order = options.classes;
  return out;
}

ManifestColumns parse_columns(const std::string& text) {
  ManifestColumns c;
  if (trim(text).empty()) return c;
  std::map<std::string, std::string*> keys{{"path", &c.path},
                                           {"label", &c.label},
                                           {"split", &c.split},
                                           {"fold", &c.fold},
                                           {"group", &c.group}};
  std::map<std::string, std::string> used;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(',', start);
    const std::string part = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::size_t eq = part.find('=');
    const std::string key = lower(trim(part.substr(0, eq)));
    const std::string column = eq == std::string::npos ? "" : trim(part.substr(eq + 1));
    const auto it = keys.find(key);
    if (it == keys.end())
      throw InvalidArgument("--columns: unknown key '" + key + "' in '" + text +
                            "' (keys: path, label, split, fold, group; e.g. path=fname,label=labels)");
    if (column.empty()) throw InvalidArgument("--columns: " + key + "= names no column in '" + text + "'");
    if (!it->second->empty()) throw InvalidArgument("--columns: key '" + key + "' is given twice in '" + text + "'");
    if (const auto u = used.find(column); u != used.end())
      throw InvalidArgument("--columns: column '" + column + "' is named for both " + u->second + " and " + key);
    *it->second = column;
    used[column] = key;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (c.path.empty() || c.label.empty())
    throw InvalidArgument("--columns: '" + text + "' must name the path and label columns (path=COL,label=COL)");
  return c;
}

namespace {

/// Maximum size of a --classes file.
constexpr std::uintmax_t kMaxClassFileBytes = std::uintmax_t{16} << 20;

/// True for a non-empty string of ASCII digits.
bool is_integer(const std::string& s) {
  return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::vector<std::string> read_class_list(const fs::path& file) {
  const std::string text = read_regular_file(file, "classes file", kMaxClassFileBytes);
  std::vector<std::string> names;
  std::map<std::string, int64_t> line_of;
  int vocabulary = -1;
  for (auto& [line_no, line] : text_lines(text)) {
    const std::string where = utf8::for_terminal(file.string()) + ":" + std::to_string(line_no) + ": ";
    if (line.find('\0') != std::string::npos) throw FormatError(where + "NUL byte in the line");
    std::vector<std::string> f;
    try {
      f = parse_csv_line(line);
    } catch (const FormatError&) {
      f = {line};
    }
    const bool vocab_row = f.size() == 3 && is_integer(trim(f[0]));
    if (vocabulary < 0) vocabulary = vocab_row ? 1 : 0;
    if (vocabulary == 1 && !vocab_row)
      throw FormatError(where + "expected index,label,mid as on the lines before (a vocabulary CSV), got '" +
                        utf8::for_terminal(line) + "'");
    const std::string name = vocabulary == 1 ? trim(f[1]) : trim(line);
    if (name.empty()) throw FormatError(where + "empty class name");
    if (const auto [it, inserted] = line_of.emplace(name, line_no); !inserted)
      throw FormatError(where + "class '" + utf8::for_terminal(name) + "' is listed twice (first on line " +
                        std::to_string(it->second) + ")");
    names.push_back(name);
  }
  if (names.empty()) throw FormatError(utf8::for_terminal(file.string()) + ": the classes file names no class");
  return names;
}

void apply_class_list(ScanResult& scan, const std::vector<std::string>& classes, const std::string& source) {
  const std::set<std::string> known(classes.begin(), classes.end());
  for (const InputFile& f : scan.files) {
    std::vector<std::string> labels = f.labels;
    if (labels.empty()) labels.push_back(f.label);
    for (const auto& l : labels)
      if (!known.contains(l))
        throw FormatError(utf8::for_terminal(f.rel_path) + ": label '" + utf8::for_terminal(l) +
                          "' is not in the classes file " + utf8::for_terminal(source));
  }
  scan.class_order = classes;
}

void apply_group_regex(ScanResult& scan, const std::string& pattern) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InvalidArgument("--group-by: '" + pattern + "' is neither a column of the manifest's header nor a valid "
                          "regular expression (" + e.what() + ")");
  }
  for (InputFile& f : scan.files) {
    std::smatch m;
    if (!std::regex_search(f.rel_path, m, re))
      throw FormatError(utf8::for_terminal(f.rel_path) + ": --group-by '" + utf8::for_terminal(pattern) +
                        "' does not match this path; every file needs a group (searched in the stored path)");
    f.group = m.size() > 1 ? m[1].str() : m[0].str();
    if (f.group.empty())
      throw FormatError(utf8::for_terminal(f.rel_path) + ": --group-by '" + utf8::for_terminal(pattern) +
                        "' gives an empty group for this path");
  }
  scan.group_by = "regex " + pattern;
}

}  // namespace melforge::builder
