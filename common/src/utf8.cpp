#include "melforge/common/utf8.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace melforge::utf8 {

namespace {

/// Length of the valid UTF-8 sequence at the start of `s`, or 0 when the first byte does not start one.
std::size_t sequence_length(std::string_view s) {
  const auto byte = [&s](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  return n;
}

/// True when `j` or anything inside it holds a string or key that is not valid UTF-8.
bool needs_escape(const nlohmann::json& j) {
  if (j.is_string()) return !valid(j.get_ref<const std::string&>());
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!valid(it.key()) || needs_escape(it.value())) return true;
    return false;
  }
  if (j.is_array()) {
    for (const auto& v : j)
      if (needs_escape(v)) return true;
  }
  return false;
}

}  // namespace

bool valid(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = sequence_length(text.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string escape(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = sequence_length(text.substr(i));
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    const auto b = static_cast<unsigned char>(text[i++]);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
  }
  return out;
}

std::string for_terminal(std::string_view text, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string clean = escape(text);
  std::string out;
  out.reserve(std::min(clean.size(), max_bytes) + 32);
  for (std::size_t i = 0; i < clean.size();) {
    const std::size_t n = sequence_length(std::string_view(clean).substr(i));
    const auto b = static_cast<unsigned char>(clean[i]);
    std::string piece;
    if (n == 1 && b == '\n') {
      piece = "\\n";
    } else if (n == 1 && b == '\r') {
      piece = "\\r";
    } else if (n == 1 && b == '\t') {
      piece = "\\t";
    } else if (n == 1 && (b < 0x20 || b == 0x7f)) {
      piece = std::string("\\x") + kHex[b >> 4] + kHex[b & 0xf];
    } else if (n == 2 && b == 0xc2 && static_cast<unsigned char>(clean[i + 1]) < 0xa0) {
      const auto c = static_cast<unsigned char>(clean[i + 1]);
      piece = std::string("\\x") + kHex[c >> 4] + kHex[c & 0xf];
    } else if (n == 3 && b == 0xe2 &&
               ((static_cast<unsigned char>(clean[i + 1]) == 0x80 && static_cast<unsigned char>(clean[i + 2]) >= 0xaa &&
                 static_cast<unsigned char>(clean[i + 2]) <= 0xae) ||
                (static_cast<unsigned char>(clean[i + 1]) == 0x81 && static_cast<unsigned char>(clean[i + 2]) >= 0xa6 &&
                 static_cast<unsigned char>(clean[i + 2]) <= 0xa9))) {
      const unsigned cp = ((b & 0x0fu) << 12) | ((static_cast<unsigned char>(clean[i + 1]) & 0x3fu) << 6) |
                          (static_cast<unsigned char>(clean[i + 2]) & 0x3fu);
      piece = std::string("\\u") + kHex[(cp >> 12) & 0xf] + kHex[(cp >> 8) & 0xf] + kHex[(cp >> 4) & 0xf] +
              kHex[cp & 0xf];
    } else {
      piece = clean.substr(i, n);
    }
    if (out.size() + piece.size() > max_bytes) {
      out += "... (" + std::to_string(text.size()) + " bytes)";
      return out;
    }
    out += piece;
    i += n;
  }
  return out;
}

nlohmann::json escape_json(const nlohmann::json& j) {
  if (j.is_string()) return escape(j.get_ref<const std::string&>());
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& v : j) out.push_back(escape_json(v));
    return out;
  }
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[escape(it.key())] = escape_json(it.value());
    return out;
  }
  return j;
}

std::string dump(const nlohmann::json& j, int indent) {
  return needs_escape(j) ? escape_json(j).dump(indent) : j.dump(indent);
}

}  // namespace melforge::utf8
