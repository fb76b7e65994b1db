#pragma once
/// CSV text helpers shared by the trainer's reports and the file-level metrics (kernels/metrics).
#include <string>

namespace melforge {

/// `s` as one CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a quote or a line break.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char ch : s) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + "\"";
}

}  // namespace melforge
