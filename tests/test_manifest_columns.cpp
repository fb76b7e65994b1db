// Manifests with named columns (--columns, --label-sep, --audio-root, --classes), laid out like the metadata public
// datasets ship (FSD50K's dev.csv and vocabulary.csv, ESC-50's esc50.csv, UrbanSound8K's metadata CSV), and their
// errors (issue 30).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "build_options.h"
#include "melforge/common/errors.h"
#include "scan.h"
#include "test_util.h"

namespace melforge_test_manifest_columns {

using melforge::test::TempDir;
using melforge::test::write_text;
namespace fs = std::filesystem;
namespace builder = melforge::builder;

namespace {

/// An FSD50K-like ground truth: FSD50K.ground_truth/dev.csv (fname without extension, labels a quoted comma list,
/// mids, split) and vocabulary.csv (index,label,mid; no header); FSD50K.dev_audio/<fname>.wav.
void write_fsd50k(const fs::path& root) {
  write_text(root / "FSD50K.ground_truth/dev.csv",
             "fname,labels,mids,split\n"
             "64760,\"Electric_guitar,Guitar,Music\",\"/m/02sgy,/m/0342h,/m/04rlf\",train\n"
             "16399,\"Bark,Dog\",\"/m/05tny_,/m/0bt9lr\",train\n"
             "3399,Dog,/m/0bt9lr,val\n");
  write_text(root / "FSD50K.ground_truth/vocabulary.csv",
             "0,Music,/m/04rlf\n1,Dog,/m/0bt9lr\n2,Bark,/m/05tny_\n3,Guitar,/m/0342h\n4,Electric_guitar,/m/02sgy\n"
             "5,Whale_vocalization,/m/032n05\n");
  for (const char* f : {"64760", "16399", "3399"})
    write_text(root / "FSD50K.dev_audio" / (std::string(f) + ".wav"), "");
}

/// Scan options for the FSD50K-like tree of write_fsd50k.
builder::ManifestOptions fsd50k_options(const fs::path& root) {
  builder::ManifestOptions o;
  o.columns = builder::parse_columns("path=fname, label=labels, split=split");
  o.label_sep = ',';
  o.audio_root = root / "FSD50K.dev_audio";
  o.classes_name = (root / "FSD50K.ground_truth/vocabulary.csv").string();
  o.classes = builder::read_class_list(o.classes_name);
  return o;
}

}  // namespace

TEST_CASE("melforge-build --columns reads FSD50K's dev.csv: quoted comma labels, fname without extension, "
          "vocabulary order",
          "[protocol][scan][csv]") {
  TempDir d;
  write_fsd50k(d.path());
  const auto o = fsd50k_options(d.path());
  CHECK(o.classes == std::vector<std::string>{"Music", "Dog", "Bark", "Guitar", "Electric_guitar",
                                              "Whale_vocalization"});
  const auto r = builder::scan_manifest(d / "FSD50K.ground_truth/dev.csv", o);
  REQUIRE(r.files.size() == 3);
  CHECK(r.multilabel);
  CHECK(r.class_order == o.classes);
  // Sorted by stored path: 16399.wav, 3399.wav, 64760.wav.
  CHECK(r.files[0].rel_path == "16399.wav");
  CHECK(r.files[0].path == d / "FSD50K.dev_audio/16399.wav");
  CHECK(r.files[0].labels == std::vector<std::string>{"Bark", "Dog"});
  CHECK(r.files[0].split == 0);
  CHECK(r.files[1].rel_path == "3399.wav");
  CHECK(r.files[1].label == "Dog");
  CHECK(r.files[1].labels.empty());
  CHECK(r.files[1].split == 1);
  CHECK(r.files[2].labels == std::vector<std::string>{"Electric_guitar", "Guitar", "Music"});
  CHECK(r.files[2].fold == 0);
  CHECK(r.folds == 0);
}

TEST_CASE("melforge-build --columns reads ESC-50's esc50.csv: fold and src_file columns", "[protocol][scan][csv]") {
  TempDir d;
  std::string csv = "filename,fold,target,category,esc10,src_file,take\n";
  for (int i = 0; i < 10; ++i) {
    const int fold = i % 5 + 1;
    const std::string src = std::to_string(100000 + i / 2);
    const std::string name = std::to_string(fold) + "-" + src + "-" + (i % 2 ? "B" : "A") + "-" + std::to_string(i % 3);
    csv += name + ".wav," + std::to_string(fold) + "," + std::to_string(i % 3) + "," +
           std::vector<std::string>{"dog", "rooster", "rain"}[static_cast<std::size_t>(i % 3)] + ",True," + src + "," +
           (i % 2 ? "B" : "A") + "\n";
  }
  write_text(d / "meta/esc50.csv", csv);
  fs::create_directories(d / "audio");
  builder::ManifestOptions o;
  o.columns = builder::parse_columns("path=filename,label=category,fold=fold,group=src_file");
  o.audio_root = d / "audio";
  const auto r = builder::scan_manifest(d / "meta/esc50.csv", o);
  REQUIRE(r.files.size() == 10);
  CHECK(r.folds == 5);
  CHECK(r.group_by == "column src_file");
  for (const auto& f : r.files) {
    CAPTURE(f.rel_path);
    CHECK(f.fold == f.rel_path[0] - '0');
    CHECK(f.group == f.rel_path.substr(2, 6));
    CHECK(f.path == d / "audio" / f.rel_path);
    CHECK(f.split == -1);
  }
}

TEST_CASE("melforge-build --group-by naming a header column of UrbanSound8K's CSV groups by fsID, known names "
          "fold and group",
          "[protocol][scan][csv]") {
  TempDir d;
  write_text(d / "metadata/UrbanSound8K.csv",
             "slice_file_name,fsID,start,end,salience,fold,classID,class\n"
             "100032-3-0-0.wav,100032,0.0,0.317551,1,5,3,dog_bark\n"
             "100263-2-0-117.wav,100263,58.5,62.5,1,5,2,children_playing\n"
             "100263-2-0-121.wav,100263,60.5,64.5,1,5,2,children_playing\n"
             "100648-1-0-0.wav,100648,4.823402,5.471927,2,10,1,car_horn\n");
  builder::ManifestOptions o;
  o.columns = builder::parse_columns("path=slice_file_name,label=class,fold=fold");
  o.group_by = "fsID";
  const auto r = builder::scan_manifest(d / "metadata/UrbanSound8K.csv", o);
  REQUIRE(r.files.size() == 4);
  CHECK(r.folds == 10);
  CHECK(r.group_by == "column fsID");
  CHECK(r.files[1].group == "100263");
  CHECK(r.files[2].group == "100263");
  CHECK(r.files[3].fold == 10);

  // Without --columns: a header of known names only (path, label, fold, group) is read by name, in any order.
  write_text(d / "known.csv", "fold,path,group,label\n2,a.wav,s1,dog\n1,b.wav,s2,cat\n");
  const auto k = builder::scan_manifest(d / "known.csv");
  REQUIRE(k.files.size() == 2);
  CHECK(k.files[0].fold == 2);
  CHECK(k.files[0].group == "s1");
  CHECK(k.files[1].label == "cat");
  CHECK(k.folds == 2);
}

TEST_CASE("melforge-build --classes: one name a line or a vocabulary CSV, errors name the file and "
          "line", "[protocol][scan]") {
  TempDir d;
  write_text(d / "plain.txt", "\xef\xbb\xbf" "zebra\n  apple \n\nmango\r\n");
  CHECK(builder::read_class_list(d / "plain.txt") == std::vector<std::string>{"zebra", "apple", "mango"});
  write_text(d / "vocab.csv", "0,Zebra,/m/1\n1,\"Apple, red\",/m/2\n2,Mango,/m/3\n");
  CHECK(builder::read_class_list(d / "vocab.csv") == std::vector<std::string>{"Zebra", "Apple, red", "Mango"});

  const auto [text, message] = GENERATE(table<std::string, std::string>({
      {"dog\ncat\ndog\n", "bad.txt:3: class 'dog' is listed twice (first on line 1)"},
      {"0,dog,/m/1\ncat\n", "bad.txt:2: expected index,label,mid"},
      {"\n\n", "the classes file names no class"},
      {"0, ,/m/1\n", "bad.txt:1: empty class name"},
  }));
  CAPTURE(text);
  write_text(d / "bad.txt", text);
  CHECK_THROWS_AS(builder::read_class_list(d / "bad.txt"), melforge::FormatError);
  CHECK_THROWS_WITH(builder::read_class_list(d / "bad.txt"), Catch::Contains(message));
}

TEST_CASE("manifest column errors: a missing column, a label not in the classes, a bad fold", "[protocol][scan][csv]") {
  TempDir d;
  write_fsd50k(d.path());
  auto o = fsd50k_options(d.path());
  const fs::path dev = d / "FSD50K.ground_truth/dev.csv";

  SECTION("a column the header lacks is an InvalidArgument naming --columns and the header's columns") {
    o.columns = builder::parse_columns("path=fname,label=labels,split=subset");
    CHECK_THROWS_AS(builder::scan_manifest(dev, o), melforge::InvalidArgument);
    CHECK_THROWS_WITH(builder::scan_manifest(dev, o),
                      Catch::Contains("--columns split=subset") && Catch::Contains("fname, labels, mids, split"));
  }
  SECTION("a label outside --classes names the manifest line and the label") {
    o.classes = {"Music", "Dog", "Guitar", "Electric_guitar"};
    CHECK_THROWS_AS(builder::scan_manifest(dev, o), melforge::FormatError);
    CHECK_THROWS_WITH(builder::scan_manifest(dev, o),
                      Catch::Contains("dev.csv:3: label 'Bark' is not in the classes file"));
  }
  SECTION("bad folds name the line") {
    const auto [fold, message] = GENERATE(table<std::string, std::string>({
        {"0", "m.csv:3: fold 0: folds are numbered from 1"},
        {"x", "m.csv:3: fold 'x' is not an integer 1..1000"},
        {"-1", "m.csv:3: fold '-1' is not an integer"},
        {"1001", "m.csv:3: fold 1001 is above 1000"},
    }));
    CAPTURE(fold);
    write_text(d / "m.csv", "file,class,fold\na.wav,dog,1\nb.wav,cat," + fold + "\n");
    CHECK_THROWS_AS(builder::scan_manifest(d / "m.csv"), melforge::FormatError);
    CHECK_THROWS_WITH(builder::scan_manifest(d / "m.csv"), Catch::Contains(message));
  }
  SECTION("a row with another field count than the header names the line") {
    write_text(d / "w.csv", "fname,labels,split\na.wav,dog,train\nb.wav,cat\n");
    o.columns = builder::parse_columns("path=fname,label=labels");
    o.classes.clear();
    CHECK_THROWS_WITH(builder::scan_manifest(d / "w.csv", o),
                      Catch::Contains("w.csv:3: expected 3 fields (as the header row), got 2"));
  }
}

TEST_CASE("melforge-build --columns spec errors name --columns", "[protocol][scan]") {
  const auto [spec, message] = GENERATE(table<std::string, std::string>({
      {"path=a,label=b,speaker=c", "unknown key 'speaker'"},
      {"path=a,path=b,label=c", "key 'path' is given twice"},
      {"label=b", "must name the path and label columns"},
      {"path=a,label=a", "column 'a' is named for both path and label"},
      {"path=,label=b", "path= names no column"},
  }));
  CAPTURE(spec);
  CHECK_THROWS_AS(builder::parse_columns(spec), melforge::InvalidArgument);
  CHECK_THROWS_WITH(builder::parse_columns(spec), Catch::StartsWith("--columns") && Catch::Contains(message));
  const auto ok = builder::parse_columns(" path = fname , label=labels,fold=fold,group=src_file ");
  CHECK(ok.path == "fname");
  CHECK(ok.label == "labels");
  CHECK(ok.fold == "fold");
  CHECK(ok.group == "src_file");
  CHECK(ok.split.empty());
}

TEST_CASE("protocol flags are checked before any work", "[protocol][options]") {
  TempDir d;
  write_text(d / "m.csv", "a.wav,dog\n");
  fs::create_directories(d / "in");
  builder::BuildOptions o;
  o.output = d / "out";
  const auto [setup, message] = GENERATE(table<int, std::string>({
      {0, "--columns applies to a --manifest CSV"},
      {1, "--label-sep: ';;' must be one character"},
      {2, "--folds: 1 is outside 2..100"},
      {3, "--layout 'nosuch' is not a known dataset layout"},
      {4, "--layout 'nosuch' is not a known dataset layout"},
      {5, "--group-by: '([' is not a valid regular expression"},
      {6, "--group-by and --columns group=g both name the groups"},
      {7, "--audio-root: "},
      {8, "--classes: "},
  }));
  CAPTURE(setup);
  switch (setup) {
    case 0: o.input = d / "in"; o.columns = "path=a,label=b"; break;
    case 1: o.manifest = d / "m.csv"; o.label_sep = ";;"; break;
    case 2: o.input = d / "in"; o.folds = 1; break;
    case 3: o.input = d / "in"; o.layout = "nosuch"; break;
    case 4: o.manifest = d / "m.csv"; o.columns = "path=a,label=b"; o.layout = "nosuch"; break;
    case 5: o.input = d / "in"; o.group_by = "(["; break;
    case 6: o.manifest = d / "m.csv"; o.columns = "path=a,label=b,group=g"; o.group_by = "src"; break;
    case 7: o.manifest = d / "m.csv"; o.audio_root = d / "missing"; break;
    default: o.input = d / "in"; o.classes = d / "missing.txt"; break;
  }
  CHECK_THROWS_AS(o.validate(), melforge::InvalidArgument);
  CHECK_THROWS_WITH(o.validate(), Catch::Contains(message));
}

}  // namespace melforge_test_manifest_columns
