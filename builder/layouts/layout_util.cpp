#include "layout_util.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <string_view>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace {


/// The lines of `root / rel` read as a metadata file, each with its 1-based number, CR of CRLF removed, blank lines
/// left out. Throws FormatError for a missing file (naming `what`) and for a NUL byte (naming the line).
std::vector<MetaRow> raw_lines(const fs::path& root, const std::string& rel, const std::string& what) {
  const fs::path path = root / rel;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw FormatError("'" + utf8::for_terminal(path.string()) + "' does not exist: it is " + what);
  const std::string text = read_regular_file(path, rel, kMaxMetadataBytes);
  std::vector<MetaRow> lines;
  for (auto& [line_no, line] : text_lines(text)) {
    if (line.find('\0') != std::string::npos)
      throw FormatError(where(rel, line_no) + "NUL byte in the line: " + rel + " is a text file");
    lines.push_back({line_no, {std::move(line)}});
  }
  return lines;
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = line.find('\t', start);
    fields.push_back(line.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return fields;
    start = end + 1;
  }
}

std::string joined(const std::vector<std::string>& fields) {
  std::string s;
  for (const auto& f : fields) s += (s.empty() ? "" : ",") + f;
  return utf8::for_terminal(s);
}

}  // namespace

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string where(const std::string& file, int64_t line) { return file + ":" + std::to_string(line) + ": "; }

MetaTable read_table(const fs::path& root, const std::string& rel, const std::string& what, bool has_header,
                     bool tabs, std::size_t min_fields) {
  MetaTable table{rel, {}, {}};
  bool first = has_header;
  for (auto& row : raw_lines(root, rel, what)) {
    std::vector<std::string> fields;
    if (tabs) {
      fields = split_tabs(row.fields[0]);
    } else {
      try {
        fields = parse_csv_line(row.fields[0]);
      } catch (const FormatError& e) {
        throw FormatError(where(rel, row.line) + e.what());
      }
    }
    if (std::exchange(first, false)) {
      table.header = std::move(fields);
      continue;
    }
    const std::size_t want = table.header.empty() ? min_fields : table.header.size();
    if (table.header.empty() ? fields.size() < want : fields.size() != want)
      throw FormatError(where(rel, row.line) + std::to_string(fields.size()) + " fields, expected " +
                        (table.header.empty() ? "at least " : "") + std::to_string(want) +
                        (table.header.empty() ? "" : " (the header's: " + joined(table.header) + ")"));
    table.rows.push_back({row.line, std::move(fields)});
  }
  if (has_header && table.header.empty()) throw FormatError(rel + " is empty: expected a header row and data rows");
  return table;
}

std::vector<MetaRow> read_lines(const fs::path& root, const std::string& rel, const std::string& what) {
  std::vector<MetaRow> lines = raw_lines(root, rel, what);
  for (auto& l : lines) l.fields[0] = trim(l.fields[0]);
  return lines;
}

std::vector<Trial> read_trials(const fs::path& root, const std::string& rel, const std::string& what) {
  std::vector<Trial> trials;
  for (const MetaRow& l : read_lines(root, rel, what)) {
    std::istringstream in(l.fields[0]);
    std::string label, a, b, extra;
    in >> label >> a >> b;
    if (b.empty() || (in >> extra) || (label != "0" && label != "1"))
      throw FormatError(where(rel, l.line) + "expected '<1|0> <speaker/video/utt.wav> <speaker/video/utt.wav>', got '" +
                        utf8::for_terminal(l.fields[0]) + "'");
    trials.push_back({l.line, label == "1" ? 1 : 0, a, b});
  }
  if (trials.empty()) throw FormatError(rel + " holds no trial");
  return trials;
}

std::set<std::string> trial_classes(const std::vector<Trial>& trials, const std::string& list,
                                    const TrialFileFinder& find, const std::string& files_what) {
  std::set<std::string> classes;
  for (const Trial& t : trials)
    for (const std::string* p : {&t.enroll, &t.test}) {
      const std::string at = where(list, t.line);
      const InputFile* f = find(*p, at);
      if (f == nullptr)
        throw FormatError(at + "'" + utf8::for_terminal(*p) + "' is not among " + files_what);
      classes.insert(f->label);
    }
  return classes;
}

