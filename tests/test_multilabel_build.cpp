// Multi-label manifests: parsing, the `targets` matrix the builder writes, and the torch-free reader (issue 17).
#include <catch2/catch.hpp>

#include "build_fixture.h"
#include "clip_fixture.h"
#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "reader/split_info.h"
#include "scan.h"
#include "test_util.h"

namespace melforge_test_multilabel_build {

using melforge::test::TempDir;
using melforge::test::write_text;
namespace fs = std::filesystem;
namespace h5 = melforge::h5;
namespace builder = melforge::builder;
namespace data = melforge::data;

namespace {

/// The targets matrix of a split file, row-major, and its dims.
std::vector<uint8_t> read_targets(const fs::path& file, std::vector<int64_t>& dims) {
  auto f = h5::open_file(file);
  return h5::read_uint8_matrix(f, "targets", dims);
}

}  // namespace

TEST_CASE("manifest: several labels in one field, separated by semicolons", "[scan][csv][multilabel]") {
  TempDir d;
  write_text(d / "m.csv", "path,label,split\na.wav,dog;bark ; outdoor,train\nb.wav,\"cat;dog\",val\nc.wav,cat,test\n");
  const auto r = builder::scan_manifest(d / "m.csv");
  REQUIRE(r.files.size() == 3);
  CHECK(r.multilabel);
  CHECK(r.files[0].label == "dog");
  CHECK(r.files[0].labels == std::vector<std::string>{"dog", "bark", "outdoor"});
  CHECK(r.files[1].label == "cat");
  CHECK(r.files[1].labels == std::vector<std::string>{"cat", "dog"});
  CHECK(r.files[2].label == "cat");
  CHECK(r.files[2].labels.empty());

  write_text(d / "single.csv", "a.wav,dog\nb.wav,cat\n");
  CHECK_FALSE(builder::scan_manifest(d / "single.csv").multilabel);

  const auto [text, message] = GENERATE(table<std::string, std::string>({
      {"a.wav,dog;;bark\n", "m2.csv:1: empty label in 'dog;;bark'"},
      {"a.wav,dog;\n", "m2.csv:1: empty label in 'dog;'"},
      {"a.wav,;dog\n", "m2.csv:1: empty label in ';dog'"},
      {"a.wav,dog;bark;dog\n", "m2.csv:1: label 'dog' is listed twice in 'dog;bark;dog'"},
      {"a.wav, \n", "m2.csv:1: empty label"},
  }));
  CAPTURE(text);
  write_text(d / "m2.csv", text);
  CHECK_THROWS_WITH(builder::scan_manifest(d / "m2.csv"), Catch::Contains(message));
}

TEST_CASE("a multi-label manifest builds a targets matrix the reader returns, label is the first label",
          "[e2e][multilabel]") {
  TempDir d;
  std::string manifest = "path,label,split\n";
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"a0", "low;high"}, {"a1", "low"}, {"a2", "high;mid"}, {"a3", "mid;low;high"}, {"a4", "mid"}, {"a5", "high"}};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    melforge::test::write_tone(d / "in" / (rows[i].first + ".wav"), 300 + 100 * static_cast<double>(i), 9000, 8000);
    manifest += "in/" + rows[i].first + ".wav,\"" + rows[i].second + "\"," + (i < 4 ? "train" : "val") + "\n";
  }
  melforge::test::write_tone(d / "in/t.wav", 500, 9000, 8000);
  manifest += "in/t.wav,low,test\n";
  write_text(d / "m.csv", manifest);
  auto c = melforge::test::tone_build_config({}, d / "out");
  c.build.manifest = d / "m.csv";
  builder::run_build(c);

  const std::vector<std::string> classes = {"high", "low", "mid"};
  const std::vector<std::vector<uint8_t>> expect_train = {{1, 1, 0}, {0, 1, 0}, {1, 0, 1}, {1, 1, 1}};
  const std::vector<int64_t> expect_label = {1, 1, 0, 2};
  std::vector<int64_t> dims;
  const auto t = read_targets(d / "out/train.h5", dims);
  REQUIRE(dims == std::vector<int64_t>{4, 3});
  const auto split = melforge::test::read_split(d / "out/train.h5");
  CHECK(split.classes == classes);
  for (std::size_t f = 0; f < 4; ++f) {
    CAPTURE(f, split.path[f]);
    const auto row = static_cast<std::size_t>(split.path[f][4] - '0');
    CHECK(std::vector<uint8_t>(t.begin() + static_cast<long>(3 * f), t.begin() + static_cast<long>(3 * f + 3)) ==
          expect_train[row]);
    CHECK(split.label[f] == expect_label[row]);
  }

  const data::SplitInfo info = data::read_split_info(d / "out/train.h5", "train");
  CHECK(info.multilabel());
  CHECK(info.targets == t);
  const data::SplitInfo test = data::read_split_info(d / "out/test.h5", "test");
  CHECK(test.multilabel());
  CHECK(test.targets == std::vector<uint8_t>{0, 1, 0});
  auto f = h5::open_file(d / "out/train.h5");
  CHECK(h5::read_attribute_int64(f, "schema_version") == 3);
}

