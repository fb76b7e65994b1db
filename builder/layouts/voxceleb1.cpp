/// VoxCeleb1 (Nagrani et al. 2017): `wav/<speaker>/<video>/<utterance>.wav` (or `vox1_dev_wav/wav` and
/// `vox1_test_wav/wav`), the official trial list `veri_test2.txt` (or `veri_test.txt`); speakers as classes, the
/// trial list's speakers as test, one held-out video per training speaker as val (docs/LAYOUTS.md).
#include <map>
#include <set>
#include <string>

#include "layout_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace voxceleb1 {

/// The folders holding `<speaker>/<video>/<utterance>.wav`: `wav/`, or the dev and test archives unzipped apart
/// (`vox1_dev_wav/wav` and `vox1_test_wav/wav`, or `dev/wav` and `test/wav`), or the root itself when its folders are
/// speakers (`id10270`). Throws FormatError when none is found or two arrangements are.
std::vector<fs::path> wav_folders(const fs::path& root) {
  std::error_code ec;
  std::vector<fs::path> split_parts;
  for (const char* part : {"vox1_dev_wav/wav", "vox1_test_wav/wav", "dev/wav", "test/wav"})
    if (fs::is_directory(root / part, ec)) split_parts.push_back(root / part);
  const bool merged = fs::is_directory(root / "wav", ec);
  if (merged && !split_parts.empty())
    throw FormatError("--layout voxceleb1: '" + utf8::for_terminal(root.string()) +
                      "' holds both wav/ and per-archive wav folders (vox1_dev_wav/wav, vox1_test_wav/wav, dev/wav, "
                      "test/wav): keep one arrangement");
  if (merged) return {root / "wav"};
  if (!split_parts.empty()) return split_parts;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && name.size() > 2 && name.starts_with("id")) return {root};
  }
  throw FormatError("--layout voxceleb1: no wav/ folder in '" + utf8::for_terminal(root.string()) +
                    "': expected ROOT/wav/<speaker>/<video>/<utterance>.wav (or ROOT/vox1_dev_wav/wav and "
                    "ROOT/vox1_test_wav/wav, or ROOT/dev/wav and ROOT/test/wav)");
}

/// The test speakers named by trial list `list` (relative to root); every path of it must be a key of `files`.
/// Throws FormatError naming the line for a malformed line or a path not scanned.
std::set<std::string> trial_speakers(const fs::path& root, const std::string& list,
                                     const std::map<std::string, InputFile>& files) {
  const TrialFileFinder find = [&files](const std::string& path, const std::string&) -> const InputFile* {
    const auto it = files.find(path);
    return it == files.end() ? nullptr : &it->second;
  };
  return trial_classes(read_trials(root, list, "VoxCeleb1's trial list"), list, find,
                       "the files scanned below wav/ (the trial list and the audio disagree)");
}

/// The test speakers of vox1_meta.csv (tab-separated, `VoxCeleb1 ID` and `Set` columns, Set `test`).
std::set<std::string> meta_speakers(const fs::path& root) {
  const MetaTable t = read_table(root, "vox1_meta.csv",
                                 "VoxCeleb1's speaker list; without veri_test2.txt or veri_test.txt at the root it "
                                 "names the test speakers",
                                 true, true);
  const std::size_t c_id = column(t, "voxceleb1 id"), c_set = column(t, "set");
  std::set<std::string> speakers;
  for (const auto& row : t.rows)
    if (lower(text_field(t, row, c_set)) == "test") speakers.insert(text_field(t, row, c_id));
  if (speakers.empty()) throw FormatError(t.name + ": no speaker has Set 'test'");
  return speakers;
}

