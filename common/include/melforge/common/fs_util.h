#pragma once
/// Atomic file output: write to a temporary name in the same folder, flush, then rename.
#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace melforge {

/// Writes `text` to `path` through `<path>.partial` and a rename, so that `path` is never half-written.
/// Throws IoError naming the path on any failure (the temporary is removed).
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

/// Writes `j` as indented JSON through write_file_atomically, names that are not valid UTF-8 escaped as
/// utf8::escape does.
void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j);

}  // namespace melforge
