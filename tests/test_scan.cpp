#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/stat.h>

#include <sstream>

#include "melforge/common/errors.h"
#include "reliability/child_process.h"
#include "scan.h"
#include "test_skip.h"
#include "test_util.h"

namespace melforge_test_scan {

using namespace melforge::builder;
using melforge::test::TempDir;
using melforge::test::write_text;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kExts = {"wav", "flac"};
constexpr uid_t kNobody = 65534;

bool has_skip(const ScanResult& r, const std::string& path, const std::string& reason_part) {
  for (const auto& s : r.skipped)
    if (s.path == path && s.reason.find(reason_part) != std::string::npos) return true;
  return false;
}

std::vector<std::string> rel_paths(const ScanResult& r) {
  std::vector<std::string> out;
  for (const auto& f : r.files) out.push_back(f.rel_path);
  return out;
}

/// `r` as text, one line per file ("F rel label split") and skipped entry ("S path: reason"), for run_in_child.
std::string to_text(const ScanResult& r) {
  std::ostringstream o;
  for (const auto& f : r.files) o << "F\t" << f.rel_path << '\t' << f.label << '\t' << f.split << '\n';
  for (const auto& s : r.skipped) o << "S\t" << s.path << '\t' << s.reason << '\n';
  return o.str();
}

/// Parses to_text's lines back (labels and splits of files are kept).
ScanResult from_text(const std::string& text) {
  ScanResult r;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
    if (f.size() == 4 && f[0] == "F") r.files.push_back({f[1], f[1], f[2], std::stoi(f[3]), {}, 0, {}});
    if (f.size() == 3 && f[0] == "S") r.skipped.push_back({f[1], f[2], "scan"});
  }
  return r;
}

/// Number of file descriptors open in this process.
int open_fds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n - 1;
}

