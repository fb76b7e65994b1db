#pragma once
/// Names that are not valid UTF-8. A Linux file name is a string of bytes, but JSON text and the UTF-8 strings of
/// our HDF5 files must be valid UTF-8, so every name melforge writes into them goes through escape(): valid UTF-8
/// is kept as it is, and each byte that is not part of a valid UTF-8 sequence becomes the four ASCII characters
/// `\xNN` (a backslash, `x`, two lower-case hex digits), as Python's `bytes.decode("utf-8", "backslashreplace")`
/// writes it. The escape is not reversible for names that already contain the text `\x` followed by two hex digits.
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

/// A copy of `j` with every string value and every object key passed through escape(). Two keys that differ only in
/// invalid bytes which escape to the same text keep the later value.
nlohmann::json escape_json(const nlohmann::json& j);

/// `j.dump(indent)` of escape_json(j) (of `j` itself when it holds only valid UTF-8): unlike nlohmann's dump, never
/// throws on invalid UTF-8. indent -1 gives the compact form.
std::string dump(const nlohmann::json& j, int indent = -1);

}  // namespace melforge::utf8
