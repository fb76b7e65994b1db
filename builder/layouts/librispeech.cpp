/// LibriSpeech (Panayotov et al. 2015): `<subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac` with a
/// `<speaker>-<chapter>.trans.txt` per chapter; speakers as classes, chapters as groups, the train-*, dev-* and test-*
/// subsets as train, val and test (speaker-disjoint: open-set verification) (docs/LAYOUTS.md).
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

/// The split of a subset's role: train-* 0, dev-* 1, test-* 2.
int subset_split(const std::string& name) { return name.starts_with("train-") ? 0 : name.starts_with("dev-") ? 1 : 2; }

/// The splits of the files: their subset's role when the subsets read have two roles or more (presplit); otherwise
/// (one subset, or subsets of one role) every file's split is left to the build (-1). Returns the protocol note.
std::string settle_splits(ScanResult& out) {
  std::set<int> roles;
  for (const auto& f : out.files) roles.insert(f.split);
  if (roles.size() < 2 || roles.contains(-1)) {
    for (auto& f : out.files) f.split = -1;
    return "splits assigned by melforge-build (one subset role read): --split-by class gives unseen speakers in "
           "val and test for --task verification; each chapter stays in one split";
  }
  out.presplit = true;
  out.open_set = true;
  std::size_t counts[3] = {0, 0, 0};
  std::set<std::string> speakers[3];
  for (const auto& f : out.files) {
    ++counts[f.split];
    speakers[f.split].insert(f.label);
  }
  std::string note = "splits from the subsets (speaker-disjoint): ";
  const char* names[3] = {"train-* -> train", "dev-* -> val", "test-* -> test"};
  for (int s = 0; s < 3; ++s)
    note += std::string(s ? ", " : "") + names[s] + " (" + std::to_string(counts[s]) + " files, " +
            std::to_string(speakers[s].size()) + " speakers)";
  return note + "; open-set speaker verification (--task verification), EER on test";
}

/// Adds the utterances of subset folder `dir` to out (files not named `<spk>-<chapter>-<utt>` in
/// `<spk>/<chapter>/` are skipped), with split `split` for now; returns the speakers found.
std::set<std::string> add_subset(const fs::path& dir, int split, DatasetWalk& walk, ScanResult& out) {
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
    out.files.push_back({path, rel, spk, split, {}, 0, spk + "/" + chapter});
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
    speakers = add_subset(ctx.root, -1, walk, out).size();
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
      speakers += add_subset(e.path, subset_split(name), walk, out).size();
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
  out.protocol_notes = {"LibriSpeech: subsets read: " + subsets + " (" + std::to_string(speakers) +
                            " speaker folders); class = speaker, group = chapter",
                        settle_splits(out)};
  finish(out, "librispeech", ctx.root);
  return out;
}

}  // namespace librispeech

/// The LibriSpeech layout (layout_list.cpp).
Layout librispeech_layout() {
  return {"librispeech",
          "LibriSpeech: <subset>/<speaker>/<chapter>/*.flac, speakers as classes, train-*/dev-*/test-* subsets as "
          "train/val/test (speaker-disjoint: verification), chapters as groups",
          &librispeech::scan};
}

}  // namespace melforge::builder::layouts