std::size_t column(const MetaTable& table, const std::string& name) {
  for (std::size_t i = 0; i < table.header.size(); ++i)
    if (lower(trim(table.header[i])) == name) return i;
  throw FormatError(table.name + ": no column '" + name + "' in the header '" + joined(table.header) +
                    "' (is this the dataset's own, unmodified metadata file?)");
}

std::string text_field(const MetaTable& table, const MetaRow& row, std::size_t field) {
  std::string value = trim(row.fields.at(field));
  if (value.empty())
    throw FormatError(where(table.name, row.line) + "empty field '" +
                      (field < table.header.size() ? utf8::for_terminal(trim(table.header[field]))
                                                   : "#" + std::to_string(field + 1)) +
                      "'");
  return value;
}

int int_field(const MetaTable& table, const MetaRow& row, std::size_t field, int lo, int hi) {
  const std::string value = text_field(table, row, field);
  const std::string name =
      field < table.header.size() ? trim(table.header[field]) : "field " + std::to_string(field + 1);
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || v < lo || v > hi)
    throw FormatError(where(table.name, row.line) + "field '" + utf8::for_terminal(name) + "' is '" +
                      utf8::for_terminal(value) + "', expected an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
  return static_cast<int>(v);
}

DatasetWalk::DatasetWalk(const LayoutContext& context, ScanResult& out)
    : context_(context), out_(out), walk_([&context] {
        WalkOptions o;
        o.include_hidden = context.include_hidden;
        o.display_root = context.root;
        for (const auto& p : context.exclude) {
          std::error_code ec;
          if (const auto id = folder_id(p, ec))
            o.excluded.emplace_back(*id, "the build's output folder '" + p.string() +
                                             "' is inside the input folder: not scanned");
        }
        return o;
      }()) {
  walk_.claim(context.root);
}

std::string DatasetWalk::rel(const fs::path& path) const {
  return path.lexically_relative(context_.root).generic_string();
}

bool DatasetWalk::is_audio(const fs::path& path) const {
  const std::string ext = lower(path.extension().string());
  return ext.size() > 1 &&
         std::find(context_.extensions.begin(), context_.extensions.end(), ext.substr(1)) != context_.extensions.end();
}

void DatasetWalk::record(const WalkResult& result) {
  for (const auto& p : result.problems) out_.skipped.push_back({rel(p.path), p.reason, "scan"});
  for (const auto& p : result.hidden) out_.hidden.push_back(rel(p));
  for (const auto& p : result.excluded) out_.excluded.push_back({rel(p.path), p.reason, "scan"});
}

std::vector<WalkEntry> DatasetWalk::list(const fs::path& dir) {
  WalkResult result;
  std::vector<WalkEntry> entries = walk_.list(dir, result);
  record(result);
  return entries;
}

AudioFiles DatasetWalk::audio_below(const fs::path& dir, const std::string& what,
                                    const std::string& metadata_suffix) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw FormatError("'" + utf8::for_terminal(dir.string()) + "' is not a folder: it is " + what);
  WalkResult result;
  walk_.walk(dir, result);
  record(result);
  AudioFiles files;
  for (const auto& p : result.files) {
    if (is_audio(p)) files.emplace(rel(p), p);
    else if (metadata_suffix.empty() || !p.filename().string().ends_with(metadata_suffix))
      out_.skipped.push_back({rel(p), "not an audio file extension", "scan"});
  }
  return files;
}

fs::path dataset_root(const LayoutContext& context, const std::string& layout) {
  fs::path root = context.root.lexically_normal();
  if (!root.has_filename() && root.has_parent_path()) root = root.parent_path();
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw IoError("--layout " + layout + ": input folder '" + utf8::for_terminal(root.string()) + "' does not exist");
  return root;
}

void skip_unlisted(const AudioFiles& found, const std::map<std::string, bool>& listed, const std::string& reason,
                   ScanResult& out) {
  for (const auto& [rel, path] : found)
    if (!listed.contains(rel)) out.skipped.push_back({rel, reason, "scan"});
}

