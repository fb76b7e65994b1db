// libFuzzer target: the CSV manifest reader of melforge-build (builder/scan.cpp: scan_manifest, parse_csv_line).
// The input is the manifest's bytes. Checks, besides crashes and sanitizer reports:
//   - every line that parses re-encodes (every field quoted, quotes doubled) to a line that parses to the same fields;
//   - an accepted manifest gives files sorted by rel_path, unique, with non-empty path and label, a split in
//     [-1, 2], and the path resolved against the manifest's folder; labels trimmed of spaces and tabs, and no file
//     twice under two spellings (equal once absolute and lexically normal);
//   - (issue 29) a UTF-16 byte order mark is never accepted and no accepted path or label holds a NUL byte.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "melforge/common/errors.h"
#include "scan.h"

using melforge::fuzz::require;

namespace {

std::string quote_all(const std::vector<std::string>& fields) {
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    line += '"';
    for (char c : fields[i]) line += c == '"' ? std::string("\"\"") : std::string(1, c);
    line += '"';
  }
  return line;
}

void check_round_trip(const std::string& line) {
  std::vector<std::string> fields;
  try {
    fields = melforge::builder::parse_csv_line(line);
  } catch (const melforge::FormatError&) {
    return;
  }
  require(!fields.empty(), "parse_csv_line returned no field");
  std::vector<std::string> again;
  try {
    again = melforge::builder::parse_csv_line(quote_all(fields));
  } catch (const melforge::FormatError& e) {
    require(false, std::string("re-encoded line does not parse: ") + e.what());
  }
  require(again == fields, "re-encoded line parses to other fields");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static melforge::fuzz::MemFile file;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    check_round_trip(text.substr(start, end - start));
    start = end + 1;
  }

  file.assign(data, size);
  melforge::builder::ScanResult scan;
  try {
    scan = melforge::builder::scan_manifest(file.path());
  } catch (const melforge::FormatError&) {
    return 0;
  }
  require(text.rfind("\xff\xfe", 0) != 0 && text.rfind("\xfe\xff", 0) != 0, "accepted a UTF-16 manifest");
  const std::filesystem::path base = std::filesystem::path(file.path()).parent_path();
  std::set<std::filesystem::path> files;
  for (std::size_t i = 0; i < scan.files.size(); ++i) {
    const auto& f = scan.files[i];
    require(!f.rel_path.empty() && !f.label.empty(), "accepted a row with an empty path or label");
    require(f.rel_path.find('\0') == std::string::npos && f.label.find('\0') == std::string::npos,
            "accepted a NUL byte in a field");
    require(f.label.find_first_of(" \t") != 0 && f.label.find_last_of(" \t") != f.label.size() - 1,
            "label not trimmed");
    require(files.insert(std::filesystem::absolute(f.path).lexically_normal()).second,
            "one file accepted twice under two spellings");
    require(f.split >= -1 && f.split <= 2, "split index out of range");
    require(i == 0 || scan.files[i - 1].rel_path < f.rel_path, "files not sorted or not unique");
    const std::filesystem::path p(f.rel_path);
    require(f.path == (p.is_relative() ? base / p : p), "path not resolved against the manifest's folder");
  }
  for (const auto& s : scan.skipped) require(!s.path.empty() && !s.reason.empty(), "skipped entry without reason");
  return 0;
}
