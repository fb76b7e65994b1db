// Files we did not write (issue 29): read_regular_file refuses FIFOs, devices and folders before reading and bounds
// the size it reads; utf8::for_terminal escapes control characters and bounds the length of text from files.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"
#include "test_util.h"

namespace melforge_test_untrusted_text {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("read_regular_file reads a regular file whole, through a link too", "[untrusted]") {
  TempDir dir;
  const auto size = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{65535}, std::size_t{300000});
  std::string text(size, 'a');
  for (std::size_t i = 0; i < size; ++i) text[i] = static_cast<char>('a' + i % 26);
  const fs::path p = dir.path() / "list.txt";
  std::ofstream(p, std::ios::binary) << text;
  CHECK(read_regular_file(p, "trial list") == text);
  fs::create_symlink(p, dir.path() / "link.txt");
  CHECK(read_regular_file(dir.path() / "link.txt", "trial list") == text);
}

TEST_CASE("read_regular_file refuses a FIFO, a device and a folder before reading, naming the role",
          "[untrusted]") {
  TempDir dir;
  const fs::path fifo = dir.path() / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto [which, kind] =
      GENERATE(table<int, std::string>({{0, "a FIFO"}, {1, "a character device"}, {2, "a folder"}}));
  const fs::path path = which == 0 ? fifo : which == 1 ? fs::path("/dev/zero") : dir.path();
  CAPTURE(path);
  REQUIRE_THROWS_AS(read_regular_file(path, "--config"), InvalidArgument);
  try {
    read_regular_file(path, "--config");
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    CHECK(what.find("--config") != std::string::npos);
    CHECK(what.find(kind) != std::string::npos);
  }
  CHECK_THROWS_AS(require_regular_file(path, "manifest"), InvalidArgument);
}

TEST_CASE("read_regular_file refuses a file over its bound and a missing one, with typed errors", "[untrusted]") {
  TempDir dir;
  const fs::path p = dir.path() / "big.csv";
  std::ofstream(p, std::ios::binary) << std::string(1000, 'x');
  CHECK(read_regular_file(p, "manifest", 1000).size() == 1000);
  CHECK_THROWS_AS(read_regular_file(p, "manifest", 999), FormatError);
  CHECK_THROWS_AS(read_regular_file(dir.path() / "missing.csv", "manifest"), IoError);
  CHECK_THROWS_AS(require_regular_file(dir.path() / "missing.csv", "manifest"), IoError);
  CHECK_NOTHROW(require_regular_file(p, "manifest"));
}

TEST_CASE("for_terminal escapes control characters, invalid bytes and bidi overrides", "[untrusted]") {
  const auto [in, out] = GENERATE(table<std::string, std::string>({
      {"dog", "dog"},
      {"caf\xc3\xa9", "caf\xc3\xa9"},
      {"a\nb", "a\\nb"},
      {"a\rb\tc", "a\\rb\\tc"},
      {std::string("a\0b", 3), "a\\x00b"},
      {"\x1b[31mred", "\\x1b[31mred"},
      {"del\x7f", "del\\x7f"},
      {"c1\xc2\x85", "c1\\x85"},
      {"\xff\xfe", "\\xff\\xfe"},
      {"evil\xe2\x80\xaetxt.exe", "evil\\u202etxt.exe"},
      {"iso\xe2\x81\xa6x", "iso\\u2066x"},
      {"ok\xe2\x80\x94", "ok\xe2\x80\x94"},
  }));
  CAPTURE(in);
  CHECK(utf8::for_terminal(in) == out);
  CHECK(utf8::valid(utf8::for_terminal(in)));
}

TEST_CASE("for_terminal bounds the length and says how long the text was", "[untrusted]") {
  const std::size_t n = GENERATE(std::size_t{201}, std::size_t{1000}, std::size_t{64} << 20);
  const std::string text(n, '\n');
  const std::string out = utf8::for_terminal(text);
  CHECK(out.size() <= utf8::kTerminalTextBytes + 32);
  CHECK(out.find("(" + std::to_string(n) + " bytes)") != std::string::npos);
  const std::string exact(utf8::kTerminalTextBytes, 'a');
  CHECK(utf8::for_terminal(exact) == exact);
  const std::string multibyte = std::string(199, 'a') + "\xc3\xa9";
  CHECK(utf8::valid(utf8::for_terminal(multibyte)));
  CHECK(utf8::for_terminal(multibyte).rfind(std::string(199, 'a') + "... (", 0) == 0);
}

}  // namespace melforge_test_untrusted_text
