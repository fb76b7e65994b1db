// The banks of noise and impulse-response clips (augment.h): the folder scan, the size from the headers and the
// decode of every clip, once per build.
#include <algorithm>
#include <system_error>

#include "audio/decode.h"
#include "augment/augment.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "melforge/common/fs_walk.h"
#include "melforge/common/parallel.h"
#include "melforge/common/utf8.h"

namespace melforge::augment {
namespace {

namespace fs = std::filesystem;

/// One audio file of a bank's folder.
struct BankFile {
  /// Its path as walked (below the folder).
  fs::path path;
  /// Clip::path.
  std::string rel;
  /// Clip::group.
  std::string group;
};

/// True when the extension of `path` (without the dot, any letter case) is one of `extensions`.
bool has_extension(const fs::path& path, const std::vector<std::string>& extensions) {
  std::string ext = path.extension().string();
  if (ext.empty()) return false;
  ext = ascii_lower(ext.substr(1));
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& e) { return ascii_lower(e) == ext; });
}

/// The audio files under `dir` (recursively, hidden entries skipped), sorted by relative path. Throws
/// InvalidArgument naming `flag` when `dir` is not a folder, a folder below it cannot be read, or it holds no file
/// with one of `extensions`.
std::vector<BankFile> bank_files(const fs::path& dir, const std::vector<std::string>& extensions,
                                 const std::string& flag) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InvalidArgument(flag + ": '" + dir.string() + "' is not a folder");
  WalkOptions options;
  options.display_root = dir;
  FolderWalk walk(options);
  WalkResult found;
  walk.walk(dir, found);
  for (const auto& p : found.problems)
    throw InvalidArgument(flag + ": " + p.path.string() + ": " + p.reason);
  std::vector<BankFile> files;
  for (const auto& path : found.files) {
    if (!has_extension(path, extensions)) continue;
    const fs::path rel = path.lexically_relative(dir);
    const std::string group = std::distance(rel.begin(), rel.end()) > 1 ? rel.begin()->string() : ".";
    files.push_back({path, utf8::escape(rel.generic_string()), utf8::escape(group)});
  }
  if (files.empty()) {
    std::string list;
    for (const auto& e : extensions) list += (list.empty() ? "" : ",") + e;
    throw InvalidArgument(flag + ": '" + dir.string() + "' holds no audio file (extensions " + list + ")");
  }
  std::sort(files.begin(), files.end(), [](const BankFile& a, const BankFile& b) { return a.rel < b.rel; });
  return files;
}

}  // namespace

int64_t Bank::bytes() const {
  int64_t total = 0;
  for (const auto& c : clips) total += static_cast<int64_t>(c.samples.size() * sizeof(float));
  return total;
}

int64_t bank_bytes(const fs::path& dir, int sample_rate, const std::vector<std::string>& extensions,
                   const std::string& flag) {
  if (dir.empty()) return 0;
  int64_t total = 0;
  for (const auto& f : bank_files(dir, extensions, flag)) {
    try {
      total += audio::output_frames(audio::probe(f.path), sample_rate) * static_cast<int64_t>(sizeof(float));
    } catch (const AudioError& e) {
      throw InvalidArgument(flag + ": " + e.what());
    }
  }
  return total;
}

Bank load_bank(const fs::path& dir, int sample_rate, const std::vector<std::string>& extensions, int threads,
               const std::string& flag) {
  Bank bank;
  if (dir.empty()) return bank;
  const std::vector<BankFile> files = bank_files(dir, extensions, flag);
  bank.clips.resize(files.size());
  std::vector<std::string> errors(files.size());
  const audio::DecodeOptions opts{sample_rate, -1};
  parallel_for(static_cast<int64_t>(files.size()), resolve_threads(threads), [&](int64_t i) {
    const BankFile& f = files[static_cast<size_t>(i)];
    Clip& clip = bank.clips[static_cast<size_t>(i)];
    clip.path = f.rel;
    clip.group = f.group;
    try {
      clip.samples = audio::decode(f.path, opts).samples;
      if (clip.samples.empty()) errors[static_cast<size_t>(i)] = f.path.string() + ": decodes to no sample";
    } catch (const AudioError& e) {
      errors[static_cast<size_t>(i)] = e.what();
    }
  });
  for (const auto& e : errors)
    if (!e.empty()) throw InvalidArgument(flag + ": " + e);
  return bank;
}

}  // namespace melforge::augment
