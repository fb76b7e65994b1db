#pragma once
/// Small parsers shared by the option registrations of every binary.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "melforge/common/errors.h"

namespace melforge {

/// Parses a flag value that is a positive integer or "auto"; returns 0 for "auto".
/// Throws InvalidArgument naming `flag` for anything else (0, negatives, junk).
inline int parse_positive_or_auto(const std::string& value, const std::string& flag) {
  if (value == "auto") return 0;
  std::size_t used = 0;
  long n = 0;
  try {
    n = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || n <= 0 || n > 1'000'000'000)
    throw InvalidArgument(flag + ": '" + value + "' is not a positive integer or auto");
  return static_cast<int>(n);
}

/// A floating-point default as --help shows it: the shortest decimal that reads back (0.3, not 0.2999...).
inline std::string default_text(double value) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

}  // namespace melforge
