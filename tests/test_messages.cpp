// Messages in the user's terms (issue 15): parameters that cannot work are refused before any work (exit 2) with a
// message that names the flag and says what to use instead, and a --config file saved with a UTF-8 byte order mark
// is read like one without.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "build_options.h"
#include "reliability/child_process.h"
#include "reliability/corpus.h"
#include "test_util.h"

namespace melforge_test_messages {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("float16 with log none is refused before any work, saying what to use", "[messages]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const std::vector<std::string> dtype = GENERATE(std::vector<std::string>{},
                                                  std::vector<std::string>{"--dtype", "float16"});
  std::vector<std::string> extra = {"--log", "none"};
  extra.insert(extra.end(), dtype.begin(), dtype.end());
  const auto r = test::run_child(test::build_args(d / "in", d / "out", extra), d / "log.txt");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--log none with --dtype float16") && Catch::Contains("+Inf") &&
                           Catch::Contains("65504") && Catch::Contains("--dtype float32"));
  CHECK_FALSE(fs::exists(d / "out"));

  builder::BuildConfig ok;
  ok.build.input = d / "in";
  ok.build.output = d / "ok";
  ok.mel.log = mel::LogMode::none;
  ok.build.dtype = mel::DType::float32;
  CHECK_NOTHROW(ok.validate());
  ok.mel.log = GENERATE(mel::LogMode::db, mel::LogMode::ln);
  ok.build.dtype = mel::DType::float16;
  CHECK_NOTHROW(ok.validate());
}

TEST_CASE("a sample rate too low for the mel filters or the segments names --sample-rate", "[messages]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  SECTION("--sample-rate 1: f_max, half of it, is 0 Hz") {
    const auto r = test::run_child(test::build_args(d / "in", d / "out", {"--sample-rate", "1"}), d / "log.txt");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--sample-rate 1 Hz is too low") && Catch::Contains("raise --sample-rate"));
    CHECK_THAT(r.output, !Catch::Contains("must be below f_max 0 Hz"));
  }
  SECTION("--sample-rate 400 with 0.25 s segments: too short for reflect padding by n_fft/2") {
    const auto r = test::run_child(
        test::build_args(d / "in", d / "out", {"--sample-rate", "400", "--n-mels", "8"}), d / "log.txt");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("a short segment of 100 samples (--short-seconds x --sample-rate 400 Hz)") &&
                             Catch::Contains("raise --short-seconds or --sample-rate"));
  }
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("a --config file that starts with a UTF-8 byte order mark is read like one without", "[messages]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const std::string bom = GENERATE(std::string(), std::string("\xef\xbb\xbf"));
  CAPTURE(bom.size());
  test::write_text(d / "build.ini", bom + "n-fft = 128\n# a comment\nn-mels = 24\n");
  auto args = test::build_args(d / "in", d / "out", {"--config", (d / "build.ini").string()});
  args.erase(std::find(args.begin(), args.end(), "--n-mels"), std::find(args.begin(), args.end(), "--n-mels") + 2);
  args.erase(std::find(args.begin(), args.end(), "--n-fft"), std::find(args.begin(), args.end(), "--n-fft") + 2);
  const auto r = test::run_child(args, d / "log.txt");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto report = nlohmann::json::parse(test::read_file_bytes(d / "out" / "build_report.json"));
  CHECK(report["config"]["n_fft"] == 128);
  CHECK(report["config"]["n_mels"] == 24);

  const auto folder = test::run_child(test::build_args(d / "in", d / "out2", {"--config", d.path().string()}),
                                      d / "log2.txt");
  INFO(folder.output);
  CHECK(folder.exit_code == 2);
  CHECK_THAT(folder.output, Catch::Contains("--config '" + d.path().string() + "' is a folder"));
}

}  // namespace melforge_test_messages