TEST_CASE("the reader reads a schema 1 file (no targets) and checks a damaged targets matrix", "[multilabel]") {
  const data::SplitInfo old = data::read_split_info(melforge::test::legacy_dataset(1) / "train.h5", "train");
  CHECK(old.schema_version == 1);
  CHECK_FALSE(old.multilabel());
  CHECK(old.targets.empty());

  TempDir d;
  melforge::test::write_tone_corpus(d / "in", 2, 3);
  builder::run_build(melforge::test::tone_build_config(d / "in", d / "out"));
  const fs::path train = d / "out/train.h5";
  {
    auto f = h5::open_file(train);
    CHECK_FALSE(h5::exists(f, "targets"));
  }
  const data::SplitInfo built = data::read_split_info(train, "train");
  CHECK_FALSE(built.multilabel());
  const int64_t files = built.files();
  REQUIRE(files > 1);

  SECTION("a matrix of the wrong shape") {
    auto f = h5::open_file(train, true);
    h5::write_uint8_matrix(f, "targets", files, 3, std::vector<uint8_t>(static_cast<std::size_t>(files * 3), 1));
    f.close();
    CHECK_THROWS_WITH(data::read_split_info(train, "train"),
                      Catch::Contains("targets has shape [" + std::to_string(files) + ", 3], expected [" +
                                      std::to_string(files) + ", 2]"));
  }
  SECTION("a value other than 0 or 1, a row without the file's label") {
    std::vector<uint8_t> m(static_cast<std::size_t>(files * 2), 0);
    for (int64_t r = 0; r < files; ++r) m[static_cast<std::size_t>(r * 2 + built.labels[r])] = 1;
    const bool two = GENERATE(true, false);
    if (two) m[1] = 2;
    else m[static_cast<std::size_t>(built.labels[0])] = 0;
    auto f = h5::open_file(train, true);
    h5::write_uint8_matrix(f, "targets", files, 2, m);
    f.close();
    CHECK_THROWS_WITH(data::read_split_info(train, "train"),
                      Catch::Contains(two ? "targets[0, 1] = 2 is not 0 or 1" : "targets row 0 lacks the file's label"));
  }
}

TEST_CASE("merge refuses multi-label shards", "[multilabel][merge]") {
  TempDir d;
  std::string manifest;
  for (int i = 0; i < 4; ++i) {
    melforge::test::write_tone(d / "in" / ("f" + std::to_string(i) + ".wav"), 300 + 100 * i, 9000, 8000);
    manifest += "in/f" + std::to_string(i) + ".wav," + (i % 2 ? "a;b" : "a") + ",train\n";
  }
  write_text(d / "m.csv", manifest);
  auto c = melforge::test::tone_build_config({}, d / "out");
  c.build.manifest = d / "m.csv";
  const auto dirs = melforge::test::build_shards(c, d / "shards", 2);
  CHECK_THROWS_WITH(melforge::test::merge_shards(dirs, d / "merged", false),
                    Catch::Contains("merging multi-label shards is not supported"));
}

}  // namespace melforge_test_multilabel_build
