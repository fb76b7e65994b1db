#include <catch2/catch.hpp>

#include "melforge/common/errors.h"
#include "scan.h"
#include "test_util.h"

using namespace melforge::builder;
using melforge::test::TempDir;
using melforge::test::write_text;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kExts = {"wav", "flac"};

bool has_skip(const ScanResult& r, const std::string& path, const std::string& reason_part) {
  for (const auto& s : r.skipped)
    if (s.path == path && s.reason.find(reason_part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("class-per-folder layout", "[scan]") {
  TempDir d;
  write_text(d / "dog/a.wav", "x");
  write_text(d / "dog/sub/b.WAV", "x");
  write_text(d / "cat/c.flac", "x");
  write_text(d / "cat/notes.txt", "x");
  write_text(d / "loose.wav", "x");
  fs::create_directories(d / "cat/x.wav");
  const auto r = scan_folder(d.path(), kExts);
  REQUIRE(r.files.size() == 3);
  CHECK_FALSE(r.presplit);
  CHECK(r.files[0].rel_path == "cat/c.flac");
  CHECK(r.files[0].label == "cat");
  CHECK(r.files[1].rel_path == "dog/a.wav");
  CHECK(r.files[2].rel_path == "dog/sub/b.WAV");
  CHECK(r.files[2].label == "dog");
  for (const auto& f : r.files) CHECK(f.split == -1);
  CHECK(has_skip(r, "cat/notes.txt", "extension"));
  CHECK(has_skip(r, "loose.wav", "not inside a class folder"));
  CHECK(has_skip(r, "cat/x.wav", "is a directory"));
}

TEST_CASE("pre-split layout", "[scan]") {
  TempDir d;
  write_text(d / "train/dog/a.wav", "x");
  write_text(d / "val/dog/b.wav", "x");
  write_text(d / "test/cat/c.wav", "x");
  const auto r = scan_folder(d.path(), kExts);
  REQUIRE(r.files.size() == 3);
  CHECK(r.presplit);
  CHECK(r.files[0].rel_path == "test/cat/c.wav");
  CHECK(r.files[0].split == 2);
  CHECK(r.files[0].label == "cat");
  CHECK(r.files[1].split == 0);
  CHECK(r.files[2].split == 1);
}

TEST_CASE("symbolic links: files followed, folders and loops listed", "[scan]") {
  TempDir d;
  write_text(d / "dog/a.wav", "x");
  fs::create_symlink(d / "dog/a.wav", d / "dog/link.wav");
  fs::create_symlink(d / "dog/loop1.wav", d / "dog/loop2.wav");
  fs::create_symlink(d / "dog/loop2.wav", d / "dog/loop1.wav");
  fs::create_symlink(d / "dog", d / "dog/self");
  fs::create_symlink(d / "dog/missing.wav", d / "dog/dangling.wav");
  const auto r = scan_folder(d.path(), kExts);
  REQUIRE(r.files.size() == 2);
  CHECK(r.files[1].rel_path == "dog/link.wav");
  CHECK(has_skip(r, "dog/loop1.wav", "broken symbolic link"));
  CHECK(has_skip(r, "dog/loop2.wav", "broken symbolic link"));
  CHECK(has_skip(r, "dog/dangling.wav", "broken symbolic link"));
  CHECK(has_skip(r, "dog/self", "folder"));
}

TEST_CASE("non-ASCII and spaces in names are kept as UTF-8", "[scan]") {
  TempDir d;
  write_text(d / "chien/été 1.wav", "x");
  const auto r = scan_folder(d.path(), kExts);
  REQUIRE(r.files.size() == 1);
  CHECK(r.files[0].rel_path == "chien/été 1.wav");
}

TEST_CASE("CSV parsing", "[scan][csv]") {
  CHECK(parse_csv_line("a,b,c") == std::vector<std::string>{"a", "b", "c"});
  CHECK(parse_csv_line("\"a,1\",b") == std::vector<std::string>{"a,1", "b"});
  CHECK(parse_csv_line("\"say \"\"hi\"\"\",x") == std::vector<std::string>{"say \"hi\"", "x"});
  CHECK(parse_csv_line("a,,") == std::vector<std::string>{"a", "", ""});
  CHECK_THROWS_AS(parse_csv_line("\"open,b"), melforge::FormatError);
}

TEST_CASE("manifest: header, relative paths, splits, errors", "[scan][csv]") {
  TempDir d;
  write_text(d / "m.csv", "path,label,split\r\nx/a.wav,dog,train\r\n\r\n/abs/b.wav,cat,\n\"x/c, d.wav\",cat,test\n");
  const auto r = scan_manifest(d / "m.csv");
  REQUIRE(r.files.size() == 3);
  CHECK(r.presplit);
  CHECK(r.files[0].rel_path == "/abs/b.wav");
  CHECK(r.files[0].path == fs::path("/abs/b.wav"));
  CHECK(r.files[0].split == -1);
  CHECK(r.files[1].path == d / "x/a.wav");
  CHECK(r.files[1].split == 0);
  CHECK(r.files[2].rel_path == "x/c, d.wav");
  CHECK(r.files[2].split == 2);

  const std::string bad = GENERATE(std::string("a.wav\n"), std::string("a.wav,\n"), std::string("a.wav,dog,holdout\n"),
                                   std::string("a.wav,dog,train,extra\n"), std::string(",dog\n"));
  write_text(d / "bad.csv", "a.wav,dog\n" + bad);
  try {
    scan_manifest(d / "bad.csv");
    FAIL("no error for: " << bad);
  } catch (const melforge::FormatError& e) {
    CHECK(std::string(e.what()).find("bad.csv:2") != std::string::npos);
  }
}

TEST_CASE("manifest duplicates are listed, not silently merged", "[scan][csv]") {
  TempDir d;
  write_text(d / "m.csv", "a.wav,dog\na.wav,cat\n");
  const auto r = scan_manifest(d / "m.csv");
  CHECK(r.files.size() == 1);
  REQUIRE(r.skipped.size() == 1);
  CHECK(r.skipped[0].reason.find("more than once") != std::string::npos);
}
