// Names that are not valid UTF-8 (issue 15): utf8::escape against Python's errors="backslashreplace", and a build
// of a corpus whose class folder and file names hold bytes such as 0xff, read back with Python's json and h5py.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "build_fixture.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"
#include "output_folder.h"
#include "pipeline.h"
#include "test_skip.h"
#include "test_util.h"

namespace melforge_test_utf8 {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// True when /usr/bin/python3 imports h5py.
bool have_python_h5py() { return std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") == 0; }

/// Runs /usr/bin/python3 on `script` (written to `dir`/check.py) with `args`; returns its exit status and fills
/// `output` with what it printed.
int run_python(const fs::path& dir, const std::string& script, const std::string& args, std::string& output) {
  test::write_text(dir / "check.py", script);
  const std::string cmd = "/usr/bin/python3 '" + (dir / "check.py").string() + "' " + args + " > '" +
                          (dir / "check.out").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir / "check.out");
  output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return rc;
}

}  // namespace

TEST_CASE("utf8::escape keeps valid UTF-8 and writes every other byte as \\xNN", "[utf8]") {
  CHECK(utf8::escape("") == "");
  CHECK(utf8::escape("dog/f0.wav") == "dog/f0.wav");
  CHECK(utf8::escape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\xb6 a\\b") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\xb6 a\\b");
  CHECK(utf8::escape("c\xffx") == "c\\xffx");
  CHECK(utf8::escape("\xc3") == "\\xc3");
  CHECK(utf8::escape("\xe2\x82" "A") == "\\xe2\\x82A");
  CHECK(utf8::escape("\xc0\x80") == "\\xc0\\x80");
  CHECK(utf8::escape("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  CHECK(utf8::escape("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");
  CHECK(utf8::escape(std::string("a\0b", 3)) == std::string("a\0b", 3));
  CHECK(utf8::valid("caf\xc3\xa9"));
  CHECK_FALSE(utf8::valid("c\xffx"));
  CHECK_FALSE(utf8::valid("\xe0\x80\x80"));
  const std::string once = utf8::escape("\xfe\xff" "abc\x80");
  CHECK(utf8::valid(once));
  CHECK(utf8::escape(once) == once);
}

TEST_CASE("utf8::dump escapes every string and key, where nlohmann's dump throws", "[utf8]") {
  const nlohmann::json j = {{"c\xffx", {{"path", "c\xffx/f\xfe.wav"}, {"n", 3}}}, {"list", {"ok", "b\xe9"}}};
  CHECK_THROWS(j.dump());
  const nlohmann::json back = nlohmann::json::parse(utf8::dump(j, 2));
  CHECK(back["c\\xffx"]["path"] == "c\\xffx/f\\xfe.wav");
  CHECK(back["c\\xffx"]["n"] == 3);
  CHECK(back["list"][1] == "b\\xe9");
  const nlohmann::json plain = {{"a", "b"}, {"x", 1.5}};
  CHECK(utf8::dump(plain, 2) == plain.dump(2));
}

TEST_CASE("utf8::escape gives what Python's decode(\"utf-8\", \"backslashreplace\") gives", "[utf8]") {
  if (std::system("/usr/bin/python3 -c 'import sys' >/dev/null 2>&1") != 0)
    MELFORGE_SKIP("/usr/bin/python3 is not available");
  TempDir d;
  std::mt19937 rng(15);
  const std::string alphabet = "a\\x\xc3\xa9\xe2\x82\xac\xf0\x9f\x90\xb6\xff\xfe\x80\xbf\xc0\xed\xa0\xf4\x90";
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::string> inputs;
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    inputs.push_back(s);
    std::string hex;
    for (unsigned char c : s) {
      static constexpr char kHex[] = "0123456789abcdef";
      hex += kHex[c >> 4];
      hex += kHex[c & 0xf];
    }
    cases.push_back({{"hex", hex}, {"escaped", utf8::escape(s)}});
  }
  write_json_atomically(d / "cases.json", cases);
  std::string output;
  const int rc = run_python(d.path(),
                            "import json, sys\n"
                            "bad = 0\n"
                            "for c in json.load(open(sys.argv[1], encoding='utf-8')):\n"
                            "    want = bytes.fromhex(c['hex']).decode('utf-8', 'backslashreplace')\n"
                            "    if want != c['escaped']:\n"
                            "        bad += 1\n"
                            "        print('mismatch', c['hex'], repr(want), repr(c['escaped']))\n"
                            "print('checked', bad)\n"
                            "sys.exit(1 if bad else 0)\n",
                            "'" + (d / "cases.json").string() + "'", output);
  INFO(output);
  CHECK(rc == 0);
  CHECK_THAT(output, Catch::Contains("checked 0"));
}

TEST_CASE("a build of class folders and files whose names are not UTF-8 writes a report and datasets that Python "
          "reads", "[utf8][build]") {
  if (!have_python_h5py()) MELFORGE_SKIP("/usr/bin/python3 with h5py is not available (tools/setup.sh installs it)");
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 6);
  fs::rename(d / "in" / "class1", d / "in" / "c\xff\xfe");
  test::write_tone(d / "in" / "c\xff\xfe" / "f\xff.wav", 700, 12000, 8000);
  test::write_tone(d / "in" / "class0" / "g\xe9.wav", 300, 12000, 8000);
  test::write_text(d / "in" / "class0" / "bad\xff.wav", "not audio");
  builder::run_build(test::tone_build_config(d / "in", d / "out"));
  std::string output;
  const int rc = run_python(
      d.path(),
      "import json, os, sys, h5py\n"
      "root, out = sys.argv[1].encode(), sys.argv[2]\n"
      "def text(b): return b.decode('utf-8', 'backslashreplace')\n"
      "names = set()\n"
      "for top, dirs, files in os.walk(root):\n"
      "    for f in files: names.add(text(os.path.relpath(os.path.join(top, f), root)))\n"
      "classes = [text(c) for c in sorted(os.listdir(root))]\n"
      "r = json.load(open(os.path.join(out, 'build_report.json'), encoding='utf-8'))\n"
      "assert r['classes'] == classes, (r['classes'], classes)\n"
      "assert [s['path'] for s in r['skipped']] == ['class0/bad\\\\xff.wav'], r['skipped']\n"
      "seen = set(s['path'] for s in r['skipped'])\n"
      "for split in ('train', 'val', 'test'):\n"
      "    assert set(r['counts'][split]) == set(classes), r['counts'][split]\n"
      "    with h5py.File(os.path.join(out, split + '.h5'), 'r') as h:\n"
      "        assert list(h['class_names'].asstr()[:]) == classes\n"
      "        seen.update(h['path'].asstr()[:])\n"
      "assert seen == names, (sorted(seen ^ names))\n"
      "assert 'c\\\\xff\\\\xfe/f\\\\xff.wav' in seen and 'class0/g\\\\xe9.wav' in seen\n"
      "print('OK', len(seen))\n",
      "'" + (d / "in").string() + "' '" + (d / "out").string() + "'", output);
  INFO(output);
  CHECK(rc == 0);
  CHECK_THAT(output, Catch::Contains("OK 17"));
}

}  // namespace melforge_test_utf8
