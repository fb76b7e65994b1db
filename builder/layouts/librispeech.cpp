/// LibriSpeech (Panayotov et al. 2015): `<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` with a
/// `<speaker>-<chapter>.trans.txt` per chapter; speakers as classes, chapters as groups, the subsets pooled and split
/// by the build (docs/LAYOUTS.md).
#include <algorithm>
#include <cctype>
#include <set>
#include <string>

#include "layout_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace librispeech {

bool digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

/// True for a LibriSpeech subset folder name: train-*, dev-* or test-* (train-clean-100, dev-other, ...).
bool subset_name(const std::string& name) {
  return name.starts_with("train-") || name.starts_with("dev-") || name.starts_with("test-");
}

/// Adds the utterances of subset folder `dir` to out (files not named `<spk>-<chapter>-<utt>` in
/// `<spk>/<chapter>/` are skipped); returns the speakers found.
std::set<std::string> add_subset(const fs::path& dir, DatasetWalk& walk, ScanResult& out) {
  std::set<std::string> speakers;
  for (const auto& [rel, path] : walk.audio_below(dir, "a LibriSpeech subset folder", ".trans.txt")) {
    const fs::path in_subset = path.lexically_relative(dir);
    const std::vector<fs::path> parts(in_subset.begin(), in_subset.end());
    const std::string spk = parts.size() == 3 ? parts[0].string() : "";
    const std::string chapter = parts.size() == 3 ? parts[1].string() : "";
    if (!digits(spk) || !digits(chapter) || !parts[2].string().starts_with(spk + "-" + chapter + "-")) {
      out.skipped.push_back({rel, "not at <speaker>/<chapter>/<speaker>-<chapter>-<utterance> in a subset folder",
                             "scan"});
      continue;
    }
    speakers.insert(spk);
    out.files.push_back({path, rel, spk, -1, {}, 0, spk + "/" + chapter});
  }
  return speakers;
}

ScanResult scan(const LayoutContext& context) {
  LayoutContext ctx = context;
  ctx.root = dataset_root(context, "librispeech");
  ScanResult out;
  DatasetWalk walk(ctx, out);
  const std::vector<WalkEntry> entries = walk.list(ctx.root);
  const bool one_subset = std::any_of(entries.begin(), entries.end(), [](const WalkEntry& e) {
    return e.is_folder && digits(e.path.filename().string());
  });
  std::string subsets;
  std::size_t speakers = 0;
  if (one_subset) {
    speakers = add_subset(ctx.root, walk, out).size();
    subsets = ctx.root.filename().string();
  }
  for (const auto& e : entries) {
    const std::string name = e.path.filename().string();
    if (one_subset || !e.is_folder) {
      if (!e.is_folder && walk.is_audio(e.path))
        out.skipped.push_back({name, "audio file outside a speaker folder", "scan"});
      continue;
    }
    if (subset_name(name)) {
      speakers += add_subset(e.path, walk, out).size();
      subsets += (subsets.empty() ? "" : ", ") + name;
    } else {
      for (const auto& [rel, path] : walk.audio_below(e.path, "a folder of the dataset", ".trans.txt"))
        out.skipped.push_back({rel, "folder '" + name + "' is not a LibriSpeech subset (train-*, dev-*, test-*)",
                               "scan"});
    }
  }
  if (subsets.empty())
    throw FormatError("--layout librispeech: '" + utf8::for_terminal(ctx.root.string()) +
                      "' holds no subset folder (train-clean-100, dev-clean, ...) and no speaker folder: --input is "
                      "the LibriSpeech folder or one of its subsets");
  out.group_by = "chapter (<speaker>/<chapter>)";
  out.protocol_notes = {
      "LibriSpeech: subsets read: " + subsets + " (pooled; " + std::to_string(speakers) +
          " speaker folders); class = speaker, group = chapter",
      "splits assigned by melforge-build with each chapter in one split (--split-by file: closed-set speaker "
      "identification, accuracy; --split-by class: unseen speakers in val and test, for --task verification)"};
  finish(out, "librispeech", ctx.root);
  return out;
}

}  // namespace librispeech

/// The LibriSpeech layout (layout_list.cpp).
Layout librispeech_layout() {
  return {"librispeech",
          "LibriSpeech: <subset>/<speaker>/<chapter>/*.flac (the root or one subset), speakers as classes, chapters "
          "as groups",
          &librispeech::scan};
}

}  // namespace melforge::builder::layouts