void finish(ScanResult& out, const std::string& layout, const fs::path& root) {
  std::sort(out.files.begin(), out.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.rel_path < b.rel_path; });
  std::sort(out.skipped.begin(), out.skipped.end(),
            [](const SkippedFile& a, const SkippedFile& b) { return a.path < b.path; });
  std::sort(out.hidden.begin(), out.hidden.end());
  if (out.files.empty())
    throw FormatError("--layout " + layout + ": no audio file of the dataset found below '" +
                      utf8::for_terminal(root.string()) + "' (" + std::to_string(out.skipped.size()) +
                      " entries skipped)");
  for (std::size_t i = 1; i < out.files.size(); ++i)
    if (out.files[i].rel_path == out.files[i - 1].rel_path)
      throw FormatError("--layout " + layout + ": two files are stored as '" +
                        utf8::for_terminal(out.files[i].rel_path) + "': '" +
                        utf8::for_terminal(out.files[i - 1].path.string()) + "' and '" +
                        utf8::for_terminal(out.files[i].path.string()) + "'");
  out.layout = layout;
}

void note_index(std::map<int, std::string>& by_index, int index, const std::string& label, const MetaTable& table,
                const MetaRow& row) {
  const auto [it, inserted] = by_index.emplace(index, label);
  if (!inserted && it->second != label)
    throw FormatError(where(table.name, row.line) + "index " + std::to_string(index) + " names class '" +
                      utf8::for_terminal(label) + "', but an earlier row gave it to '" +
                      utf8::for_terminal(it->second) + "'");
  if (inserted)
    for (const auto& [i, l] : by_index)
      if (l == label && i != index)
        throw FormatError(where(table.name, row.line) + "class '" + utf8::for_terminal(label) + "' has index " +
                          std::to_string(index) + ", but an earlier row gave it index " + std::to_string(i));
}

std::vector<std::string> order_by_index(const std::map<int, std::string>& by_index) {
  std::vector<std::string> order;
  for (const auto& [i, label] : by_index) order.push_back(label);
  return order;
}

std::string file_name_field(const MetaTable& table, const MetaRow& row, std::size_t field) {
  std::string name = text_field(table, row, field);
  if (name.find_first_of("/\\") != std::string::npos || name == "." || name == "..")
    throw FormatError(where(table.name, row.line) + "'" + utf8::for_terminal(name) +
                      "' is not a plain file name (no folders in this column)");
  return name;
}

void warn_groups_across_folds(ScanResult& out, const std::string& group_name) {
  std::map<std::string, std::set<int>> folds;
  for (const auto& f : out.files) folds[f.group].insert(f.fold);
  std::string named;
  std::size_t count = 0;
  for (const auto& [group, fs] : folds) {
    if (fs.size() < 2) continue;
    if (++count <= 5) named += (named.empty() ? "" : ", ") + utf8::for_terminal(group);
  }
  if (count > 0)
    out.warnings.push_back(std::to_string(count) + " " + group_name + " value(s) have files in more than one fold (" +
                           named + (count > 5 ? ", ..." : "") + "): the metadata's folds are used as given");
}

void warn_empty_folds(ScanResult& out) {
  std::set<int> present;
  for (const auto& f : out.files) present.insert(f.fold);
  std::string empty;
  for (int k = 1; k <= out.folds; ++k)
    if (!present.contains(k)) empty += (empty.empty() ? "" : ", ") + std::to_string(k);
  if (!empty.empty())
    out.warnings.push_back("fold(s) " + empty + " of " + std::to_string(out.folds) +
                           " hold no file: the dataset is incomplete, cross-validation over them has no test file");
}

void warn_missing(ScanResult& out, std::size_t missing, const std::string& list) {
  if (missing > 0)
    out.warnings.push_back(std::to_string(missing) + " file(s) listed in " + list +
                           " were not found on disk (listed as skipped): the dataset is incomplete, so results are "
                           "not comparable with the published protocol");
}

uint64_t stable_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace melforge::builder::layouts