/// The files below the wav folders by path relative to their wav folder (`id10270/x6uYqmx31kE/00001.wav`), label
/// = speaker, group = speaker/video; files at another depth are skipped.
std::map<std::string, InputFile> scan_wav(const std::vector<fs::path>& wavs, DatasetWalk& walk, ScanResult& out) {
  std::map<std::string, InputFile> files;
  for (const auto& wav : wavs) {
    for (const auto& [root_rel, path] : walk.audio_below(wav, "VoxCeleb1's wav folder")) {
      const fs::path rel = path.lexically_relative(wav);
      const std::vector<fs::path> parts(rel.begin(), rel.end());
      if (parts.size() != 3) {
        out.skipped.push_back({root_rel, "not at <speaker>/<video>/<utterance>.wav below wav/", "scan"});
        continue;
      }
      const std::string key = rel.generic_string();
      InputFile f{path, key, parts[0].string(), 0, {}, 0, parts[0].string() + "/" + parts[1].string()};
      if (!files.emplace(key, f).second)
        throw FormatError("--layout voxceleb1: '" + key + "' is in two wav folders (" +
                          utf8::for_terminal(files.at(key).path.string()) + " and " +
                          utf8::for_terminal(path.string()) + ")");
    }
  }
  return files;
}

/// Splits: test for `test_speakers`; of every other speaker with two or more videos, the video with the least
/// stable_hash of speaker/video to val, the rest train.
void assign_splits(std::map<std::string, InputFile>& files, const std::set<std::string>& test_speakers) {
  std::map<std::string, std::pair<uint64_t, std::string>> held_out;
  std::map<std::string, std::set<std::string>> videos;
  for (const auto& [key, f] : files) {
    if (test_speakers.contains(f.label)) continue;
    videos[f.label].insert(f.group);
    const uint64_t h = stable_hash(f.group);
    auto [it, inserted] = held_out.emplace(f.label, std::make_pair(h, f.group));
    if (!inserted && std::make_pair(h, f.group) < it->second) it->second = {h, f.group};
  }
  for (auto& [key, f] : files) {
    if (test_speakers.contains(f.label)) f.split = 2;
    else f.split = videos[f.label].size() > 1 && held_out[f.label].second == f.group ? 1 : 0;
  }
}

ScanResult scan(const LayoutContext& context) {
  LayoutContext ctx = context;
  ctx.root = dataset_root(context, "voxceleb1");
  ScanResult out;
  DatasetWalk walk(ctx, out);
  std::map<std::string, InputFile> files = scan_wav(wav_folders(ctx.root), walk, out);
  std::error_code ec;
  std::string list;
  for (const char* name : {"veri_test2.txt", "veri_test.txt"})
    if (list.empty() && fs::exists(ctx.root / name, ec)) list = name;
  const std::set<std::string> test = list.empty() ? meta_speakers(ctx.root) : trial_speakers(ctx.root, list, files);
  assign_splits(files, test);
  std::size_t counts[3] = {0, 0, 0};
  std::set<std::string> speakers[3];
  for (auto& [key, f] : files) {
    ++counts[f.split];
    speakers[f.split].insert(f.label);
    out.files.push_back(std::move(f));
  }
  if (list.empty())
    out.warnings.push_back("no veri_test2.txt or veri_test.txt at the dataset root: test speakers from "
                           "vox1_meta.csv, trials drawn by melforge-train (not the official list)");
  else
    out.trials = ctx.root / list;
  out.presplit = true;
  out.open_set = true;
  out.group_by = "video (<speaker>/<video>)";
  out.protocol_notes = {
      "VoxCeleb1 verification: test = the " + std::to_string(speakers[2].size()) + " speakers of " +
          (list.empty() ? std::string("vox1_meta.csv (Set test)") : list + " (the official trial list, copied to "
                                                                           "OUT/trials.txt)") +
          ": " + std::to_string(counts[2]) + " files; EER on the trial list is the published metric",
      "train: the other " + std::to_string(speakers[0].size()) + " speakers (" +
          std::to_string(counts[0]) + " files); val: one held-out video of each training speaker with two or more "
          "videos (" + std::to_string(counts[1]) + " files; same speakers, unseen videos)",
      "paths stored relative to the wav/ folder (id10270/x6uYqmx31kE/00001.wav), as the trial list writes them"};
  finish(out, "voxceleb1", ctx.root);
  return out;
}

}  // namespace voxceleb1

/// The VoxCeleb1 layout (layout_list.cpp).
Layout voxceleb1_layout() {
  return {"voxceleb1",
          "VoxCeleb1: wav/<speaker>/<video>/<utt>.wav, test = the speakers of veri_test2.txt (or veri_test.txt), "
          "copied as the trial list; speakers as classes",
          &voxceleb1::scan};
}

}  // namespace melforge::builder::layouts
