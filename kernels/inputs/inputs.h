#pragma once
/// The audio files `melforge-train predict` and melforge.predict read for their inputs: files as given, folders
/// walked (common/fs_walk.h) for the extensions melforge-build scans by default.
#include <filesystem>
#include <string>
#include <vector>

namespace melforge::inputs {

/// One input: a file to score, or an entry that cannot be read (`error` says why).
struct PredictInput {
  /// The file (or the folder or link that could not be read).
  std::filesystem::path path;
  /// Empty, or "<path>: <reason>" (e.g. "cannot read folder: Permission denied"); predict reports it as the row's
  /// error, as it does for a file it cannot decode.
  std::string error;
};

/// True when `path`'s extension (case-insensitive) is one melforge-build scans by default (wav, flac, ogg, oga,
/// aif, aiff, aifc, au, snd, caf, w64, rf64, mp3, opus).
bool is_audio_name(const std::filesystem::path& path);

/// The inputs predict reads for `inputs`: a file as given; a folder searched recursively (FolderWalk,
/// melforge/common/fs_walk.h: links to folders followed, each folder once) for regular files with is_audio_name,
/// with every sub-folder that cannot be read, broken link and link loop as an entry with its error, sorted by path
/// within each input. Entries whose name starts with '.' are ignored unless `include_hidden`. An input that does
/// not exist is returned too (predict reports it as unreadable).
std::vector<PredictInput> collect_inputs(const std::vector<std::filesystem::path>& inputs,
                                         bool include_hidden = false);

}  // namespace melforge::inputs