/// root/c/d1/.../dN, with one WAV in c and in every dN; returns the files' paths relative to root.
std::vector<std::string> write_nested(const fs::path& root, int depth) {
  std::vector<std::string> files;
  std::string dir = "c";
  for (int i = 0; i <= depth; ++i) {
    if (i > 0) dir += "/d" + std::to_string(i);
    write_text(root / dir / "f.wav", "x");
    files.push_back(dir + "/f.wav");
  }
  std::sort(files.begin(), files.end());
  return files;
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

TEST_CASE("pre-split layout: hidden folders ignored, validation and valid are val", "[scan][presplit]") {
  TempDir d;
  write_text(d / "train/dog/a.wav", "x");
  const std::string val = GENERATE(std::string("val"), std::string("validation"), std::string("valid"));
  write_text(d / val / "dog/b.wav", "x");
  write_text(d / ".ipynb_checkpoints/x.wav", "x");
  write_text(d / "README.txt", "x");
  const auto r = scan_folder(d.path(), kExts);
  REQUIRE(r.files.size() == 2);
  CHECK(r.presplit);
  CHECK(r.files[0].split == 0);
  CHECK(r.files[0].label == "dog");
  CHECK(r.files[1].rel_path == val + "/dog/b.wav");
  CHECK(r.files[1].split == 1);
  CHECK(r.hidden == std::vector<std::string>{".ipynb_checkpoints"});
  CHECK(has_skip(r, "README.txt", "not inside a split/class folder"));
}

TEST_CASE("pre-split layout with another folder beside the splits is refused, naming it", "[scan][presplit]") {
  TempDir d;
  write_text(d / "train/dog/a.wav", "x");
  write_text(d / "test/dog/b.wav", "x");
  const std::string other = GENERATE(std::string("cats"), std::string("validation_old"), std::string("val/../val2"));
  write_text(d / other / "c.wav", "x");
  try {
    scan_folder(d.path(), kExts);
    FAIL("no error");
  } catch (const melforge::FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains("'" + fs::path(other).lexically_normal().string() + "'") &&
                             Catch::Contains("pre-split layout"));
  }
  fs::remove_all(d / fs::path(other).lexically_normal());
  write_text(d / "val/dog/c.wav", "x");
  write_text(d / "validation/dog/d.wav", "x");
  CHECK_THROWS_WITH(scan_folder(d.path(), kExts), Catch::Contains("two folders for one split: 'val' and 'validation'"));
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

TEST_CASE("symbolic links: files followed, folder loops listed", "[scan]") {
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
  CHECK(has_skip(r, "dog/self", "symbolic link loop: leads to the folder already scanned as 'dog'"));
}

TEST_CASE("symbolic links to folders are followed, once per folder", "[scan][links]") {
  TempDir d;
  const fs::path in = d / "in";
  write_text(d / "elsewhere/dogs/a.wav", "x");
  write_text(d / "elsewhere/dogs/sub/b.wav", "x");
  write_text(d / "elsewhere/more/c.wav", "x");
  write_text(in / "cat/d.wav", "x");
  fs::create_directories(in);
  fs::create_symlink(d / "elsewhere/dogs", in / "dog");
  fs::create_symlink(d / "elsewhere/more", in / "cat/more");
  fs::create_symlink("..", in / "cat/up");
  fs::create_symlink(d / "elsewhere/dogs", in / "puppy");
  const auto r = scan_folder(in, kExts);
  CHECK(rel_paths(r) == std::vector<std::string>{"cat/d.wav", "cat/more/c.wav", "dog/a.wav", "dog/sub/b.wav"});
  REQUIRE(r.files.size() == 4);
  CHECK(r.files[1].label == "cat");
  CHECK(r.files[2].label == "dog");
  CHECK(has_skip(r, "cat/up", "symbolic link loop: leads to the folder already scanned as '.'"));
  CHECK(has_skip(r, "puppy", "class folder leads to the folder already scanned as 'dog'"));
  CHECK(r.skipped.size() == 2);
}

TEST_CASE("a folder that cannot be read is listed as skipped, never silently lost", "[scan][permissions]") {
  TempDir d;
  fs::permissions(d.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  write_text(d / "cat/a.wav", "x");
  write_text(d / "cat/locked/b.wav", "x");
  write_text(d / "dog/c.wav", "x");
  fs::permissions(d / "cat/locked", fs::perms::none);
  fs::permissions(d / "dog", fs::perms::none);
  melforge::test::ChildOptions as;
  if (::geteuid() == 0) as.uid = kNobody;
  const auto text = melforge::test::run_in_child([&] { return to_text(scan_folder(d.path(), kExts)); }, as);
  fs::permissions(d / "cat/locked", fs::perms::owner_all);
  fs::permissions(d / "dog", fs::perms::owner_all);
  if (!text) MELFORGE_SKIP("running as root, whose reads bypass chmod 000, and a child cannot switch to uid 65534");
  INFO(*text);
  const ScanResult r = from_text(*text);
  CHECK(rel_paths(r) == std::vector<std::string>{"cat/a.wav"});
  CHECK(has_skip(r, "cat/locked", "cannot read folder: Permission denied"));
  CHECK(has_skip(r, "dog", "cannot read folder: Permission denied"));
}

TEST_CASE("too many open files: a deep tree is scanned whole under a low descriptor limit", "[scan][emfile]") {
  TempDir d;
  const std::vector<std::string> expected = write_nested(d.path(), 12);
  melforge::test::ChildOptions low;
  low.open_files_limit = static_cast<rlim_t>(open_fds() + 4);
  const auto text = melforge::test::run_in_child([&] { return to_text(scan_folder(d.path(), kExts)); }, low);
  REQUIRE(text);
  INFO(*text);
  const ScanResult r = from_text(*text);
  CHECK(rel_paths(r) == expected);
  CHECK(r.skipped.empty());

  const auto failed = melforge::test::run_in_child([&] {
    while (::dup(0) >= 0) {
    }
    return to_text(scan_folder(d.path(), kExts));
  }, low);
  REQUIRE(failed);
  CHECK_THAT(*failed, Catch::Contains("exception: cannot read input folder") &&
                          Catch::Contains("Too many open files"));
}

TEST_CASE("errors in the middle of a walk are recorded and the walk goes on", "[scan][emfile]") {
  TempDir d;
  write_text(d / "c/a/f.wav", "x");
  write_text(d / "c/b/f.wav", "x");
  write_text(d / "c/b/deep/f.wav", "x");
  write_text(d / "c/c/f.wav", "x");
  write_text(d / "c/d/f.wav", "x");
  std::vector<int> held;
  ScanOptions opts;
  opts.extensions = kExts;
  opts.before_open = [&](const fs::path& dir) {
    for (const int fd : held) ::close(fd);
    held.clear();
    if (dir == d / "c/a") fs::remove_all(d / "c/c");
    if (dir == d / "c/b")
      for (int fd; (fd = ::dup(0)) >= 0;) held.push_back(fd);
  };
  const ScanResult r = scan_folder(d.path(), opts);
  for (const int fd : held) ::close(fd);
  CHECK(rel_paths(r) == std::vector<std::string>{"c/a/f.wav", "c/d/f.wav"});
  CHECK(has_skip(r, "c/b", "cannot read folder: Too many open files"));
  CHECK(has_skip(r, "c/c", "cannot read folder: No such file or directory"));
  CHECK(r.skipped.size() == 2);
}

TEST_CASE("hidden files and folders are ignored and listed, or scanned with include_hidden", "[scan][hidden]") {
  TempDir d;
  write_text(d / "dog/a.wav", "x");
  write_text(d / "dog/._a.wav", "x");
  write_text(d / "dog/.DS_Store", "x");
  write_text(d / "dog/.git/b.wav", "x");
  write_text(d / ".DS_Store", "x");
  write_text(d / ".Trash-1000/files/c.wav", "x");
  const auto r = scan_folder(d.path(), kExts);
  CHECK(rel_paths(r) == std::vector<std::string>{"dog/a.wav"});
  CHECK(r.skipped.empty());
  CHECK(r.hidden == std::vector<std::string>{".DS_Store", ".Trash-1000", "dog/.DS_Store", "dog/._a.wav", "dog/.git"});
  ScanOptions all;
  all.extensions = kExts;
  all.include_hidden = true;
  const auto h = scan_folder(d.path(), all);
  CHECK(rel_paths(h) == std::vector<std::string>{".Trash-1000/files/c.wav", "dog/._a.wav", "dog/.git/b.wav",
                                                 "dog/a.wav"});
  CHECK(h.hidden.empty());
  CHECK(has_skip(h, ".DS_Store", "not inside a class folder"));
  CHECK(has_skip(h, "dog/.DS_Store", "not an audio file extension"));
}

TEST_CASE("a folder listed in exclude (the output folder) is left out and said so", "[scan][exclude]") {
  TempDir d;
  write_text(d / "dog/a.wav", "x");
  write_text(d / "out/.melforge-build.lock", "");
  write_text(d / "out/train.h5", "x");
  write_text(d / "dog/nested_out/x.wav", "x");
  ScanOptions opts;
  opts.extensions = kExts;
  opts.exclude = {d / "out", d / "dog/nested_out", d / "missing"};
  const auto r = scan_folder(d.path(), opts);
  CHECK(rel_paths(r) == std::vector<std::string>{"dog/a.wav"});
  CHECK(r.skipped.empty());
  REQUIRE(r.excluded.size() == 2);
  CHECK(r.excluded[0].path == "out");
  CHECK_THAT(r.excluded[0].reason, Catch::Contains("output folder") && Catch::Contains("not scanned"));
  CHECK(r.excluded[1].path == "dog/nested_out");
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

TEST_CASE("manifest: one file under several spellings is refused, naming both lines", "[scan][csv]") {
  TempDir d;
  const std::string spelling = GENERATE(std::string("c/a/f0.wav"), std::string("./c/a/f0.wav"),
                                        std::string("c//a/../a/f0.wav"), std::string("absolute"),
                                        std::string("c/./a//f0.wav"));
  const std::string second = spelling == "absolute" ? (d / "c/a/f0.wav").string() : spelling;
  write_text(d / "m.csv", "path,label,split\nc/a/f0.wav,dog,train\nc/a/f1.wav,dog,val\n" + second + ",cat,test\n");
  try {
    scan_manifest(d / "m.csv");
    FAIL("no error for " << second);
  } catch (const melforge::FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains("m.csv:4: line 4 ('" + second + "') lists the same file as line 2 "
                                         "('c/a/f0.wav')"));
  }
}

TEST_CASE("manifest: labels and splits are trimmed", "[scan][csv]") {
  TempDir d;
  write_text(d / "m.csv", "a.wav,a\nb.wav, a\nc.wav,a ,  train\nd.wav,\t a\t, Test \n");
  const auto r = scan_manifest(d / "m.csv");
  REQUIRE(r.files.size() == 4);
  for (const auto& f : r.files) CHECK(f.label == "a");
  CHECK(r.files[2].split == 0);
  CHECK(r.files[3].split == 2);
  write_text(d / "blank.csv", "a.wav,  \n");
  CHECK_THROWS_WITH(scan_manifest(d / "blank.csv"), Catch::Contains("blank.csv:1: empty label"));
}

TEST_CASE("manifest: a BOM is skipped only when it is EF BB BF, and UTF-16 or UTF-32 is refused as such",
          "[scan][csv][untrusted]") {
  TempDir d;
  write_text(d / "bom.csv", "\xef\xbb\xbf" "a.wav,dog\n");
  const auto bom = scan_manifest(d / "bom.csv");
  REQUIRE(bom.files.size() == 1);
  CHECK(bom.files[0].rel_path == "a.wav");
  write_text(d / "ef.csv", "\xef\xbd\xa1" "a.wav,dog\n");
  const auto ef = scan_manifest(d / "ef.csv");
  REQUIRE(ef.files.size() == 1);
  CHECK(ef.files[0].rel_path == "\xef\xbd\xa1" "a.wav");

  const auto [bytes, encoding] = GENERATE(table<std::string, std::string>({
      {std::string("\xff\xfe" "a\0,\0b\0\n\0", 10), "UTF-16 (little-endian byte order mark FF FE)"},
      {std::string("\xfe\xff" "\0a\0,\0b\0\n", 10), "UTF-16 (big-endian byte order mark FE FF)"},
      {std::string("a\0,\0b\0\n\0", 8), "UTF-16 little-endian (no byte order mark"},
      {std::string("\0a\0,\0b\0\n", 8), "UTF-16 big-endian (no byte order mark"},
      {std::string("\xff\xfe\0\0a\0\0\0", 8), "UTF-32 (little-endian byte order mark FF FE 00 00)"},
  }));
  CAPTURE(encoding);
  write_text(d / "wide.csv", bytes);
  CHECK_THROWS_AS(scan_manifest(d / "wide.csv"), melforge::FormatError);
  CHECK_THROWS_WITH(scan_manifest(d / "wide.csv"), Catch::Contains("wide.csv' is " + encoding) &&
                                                       Catch::Contains("save it as UTF-8"));
}

TEST_CASE("manifest: a NUL byte in a row is refused, naming the line", "[scan][csv][untrusted]") {
  TempDir d;
  const std::string row = GENERATE(std::string("b.wav\0x,dog\n", 12), std::string("b.wav,d\0og\n", 11),
                                   std::string("b.wav,dog,train\0\n", 17));
  write_text(d / "nul.csv", "a.wav,dog\n" + row);
  CHECK_THROWS_AS(scan_manifest(d / "nul.csv"), melforge::FormatError);
  CHECK_THROWS_WITH(scan_manifest(d / "nul.csv"), Catch::Contains("nul.csv:2: NUL byte in the row"));
}

TEST_CASE("manifest: a header row is recognised, by its column names in any case and order", "[scan][csv][untrusted]") {
  TempDir d;
  const auto [header, row, warns] = GENERATE(table<std::string, std::string, bool>({
      {"path,label", "x/a.wav,dog", false},
      {"PATH,Label,Split", "x/a.wav,dog,val", false},
      {"filename,class", "x/a.wav,dog", true},
      {"File_Name , Category", "x/a.wav,dog", true},
      {"class,filename", "dog,x/a.wav", true},
      {"split,label,path", "val,dog,x/a.wav", true},
      {"wav,tags,subset", "x/a.wav,dog,val", true},
      {"audio file,my label", "x/a.wav,dog", true},
  }));
  CAPTURE(header);
  write_text(d / "m.csv", "\n" + header + "\r\n" + row + "\n");
  const auto r = scan_manifest(d / "m.csv");
  REQUIRE(r.files.size() == 1);
  CHECK(r.files[0].rel_path == "x/a.wav");
  CHECK(r.files[0].label == "dog");
  CHECK(r.files[0].split == (row.find("val") != std::string::npos ? 1 : -1));
  REQUIRE(r.warnings.size() == (warns ? 1u : 0u));
  if (warns) CHECK_THAT(r.warnings[0], Catch::Contains("m.csv:2: '" + header + "' read as a header row"));
}

TEST_CASE("manifest: a first row naming an existing file, or a file name, is data, not a header",
          "[scan][csv][untrusted]") {
  TempDir d;
  write_text(d / "label", "");
  const auto [first, path] = GENERATE(table<std::string, std::string>({
      {"label,dog", "label"},
      {"a.wav,label", "a.wav"},
      {"x/b,label", "x/b"},
      {"path,label,split,extra", ""},
  }));
  CAPTURE(first);
  write_text(d / "m.csv", first + "\nc.wav,cat\n");
  if (path.empty()) {
    CHECK_THROWS_WITH(scan_manifest(d / "m.csv"), Catch::Contains("m.csv:1: expected path,label[,split], got 4"));
    return;
  }
  const auto r = scan_manifest(d / "m.csv");
  REQUIRE(r.files.size() == 2);
  CHECK((r.files[0].rel_path == path || r.files[1].rel_path == path));
  CHECK(r.warnings.empty());
}

TEST_CASE("manifest: a FIFO, a device or a folder is refused before reading", "[scan][csv][untrusted]") {
  TempDir d;
  REQUIRE(::mkfifo((d / "fifo.csv").c_str(), 0600) == 0);
  const std::string path = GENERATE(as<std::string>{}, "/dev/zero", "FIFO", "FOLDER");
  const fs::path given = path == "FIFO" ? d / "fifo.csv" : path == "FOLDER" ? d.path() : fs::path(path);
  CAPTURE(given);
  CHECK_THROWS_AS(scan_manifest(given), melforge::InvalidArgument);
  CHECK_THROWS_WITH(scan_manifest(given), Catch::Contains("manifest") && Catch::Contains("regular file"));
}

}  // namespace melforge_test_scan
