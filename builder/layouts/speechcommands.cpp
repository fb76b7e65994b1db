/// Google Speech Commands (v0.01 and v0.02, Warden 2018): `<word>/<speaker>_nohash_<n>.wav`, `validation_list.txt`,
/// `testing_list.txt`, `_background_noise_/`; the given lists as val and test, the rest train, groups by speaker,
/// `_background_noise_` offered as the noise bank (docs/LAYOUTS.md).
#include <map>
#include <set>
#include <string>

#include "layout_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::builder::layouts {

namespace speechcommands {

constexpr const char* kNoise = "_background_noise_";
constexpr const char* kNohash = "_nohash_";

/// The split each list names (validation_list.txt: 1, testing_list.txt: 2), by path relative to the root. Throws
/// FormatError for a file in both lists or twice in one, naming the lines.
std::map<std::string, std::pair<int, std::string>> read_lists(const fs::path& root) {
  std::map<std::string, std::pair<int, std::string>> split_of;
  for (const auto& [list, split] : {std::pair<std::string, int>{"validation_list.txt", 1}, {"testing_list.txt", 2}}) {
    for (const auto& l : read_lines(root, list, "Speech Commands' " + list + " (the " +
                                                    (split == 1 ? "validation" : "test") +
                                                    " split); --input must be the dataset's root folder")) {
      std::string rel = l.fields[0];
      while (rel.rfind("./", 0) == 0) rel.erase(0, 2);
      const std::string here = list + " line " + std::to_string(l.line);
      const auto [it, inserted] = split_of.emplace(rel, std::make_pair(split, here));
      if (!inserted)
        throw FormatError(where(list, l.line) + "'" + utf8::for_terminal(rel) + "' is also listed in " +
                          it->second.second);
    }
  }
  return split_of;
}

/// The speaker of a Speech Commands file name (`0a7c2a8d_nohash_0.wav` -> `0a7c2a8d`); "" when there is no
/// `_nohash_` in it.
std::string speaker(const std::string& rel) {
  const std::string name = fs::path(rel).filename().string();
  const auto at = name.find(kNohash);
  return at == std::string::npos || at == 0 ? "" : name.substr(0, at);
}

/// Adds the word folders' files of `found` (label `word`) to out, with their list split and speaker group.
void add_word(const std::string& word, const AudioFiles& found,
              std::map<std::string, std::pair<int, std::string>>& split_of, std::size_t& no_speaker,
              ScanResult& out) {
  for (const auto& [rel, path] : found) {
    std::string group = speaker(rel);
    if (group.empty()) {
      ++no_speaker;
      group = fs::path(rel).stem().string();
    }
    int split = 0;
    if (const auto it = split_of.find(rel); it != split_of.end()) {
      split = it->second.first;
      split_of.erase(it);
    }
    out.files.push_back({path, rel, word, split, {}, 0, group});
  }
}

/// Warnings for speakers whose files the lists put in more than one split.
void warn_speaker_leaks(ScanResult& out) {
  std::map<std::string, std::set<int>> splits;
  for (const auto& f : out.files) splits[f.group].insert(f.split);
  std::size_t leaks = 0;
  for (const auto& [g, s] : splits) leaks += s.size() > 1 ? 1 : 0;
  if (leaks > 0)
    out.warnings.push_back(std::to_string(leaks) + " speaker(s) have files in more than one split of the given "
                           "lists (the official lists never do: were they edited?)");
}

ScanResult scan(const LayoutContext& context) {
  LayoutContext ctx = context;
  ctx.root = dataset_root(context, "speechcommands");
  ScanResult out;
  auto split_of = read_lists(ctx.root);
  DatasetWalk walk(ctx, out);
  std::size_t no_speaker = 0;
  for (const auto& e : walk.list(ctx.root)) {
    const std::string name = e.path.filename().string();
    if (!e.is_folder) {
      if (walk.is_audio(e.path)) out.skipped.push_back({name, "audio file outside a word folder", "scan"});
      continue;
    }
    const AudioFiles found = walk.audio_below(e.path, "a folder of the dataset");
    if (name == kNoise) {
      out.noise_bank = e.path;
      for (const auto& [rel, path] : found)
        out.skipped.push_back({rel, "noise bank (_background_noise_), not a class: offered as --noise for "
                                    "--augment-copies", "scan"});
    } else if (name.starts_with("_")) {
      for (const auto& [rel, path] : found)
        out.skipped.push_back({rel, "folder '" + name + "' starts with '_': not a word class", "scan"});
    } else {
      add_word(name, found, split_of, no_speaker, out);
    }
  }
  std::size_t missing = 0;
  for (const auto& [rel, listed] : split_of) {
    out.skipped.push_back({rel, "listed in " + listed.second + " but not found in a word folder", "scan"});
    ++missing;
  }
  warn_missing(out, missing, "validation_list.txt / testing_list.txt");
  if (no_speaker > 0)
    out.warnings.push_back(std::to_string(no_speaker) + " file name(s) without '_nohash_': grouped by their own name");
  if (out.noise_bank.empty())
    out.warnings.push_back("no _background_noise_ folder: no noise bank to offer for --augment-copies");
  warn_speaker_leaks(out);
  std::size_t counts[3] = {0, 0, 0};
  for (const auto& f : out.files) ++counts[f.split];
  out.presplit = true;
  out.group_by = "speaker (file name before _nohash_)";
  out.protocol_notes = {
      "Speech Commands: validation_list.txt -> val (" + std::to_string(counts[1]) + " files), testing_list.txt -> "
          "test (" + std::to_string(counts[2]) + "), every other word file -> train (" + std::to_string(counts[0]) +
          "); accuracy on test is the published metric",
      "classes: the word folders (sorted); _background_noise_ is the noise bank, never a class"};
  finish(out, "speechcommands", ctx.root);
  return out;
}

}  // namespace speechcommands

/// The Speech Commands layout (layout_list.cpp).
Layout speechcommands_layout() {
  return {"speechcommands",
          "Speech Commands v1/v2: word folders, validation_list.txt -> val, testing_list.txt -> test, groups by "
          "speaker, _background_noise_ as the noise bank",
          &speechcommands::scan};
}

}  // namespace melforge::builder::layouts
