#pragma once
/// Atomic file output: write to a temporary name in the same folder, flush, then rename. Reading files we did not
/// write: only regular files, with a bound on their size.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace melforge {

/// Writes `text` to `path` through `<path>.partial` and a rename, so that `path` is never half-written.
/// Throws IoError naming the path on any failure (the temporary is removed).
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

/// Writes `j` as indented JSON through write_file_atomically, names that are not valid UTF-8 escaped as
/// utf8::escape does.
void write_json_atomically(const std::filesystem::path& path, const nlohmann::json& j);

/// Largest manifest, trial list or options file read_regular_file() reads by default: 1 GiB.
inline constexpr std::uintmax_t kMaxTextFileBytes = std::uintmax_t{1} << 30;

/// The whole of `path`, which must be a regular file (or a link to one) of at most `max_bytes` bytes. The file is
/// opened with O_NONBLOCK and checked with fstat on the open descriptor before anything is read, so a FIFO, a device
/// (`/dev/zero`), a socket or a folder is refused without blocking and without reading. `role` names the file in
/// every message (e.g. "manifest", "--config", "trial list"); the path is printed through utf8::for_terminal.
/// Throws InvalidArgument when the path is not a regular file, FormatError when it is larger than `max_bytes`,
/// IoError when it cannot be opened or read.
std::string read_regular_file(const std::filesystem::path& path, std::string_view role,
                              std::uintmax_t max_bytes = kMaxTextFileBytes);

/// Throws InvalidArgument (naming `role` and the path) unless `path` opens as a regular file; IoError when it cannot
/// be opened at all. For files another library opens by name afterwards (HDF5, audio): a FIFO or device is refused
/// before that library can block on it or read it.
void require_regular_file(const std::filesystem::path& path, std::string_view role);

}  // namespace melforge
