#include "inputs/inputs.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "melforge/common/fs_walk.h"

namespace fs = std::filesystem;

namespace melforge::inputs {

namespace {

/// Extensions melforge-build scans by default (BuildOptions::extensions).
const std::set<std::string> kAudioExtensions = {"wav", "flac", "ogg", "oga", "aif", "aiff", "aifc",
                                                "au",  "snd",  "caf", "w64", "rf64", "mp3", "opus"};

}  // namespace

bool is_audio_name(const fs::path& p) {
  std::string ext = p.extension().string();
  if (!ext.empty() && ext.front() == '.') ext.erase(ext.begin());
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return kAudioExtensions.count(ext) > 0;
}

std::vector<PredictInput> collect_inputs(const std::vector<fs::path>& inputs, bool include_hidden) {
  std::vector<PredictInput> out;
  FolderWalk walk({include_hidden, {}, {}, {}});
  for (const auto& in : inputs) {
    std::error_code ec;
    if (!fs::is_directory(in, ec)) {
      out.push_back({in, ""});
      continue;
    }
    WalkResult found;
    walk.walk(in, found);
    std::vector<PredictInput> here;
    for (const auto& p : found.files)
      if (is_audio_name(p)) here.push_back({p, ""});
    for (const auto& pr : found.problems) here.push_back({pr.path, pr.path.string() + ": " + pr.reason});
    std::sort(here.begin(), here.end(), [](const PredictInput& a, const PredictInput& b) { return a.path < b.path; });
    out.insert(out.end(), here.begin(), here.end());
  }
  return out;
}

}  // namespace melforge::inputs
