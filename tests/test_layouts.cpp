// Dataset layouts (issue 30, builder/layouts/): each layout scans a stand-in laid out exactly like the real dataset
// (tools/make_standin_datasets.py) and returns its protocol: files, splits, folds, groups, class order, noise bank,
// trial list; broken metadata is refused naming the file, line and field, and nothing is dropped silently.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "build_fixture.h"
#include "layouts/layout.h"
#include "pipeline.h"
#include "melforge/common/errors.h"
#include "melforge_test_paths.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace melforge;
using builder::InputFile;
using builder::ScanResult;
using builder::SkippedFile;
using builder::layouts::find_layout;
using builder::layouts::LayoutContext;

namespace melforge_test_layouts {

namespace {

/// Stand-in `name` (tools/make_standin_datasets.py), generated on first use, once per test process.
const fs::path& standin(const std::string& name) {
  static const test::TempDir dir;
  static std::map<std::string, fs::path> made;
  if (const auto it = made.find(name); it != made.end()) return it->second;
  const std::string cmd = std::string("/usr/bin/python3 ") + MELFORGE_TOOLS_DIR + "/make_standin_datasets.py " + name +
                          " '" + dir.path().string() + "' > '" + (dir / (name + ".log")).string() + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("make_standin_datasets.py failed: " + cmd);
  const fs::path out = dir / name;
  if (!fs::is_directory(out)) throw std::runtime_error("make_standin_datasets.py wrote no " + out.string());
  return made.emplace(name, out).first->second;
}

/// A copy of stand-in `name` in `dir`, to break.
fs::path copy_of(const std::string& name, const test::TempDir& dir) {
  const fs::path to = dir / name;
  fs::copy(standin(name), to, fs::copy_options::recursive);
  return to;
}

ScanResult scan(const std::string& layout, const fs::path& root) {
  LayoutContext context;
  context.root = root;
  context.extensions = {"wav", "flac"};
  return find_layout(layout).scan(context);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Replaces the first `from` in file `p` by `to`; throws when `from` is not there (a test that cannot fail).
void replace_in(const fs::path& p, const std::string& from, const std::string& to) {
  std::string text = read(p);
  const auto at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("'" + from + "' not in " + p.string());
  text.replace(at, from.size(), to);
  test::write_text(p, text);
}

std::map<int, int> count_by(const ScanResult& r, const std::function<int(const InputFile&)>& key) {
  std::map<int, int> counts;
  for (const auto& f : r.files) ++counts[key(f)];
  return counts;
}

/// Each group's files all in one split and one fold.
void check_groups_whole(const ScanResult& r) {
  std::map<std::string, std::set<std::pair<int, int>>> where;
  for (const auto& f : r.files) {
    REQUIRE_FALSE(f.group.empty());
    where[f.group].insert({f.split, f.fold});
  }
  for (const auto& [group, places] : where) {
    CAPTURE(group);
    CHECK(places.size() == 1);
  }
}

const SkippedFile* skipped(const ScanResult& r, const std::string& path) {
  for (const auto& s : r.skipped)
    if (s.path == path) return &s;
  return nullptr;
}

}  // namespace

TEST_CASE("every layout is found by its name in any case, an unknown one is refused naming --layout",
          "[layout][protocol]") {
  const std::vector<std::string> names{"esc50", "urbansound8k", "speechcommands", "fsd50k", "voxceleb1",
                                       "librispeech"};
  REQUIRE(builder::layouts::all_layouts().size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    CHECK(builder::layouts::all_layouts()[i].name == names[i]);
    CHECK(find_layout(names[i]).name == names[i]);
    std::string upper = names[i];
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
    CHECK(find_layout(upper).name == names[i]);
  }
  CHECK_THROWS_AS(find_layout("esc-50"), InvalidArgument);
  CHECK_THROWS_WITH(find_layout("audioset"), Catch::Contains("--layout") && Catch::Contains("urbansound8k"));
}

TEST_CASE("esc50: 5 folds from the fold column, classes in target order, groups by src_file", "[layout][protocol]") {
  const ScanResult r = scan("esc50", standin("esc50"));
  CHECK(r.layout == "esc50");
  CHECK_FALSE(r.open_set);
  REQUIRE(r.files.size() == 40);
  CHECK(r.folds == 5);
  CHECK(count_by(r, [](const InputFile& f) { return f.fold; }) == std::map<int, int>{{1, 8}, {2, 8}, {3, 8}, {4, 8},
                                                                                      {5, 8}});
  CHECK(count_by(r, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{-1, 40}});
  CHECK(r.class_order == std::vector<std::string>{"dog", "rooster", "rain", "chainsaw"});
  CHECK(r.files[0].rel_path == "audio/1-101000-A-0.wav");
  CHECK(r.files[0].label == "dog");
  CHECK(r.files[0].group == "101000");
  check_groups_whole(r);
  std::set<std::string> groups;
  for (const auto& f : r.files) groups.insert(f.group);
  CHECK(groups.size() == 20);
  CHECK(r.skipped.empty());
  CHECK(r.warnings.empty());
  CHECK_FALSE(r.protocol_notes.empty());
}

TEST_CASE("urbansound8k: 10 folds checked against audio/fold<k>/, classes in classID order, groups by fsID",
          "[layout][protocol]") {
  const ScanResult r = scan("urbansound8k", standin("urbansound8k"));
  REQUIRE(r.files.size() == 60);
  CHECK(r.folds == 10);
  const auto folds = count_by(r, [](const InputFile& f) { return f.fold; });
  CHECK(folds.size() == 10);
  CHECK(std::all_of(folds.begin(), folds.end(), [](const auto& kv) { return kv.second == 6; }));
  CHECK(r.class_order == std::vector<std::string>{"car_horn", "dog_bark", "siren"});
  for (const auto& f : r.files) {
    CAPTURE(f.rel_path);
    CHECK(f.rel_path.starts_with("audio/fold" + std::to_string(f.fold) + "/" + f.group + "-"));
  }
  check_groups_whole(r);
  CHECK(r.hidden == std::vector<std::string>{"audio/fold1/.DS_Store"});
  CHECK(r.skipped.empty());
}

TEST_CASE("speechcommands: the given lists as val and test, speakers as groups, _background_noise_ as the noise bank",
          "[layout][protocol]") {
  const fs::path root = standin("speechcommands");
  const ScanResult r = scan("speechcommands", root);
  REQUIRE(r.files.size() == 48);
  CHECK(r.presplit);
  CHECK(count_by(r, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{0, 32}, {1, 8}, {2, 8}});
  std::set<std::string> labels, speakers;
  for (const auto& f : r.files) {
    labels.insert(f.label);
    speakers.insert(f.group);
  }
  CHECK(labels == std::set<std::string>{"down", "no", "up", "yes"});
  CHECK(speakers.size() == 6);
  check_groups_whole(r);
  CHECK(r.noise_bank == root / "_background_noise_");
  for (const char* noise : {"_background_noise_/white_noise.wav", "_background_noise_/pink_noise.wav"}) {
    CAPTURE(noise);
    const SkippedFile* s = skipped(r, noise);
    REQUIRE(s != nullptr);
    CHECK_THAT(s->reason, Catch::Contains("noise bank") && Catch::Contains("not a class"));
  }
  REQUIRE(skipped(r, "_background_noise_/README.md") != nullptr);
  CHECK(r.skipped.size() == 3);
  CHECK(r.warnings.empty());
}

TEST_CASE("fsd50k: dev split column, eval as test, vocabulary order, every label of a row", "[layout][protocol]") {
  const ScanResult r = scan("fsd50k", standin("fsd50k"));
  REQUIRE(r.files.size() == 48);
  CHECK(r.multilabel);
  CHECK(count_by(r, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{0, 27}, {1, 9}, {2, 12}});
  CHECK(r.class_order == std::vector<std::string>{"Bark", "Meow", "Dog", "Cat", "Animal", "Guitar", "Music"});
  const auto bark = std::find_if(r.files.begin(), r.files.end(), [](const InputFile& f) { return f.label == "Bark"; });
  REQUIRE(bark != r.files.end());
  CHECK(bark->labels == std::vector<std::string>{"Bark", "Dog", "Animal"});
  CHECK(bark->rel_path.starts_with("FSD50K.dev_audio/"));
  CHECK(r.files.back().rel_path.starts_with("FSD50K.eval_audio/"));
  CHECK(r.files.back().split == 2);
  CHECK(r.skipped.empty());
}

TEST_CASE("voxceleb1: the trial list's speakers as test, paths relative to wav/, a held-out video per speaker as val",
          "[layout][protocol]") {
  const fs::path root = standin("voxceleb1");
  const ScanResult r = scan("voxceleb1", root);
  REQUIRE(r.files.size() == 60);
  CHECK(r.trials == root / "veri_test2.txt");
  CHECK(r.open_set);
  CHECK(count_by(r, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{0, 24}, {1, 12}, {2, 24}});
  std::map<int, std::set<std::string>> speakers;
  for (const auto& f : r.files) {
    speakers[f.split].insert(f.label);
    CHECK(f.rel_path.starts_with(f.label + "/"));
    CHECK(f.group == fs::path(f.rel_path).parent_path().generic_string());
  }
  CHECK(speakers[2] == std::set<std::string>{"id10270", "id10271", "id10272", "id10273"});
  CHECK(speakers[0] == speakers[1]);
  CHECK(speakers[0].size() == 6);
  check_groups_whole(r);
  std::istringstream trials(read(root / "veri_test2.txt"));
  std::string label, a, b;
  std::set<std::string> paths;
  for (const auto& f : r.files) paths.insert(f.rel_path);
  while (trials >> label >> a >> b) CHECK((paths.contains(a) && paths.contains(b)));
}

TEST_CASE("voxceleb1: the dev and test archives unzipped apart, and vox1_meta.csv without a trial list",
          "[layout][protocol]") {
  using Parts = std::pair<std::string, std::string>;
  const Parts parts = GENERATE(Parts{"vox1_dev_wav/wav", "vox1_test_wav/wav"}, Parts{"dev/wav", "test/wav"});
  const std::string& dev = parts.first;
  const std::string& test_part = parts.second;
  CAPTURE(dev);
  test::TempDir d;
  const fs::path root = copy_of("voxceleb1", d);
  fs::create_directories(root / dev);
  fs::create_directories(root / test_part);
  std::vector<fs::path> speakers;
  for (const auto& e : fs::directory_iterator(root / "wav")) speakers.push_back(e.path());
  for (const auto& p : speakers)
    fs::rename(p, root / (p.filename().string() >= "id10270" ? test_part : dev) / p.filename());
  fs::remove(root / "wav");
  const ScanResult split = scan("voxceleb1", root);
  const ScanResult merged = scan("voxceleb1", standin("voxceleb1"));
  REQUIRE(split.files.size() == merged.files.size());
  for (std::size_t i = 0; i < split.files.size(); ++i) {
    CHECK(split.files[i].rel_path == merged.files[i].rel_path);
    CHECK(split.files[i].split == merged.files[i].split);
  }
  fs::remove(root / "veri_test2.txt");
  const ScanResult meta = scan("voxceleb1", root);
  CHECK(meta.trials.empty());
  CHECK(count_by(meta, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{0, 24}, {1, 12}, {2, 24}});
  CHECK_THAT(meta.warnings.at(0), Catch::Contains("vox1_meta.csv"));
}

TEST_CASE("librispeech: speakers as classes, chapters as groups, subsets as splits, or one subset folder",
          "[layout][protocol]") {
  const fs::path root = standin("librispeech");
  const ScanResult r = scan("librispeech", root);
  REQUIRE(r.files.size() == 72);
  CHECK(r.presplit);
  CHECK(r.open_set);
  CHECK(count_by(r, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{0, 36}, {1, 18}, {2, 18}});
  std::set<std::string> speakers, chapters;
  std::map<std::string, std::set<int>> splits_of;
  for (const auto& f : r.files) {
    speakers.insert(f.label);
    chapters.insert(f.group);
    splits_of[f.label].insert(f.split);
    CHECK(f.split == (f.rel_path.starts_with("train-") ? 0 : f.rel_path.starts_with("dev-") ? 1 : 2));
  }
  for (const auto& [spk, splits] : splits_of) CHECK(splits.size() == 1);
  CHECK(speakers.size() == 8);
  CHECK(chapters.size() == 24);
  CHECK(std::any_of(r.files.begin(), r.files.end(),
                    [](const InputFile& f) { return f.rel_path == "train-clean-100/19/290/19-290-0000.flac"; }));
  CHECK(r.skipped.empty());
  const ScanResult one = scan("librispeech", root / "train-clean-100");
  REQUIRE(one.files.size() == 36);
  CHECK_FALSE(one.presplit);
  CHECK_FALSE(one.open_set);
  CHECK(count_by(one, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{-1, 36}});
  test::TempDir d;
  const fs::path train_only = copy_of("librispeech", d);
  fs::remove_all(train_only / "dev-clean");
  fs::remove_all(train_only / "test-clean");
  const ScanResult role = scan("librispeech", train_only);
  CHECK_FALSE(role.presplit);
  CHECK(count_by(role, [](const InputFile& f) { return f.split; }) == std::map<int, int>{{-1, 36}});
  CHECK(role.files[0].rel_path == "train-clean-100/19/290/19-290-0000.flac");
  CHECK(one.files[0].rel_path == "19/290/19-290-0000.flac");
  CHECK(one.files[0].group == "19/290");
}

TEST_CASE("a file on disk missing from the metadata and a metadata row whose file is missing are both listed",
          "[layout][protocol]") {
  test::TempDir d;
  const fs::path root = copy_of("esc50", d);
  fs::copy_file(root / "audio/1-101000-A-0.wav", root / "audio/9-999-A-0.wav");
  fs::remove(root / "audio/2-102000-B-0.wav");
  const ScanResult r = scan("esc50", root);
  CHECK(r.files.size() == 39);
  REQUIRE(skipped(r, "audio/9-999-A-0.wav") != nullptr);
  CHECK_THAT(skipped(r, "audio/9-999-A-0.wav")->reason, Catch::Contains("not listed in meta/esc50.csv"));
  REQUIRE(skipped(r, "audio/2-102000-B-0.wav") != nullptr);
  CHECK_THAT(skipped(r, "audio/2-102000-B-0.wav")->reason, Catch::Contains("line") && Catch::Contains("not found"));
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Catch::Contains("1 file(s) listed in meta/esc50.csv were not found"));
  std::vector<fs::path> fold3;
  for (const auto& e : fs::directory_iterator(root / "audio"))
    if (e.path().filename().string().starts_with("3-")) fold3.push_back(e.path());
  for (const auto& p : fold3) fs::remove(p);
  const ScanResult partial = scan("esc50", root);
  CHECK(partial.files.size() == 31);
  REQUIRE(partial.warnings.size() == 2);
  CHECK_THAT(partial.warnings[1], Catch::Contains("fold(s) 3 of 5 hold no file"));
}

namespace {

/// A way to break a stand-in and the refusal it must meet.
struct Refusal {
  std::string layout, name;
  std::function<void(const fs::path&)> damage;
  std::string message;
};

std::vector<Refusal> refusals() {
  const auto edit = [](std::string file, std::string from, std::string to) {
    return [=](const fs::path& root) { replace_in(root / file, from, to); };
  };
  return {
      {"esc50", "no fold column", edit("meta/esc50.csv", "filename,fold,", "filename,fld,"), "no column 'fold'"},
      {"esc50", "fold out of range", edit("meta/esc50.csv", "A-0.wav,1,0", "A-0.wav,6,0"),
       "meta/esc50.csv:2: field 'fold' is '6', expected an integer in [1, 5]"},
      {"esc50", "a target naming two classes", edit("meta/esc50.csv", ",0,dog,", ",0,cat,"), "index 0 names class"},
      {"esc50", "no metadata", [](const fs::path& root) { fs::remove(root / "meta/esc50.csv"); }, "does not exist"},
      {"urbansound8k", "a file in the wrong fold folder",
       [](const fs::path& root) {
         fs::rename(root / "audio/fold1/7101-1-0-0.wav", root / "audio/fold2/7101-1-0-0.wav");
       },
       "UrbanSound8K.csv:2: '7101-1-0-0.wav' has fold 1, but the file is in 'audio/fold2/'"},
      {"urbansound8k", "no classID column", edit("metadata/UrbanSound8K.csv", "classID", "class_id"),
       "no column 'classid'"},
      {"speechcommands", "no testing list", [](const fs::path& root) { fs::remove(root / "testing_list.txt"); },
       "testing_list.txt' does not exist"},
      {"speechcommands", "a file in both lists",
       [](const fs::path& root) {
         std::ofstream(root / "testing_list.txt", std::ios::app) << "down/2aca1e72_nohash_0.wav\n";
         std::ofstream(root / "validation_list.txt", std::ios::app) << "down/2aca1e72_nohash_0.wav\n";
       },
       "testing_list.txt:9: 'down/2aca1e72_nohash_0.wav' is also listed in validation_list.txt line 9"},
      {"fsd50k", "a label outside the vocabulary", edit("FSD50K.ground_truth/eval.csv", "\"Bark,", "\"Woof,"),
       "eval.csv:2: label 'Woof' is not in FSD50K.ground_truth/vocabulary.csv"},
      {"fsd50k", "no split column", edit("FSD50K.ground_truth/dev.csv", "mids,split", "mids,set"),
       "no column 'split'"},
      {"fsd50k", "a vocabulary index twice", edit("FSD50K.ground_truth/vocabulary.csv", "1,Meow", "0,Meow"),
       "vocabulary.csv:2: index 0 names class 'Meow'"},
      {"voxceleb1", "a trial naming a missing file", edit("veri_test2.txt", "/00002.wav", "/00009.wav"),
       "veri_test2.txt:1: 'id10270/"},
      {"voxceleb1", "a trial with a bad label", edit("veri_test2.txt", "1 id10270", "2 id10270"),
       "veri_test2.txt:1: expected '<1|0>"},
      {"librispeech", "no subset folder",
       [](const fs::path& root) {
         for (const char* s : {"train-clean-100", "dev-clean", "test-clean"})
           fs::rename(root / s, root / (std::string("x") + s));
       },
       "holds no subset folder"},
  };
}

/// Every refusal of `layout`, each on a fresh copy of its stand-in: a FormatError whose message names the place.
void check_refusals(const std::string& layout) {
  int n = 0;
  for (const Refusal& c : refusals()) {
    if (c.layout != layout) continue;
    ++n;
    CAPTURE(c.name);
    test::TempDir d;
    const fs::path root = copy_of(c.layout, d);
    c.damage(root);
    CHECK_THROWS_AS(scan(c.layout, root), FormatError);
    CHECK_THROWS_WITH(scan(c.layout, root), Catch::Contains(c.message));
  }
  CHECK(n >= 1);
}

}  // namespace

TEST_CASE("esc50: broken metadata is refused naming the file, line and field", "[layout][protocol]") {
  check_refusals("esc50");
}

TEST_CASE("urbansound8k: broken metadata is refused naming the file, line and field", "[layout][protocol]") {
  check_refusals("urbansound8k");
}

TEST_CASE("speechcommands: broken metadata is refused naming the file, line and field", "[layout][protocol]") {
  check_refusals("speechcommands");
}

TEST_CASE("fsd50k: broken metadata is refused naming the file, line and field", "[layout][protocol]") {
  check_refusals("fsd50k");
}

TEST_CASE("voxceleb1: broken metadata is refused naming the file, line and field", "[layout][protocol]") {
  check_refusals("voxceleb1");
}

TEST_CASE("librispeech: broken metadata is refused naming the file, line and field", "[layout][protocol]") {
  check_refusals("librispeech");
}

namespace {

/// A quiet CPU build of stand-in `root` with `layout`, at the stand-ins' 16 kHz (tone_build_config otherwise).
builder::BuildConfig layout_build_config(const std::string& layout, const fs::path& root, const fs::path& out,
                                         const std::string& extensions) {
  builder::BuildConfig c = test::tone_build_config(root, out);
  c.mel.sample_rate = 16000;
  c.mel.n_fft = 512;
  c.mel.win_length = 512;
  c.mel.hop_length = 256;
  c.build.layout = layout;
  c.build.extensions = extensions;
  return c;
}

}  // namespace

TEST_CASE("a voxceleb1 build installs its trial list as trials.txt, so does a merge of its shards, and a later build "
          "without one removes it",
          "[layout][protocol][e2e]") {
  test::TempDir d;
  const fs::path root = standin("voxceleb1");
  builder::BuildConfig c = layout_build_config("voxceleb1", root, d / "out", "wav");
  const nlohmann::json report = builder::run_build(c).report;
  CHECK(report["protocol"]["trials"] == "trials.txt");
  CHECK(read(d / "out" / "trials.txt") == read(root / "veri_test2.txt"));
  for (const auto& w : report["warnings"]) CHECK_THAT(w.get<std::string>(), !Catch::Contains("no training file"));
  std::vector<fs::path> shards;
  for (const std::string shard : {"1/2", "2/2"}) {
    builder::BuildConfig part = c;
    part.build.shard = shard;
    part.build.output = d / ("shard" + shard.substr(0, 1));
    builder::run_build(part);
    shards.push_back(part.build.output);
  }
  const nlohmann::json merged = test::merge_shards(shards, d / "merged", false);
  CHECK(merged["protocol"]["trials"] == "trials.txt");
  CHECK(read(d / "merged" / "trials.txt") == read(root / "veri_test2.txt"));
  fs::remove(shards[1] / "trials.txt");
  CHECK_THROWS_WITH(test::merge_shards(shards, d / "merged2", false), Catch::Contains("trials.txt differs"));
  c.build.layout = "esc50";
  c.build.input = standin("esc50");
  c.build.overwrite = true;
  const nlohmann::json again = builder::run_build(c).report;
  CHECK(again["protocol"]["trials"].is_null());
  CHECK_FALSE(fs::exists(d / "out" / "trials.txt"));
  CHECK(fs::exists(d / "out" / "test.h5"));
}

TEST_CASE("one librispeech subset: chapters too few for the ratios say so and name --split-by class, which fills "
          "every split",
          "[layout][protocol][e2e]") {
  test::TempDir d;
  builder::BuildConfig c =
      layout_build_config("librispeech", standin("librispeech") / "train-clean-100", d / "grouped", "flac");
  c.build.split = "0.8,0.1,0.1";
  const nlohmann::json grouped = builder::run_build(c).report;
  CHECK(grouped["files"]["per_split"]["val"] == 0);
  bool said = false;
  for (const auto& w : grouped["warnings"])
    said = said || (w.get<std::string>().find("val is empty: too few groups per class") != std::string::npos &&
                    w.get<std::string>().find("--split-by class") != std::string::npos);
  CHECK(said);
  c.build.output = d / "by_class";
  c.build.split_by = builder::SplitBy::class_;
  c.build.split = "0.5,0.25,0.25";
  const nlohmann::json by_class = builder::run_build(c).report;
  for (const char* split : {"train", "val", "test"}) CHECK(by_class["files"]["per_split"][split].get<int>() > 0);
}

}  // namespace melforge_test_layouts
