#pragma once
/// Names that are not valid UTF-8. A Linux file name is a string of bytes, but JSON text and the UTF-8 strings of
/// our HDF5 files must be valid UTF-8, so every name melforge writes into them goes through escape(): valid UTF-8
/// is kept as it is, and each byte that is not part of a valid UTF-8 sequence becomes the four ASCII characters
/// `\xNN` (a backslash, `x`, two lower-case hex digits), as Python's `bytes.decode("utf-8", "backslashreplace")`
/// writes it. The escape is not reversible for names that already contain the text `\x` followed by two hex digits.
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace melforge::utf8 {

/// True when `text` is valid UTF-8 (RFC 3629: shortest forms only, no surrogates, nothing above U+10FFFF).
bool valid(std::string_view text);

/// `text` with each byte that is not part of a valid UTF-8 sequence written as `\xNN` (lower-case hex); valid
/// sequences, backslashes included, are copied unchanged. The result is valid UTF-8, and escape(escape(t)) ==
/// escape(t).
std::string escape(std::string_view text);

/// Longest text, in bytes of its escaped form, that for_terminal() prints before cutting.
inline constexpr std::size_t kTerminalTextBytes = 200;

/// `text` (a class name, a path, an attribute: anything read from a file we did not write) made safe to print in one
/// line of a terminal or log: invalid bytes as escape() writes them; C0 controls, DEL and C1 controls as `\n`, `\r`,
/// `\t` or `\xNN`; the bidirectional overrides and isolates (U+202A..U+202E, U+2066..U+2069) as `\u202e`; then,
/// when longer than `max_bytes`, cut at a character boundary and followed by `... (N bytes)` with N the length of
/// `text`. Never longer than max_bytes + 32 bytes; valid UTF-8.
std::string for_terminal(std::string_view text, std::size_t max_bytes = kTerminalTextBytes);

/// A copy of `j` with every string value and every object key passed through escape(). Two keys that differ only in
/// invalid bytes which escape to the same text keep the later value.
nlohmann::json escape_json(const nlohmann::json& j);

/// `j.dump(indent)` of escape_json(j) (of `j` itself when it holds only valid UTF-8): unlike nlohmann's dump, never
/// throws on invalid UTF-8. indent -1 gives the compact form.
std::string dump(const nlohmann::json& j, int indent = -1);

}  // namespace melforge::utf8
