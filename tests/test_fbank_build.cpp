// melforge-build --features fbank (issue 31): the front-end and every Kaldi filterbank parameter recorded as root
// attributes and in the report, the flags in both spellings and in a --config file, the refusals of a flag of the
// other front-end before any work, merging fbank shards (and refusing a mel shard among them), and the reader's
// refusal of hostile fbank attributes. Feature values are the kernel's business (tests/test_fbank_*.cpp); these
// tests check attributes, shapes and frame counts.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <boost/program_options.hpp>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "build_cli.h"
#include "build_fixture.h"
#include "build_options.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "merge.h"
#include "reader/mel_info.h"
#include "reader/split_info.h"
#include "reliability/child_process.h"
#include "test_util.h"

namespace melforge_test_fbank_build {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

/// The tone corpus flags of tone_build_config (8 kHz, 0.25 s tiles, CPU, quiet) with `out` and `extra`.
std::vector<std::string> tone_args(const fs::path& in, const fs::path& out, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--input", in.string(), "--output", out.string(), "--sample-rate", "8000",
                                   "--short-seconds", "0.25", "--split", "0.6,0.2,0.2", "--device", "cpu",
                                   "--threads", "2", "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

/// `args` parsed as melforge-build parses its command line, into a configuration (front-end applied).
builder::BuildConfig parsed(const std::vector<std::string>& args) {
  builder::BuildConfig config;
  std::string config_file;
  po::options_description all;
  builder::add_build_groups(all, config, config_file);
  std::ostringstream help;
  const bool not_help = builder::parse_build_args(args, all, help, &config);
  REQUIRE(not_help);
  return config;
}

/// The message of the melforge::Error or boost error parsing `args` throws; "(no error)" when none.
std::string parse_error(const std::vector<std::string>& args) {
  try {
    parsed(args);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

/// Root attributes of a split file.
std::map<std::string, h5::AttributeValue> attributes(const fs::path& file) {
  const auto f = h5::open_file(file);
  return h5::read_attributes(f);
}

/// The fbank flags of a speaker-verification style recipe at 8 kHz: 20 bins, 25/10 ms, hamming, dither 0, energy.
const std::vector<std::string> kRecipe = {"--features", "fbank", "--num-mel-bins", "20", "--frame-length", "25",
                                          "--frame-shift", "10", "--dither", "0", "--window-type", "hamming",
                                          "--use-energy", "true"};

/// A tone corpus of 3 classes x 4 files built once with kRecipe, shared by the tests that only read it.
const fs::path& fbank_dataset() {
  static const TempDir root;
  static const fs::path built = [] {
    test::write_tone_corpus(root / "in", 3, 4);
    builder::run_build(parsed(tone_args(root / "in", root / "fb", kRecipe)));
    return root / "fb";
  }();
  return built;
}

/// The FormatError message reading `file`'s parameters gives; "(no error)" when it reads.
std::string read_error(const fs::path& file) {
  try {
    data::read_split_info(file, "train");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("a --features fbank build records its front-end in the attributes and the report, with Kaldi frame counts",
          "[fbank][build]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 4);
  const std::string spelling = GENERATE("dashed", "underscore", "config");
  CAPTURE(spelling);
  std::vector<std::string> extra = kRecipe;
  if (spelling == "underscore")
    extra = {"--features", "fbank", "--num_mel_bins", "20", "--frame_length", "25", "--frame_shift", "10",
             "--dither", "0", "--window_type", "hamming", "--use_energy", "true"};
  if (spelling == "config") {
    test::write_text(d / "fb.ini", "features = fbank\nnum_mel_bins = 20\nframe-length = 25\nframe_shift = 10\n"
                                   "dither = 0\nwindow_type = hamming\nuse_energy = true\n");
    extra = {"--config", (d / "fb.ini").string()};
  }
  const builder::BuildConfig config = parsed(tone_args(d / "in", d / "fb", extra));
  REQUIRE(config.mel.is_fbank());
  CHECK(config.mel.fbank.num_mel_bins == 20);
  CHECK(config.mel.fbank.window_type == fbank::KaldiWindow::hamming);
  CHECK(config.mel.n_mels == 21);
  CHECK(config.mel.n_fft == 256);
  CHECK(config.mel.win_length == 200);
  CHECK(config.mel.hop_length == 80);
  CHECK_FALSE(config.mel.center);
  const nlohmann::json report = builder::run_build(config).report;

  for (const std::string split : {"train", "val", "test"}) {
    CAPTURE(split);
    const fs::path file = d / "fb" / (split + ".h5");
    const auto a = attributes(file);
    CHECK(a.at("features") == h5::AttributeValue{std::string("fbank")});
    CHECK(a.at("num_mel_bins") == h5::AttributeValue{int64_t{20}});
    CHECK(a.at("frame_length") == h5::AttributeValue{25.0});
    CHECK(a.at("window_type") == h5::AttributeValue{std::string("hamming")});
    CHECK(a.at("use_energy") == h5::AttributeValue{int64_t{1}});
    CHECK(a.at("snip_edges") == h5::AttributeValue{int64_t{1}});
    CHECK(a.at("dither_seed") == h5::AttributeValue{int64_t{0}});
    CHECK(a.at("n_mels") == h5::AttributeValue{int64_t{21}});
    CHECK(a.at("n_fft") == h5::AttributeValue{int64_t{256}});
    CHECK(a.at("hop_length") == h5::AttributeValue{int64_t{80}});
    const data::SplitInfo info = data::read_split_info(file, split);
    CHECK(info.info.features == "fbank");
    CHECK(info.info.fbank.to_string() == config.mel.fbank.to_string());
    const mel::MelArgs back = info.info.mel_args();
    CHECK(back.is_fbank());
    CHECK(back.to_string() == config.mel.to_string());
    const auto frames = info.clip_frame_counts();
    REQUIRE(frames.size() == info.num_samples.size());
    for (std::size_t i = 0; i < frames.size(); ++i) {
      CAPTURE(info.paths[i], info.num_samples[i]);
      CHECK(frames[i] == config.mel.clip_frames(info.num_samples[i]));
      CHECK(frames[i] == 1 + (info.num_samples[i] - 200) / 80);
    }
    const test::SplitData data = test::read_split(file);
    if (!data.dims.empty()) CHECK(data.dims[1] == 21);
  }
  const nlohmann::json& c = report["config"];
  CHECK(c["features"] == "fbank");
  CHECK(c["num_mel_bins"] == 20);
  CHECK(c["window_type"] == "hamming");
  CHECK(c["frame_shift"] == 10.0);
  CHECK(c["use_energy"] == 1);
  CHECK(c["n_mels"] == 21);
  std::ifstream written(d / "fb" / "build_report.json");
  CHECK(nlohmann::json::parse(written)["config"] == c);
}

TEST_CASE("a mel build records features mel and no fbank attribute, and reads back as mel", "[fbank][build]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  const builder::BuildConfig config = parsed(tone_args(d / "in", d / "mel", {"--n-mels", "32", "--n-fft", "256"}));
  CHECK_FALSE(config.mel.is_fbank());
  const nlohmann::json report = builder::run_build(config).report;
  const auto a = attributes(d / "mel" / "train.h5");
  CHECK(a.at("features") == h5::AttributeValue{std::string("mel")});
  CHECK_FALSE(a.contains("num_mel_bins"));
  CHECK_FALSE(a.contains("window_type"));
  CHECK(report["config"]["features"] == "mel");
  CHECK_FALSE(report["config"].contains("num_mel_bins"));
  const data::MelInfo info = data::read_split_info(d / "mel" / "train.h5", "train").info;
  CHECK(info.features == "mel");
  CHECK_FALSE(info.mel_args().is_fbank());
  const nlohmann::json j = info.to_json();
  CHECK(j["features"] == "mel");
  CHECK_FALSE(j.contains("num_mel_bins"));
}

TEST_CASE("a flag of the other front-end is refused before any work, naming both flags", "[fbank][build]") {
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> named;
  };
  const Case c = GENERATE(Case{{"--features", "fbank", "--n-mels", "40"}, {"--n-mels", "--num-mel-bins"}},
                          Case{{"--features", "fbank", "--n_mels", "40"}, {"--n-mels", "--num-mel-bins"}},
                          Case{{"--features", "fbank", "--hop_length", "160"}, {"--hop-length", "--frame-shift"}},
                          Case{{"--features", "fbank", "--window", "hann"}, {"--window", "--window-type"}},
                          Case{{"--features", "fbank", "--norm", "slaney"}, {"--mel-norm", "no such parameter"}},
                          Case{{"--features", "fbank", "--log", "ln"}, {"--log", "--use-log-fbank"}},
                          Case{{"--num-mel-bins", "80"}, {"--num-mel-bins", "--features fbank", "--n-mels"}},
                          Case{{"--num_mel_bins", "80"}, {"--num-mel-bins", "--features fbank", "--n-mels"}},
                          Case{{"--features", "mel", "--frame-shift", "10"},
                               {"--frame-shift", "--features fbank", "--hop-length"}},
                          Case{{"--dither", "1"}, {"--dither", "--features fbank"}});
  std::string flags;
  for (const auto& f : c.flags) flags += f + " ";
  CAPTURE(flags);
  TempDir d;
  test::write_tone_corpus(d / "in", 1, 1);
  const std::string message = parse_error(tone_args(d / "in", d / "out", c.flags));
  for (const auto& name : c.named) CHECK_THAT(message, Catch::Contains(name));
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("fbank refusals: a mel key in a --config file, bad fbank values, and the CLI's exit code 2",
          "[fbank][build]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 1, 1);
  test::write_text(d / "c.ini", "features = fbank\nn_mels = 40\n");
  CHECK_THAT(parse_error(tone_args(d / "in", d / "out", {"--config", (d / "c.ini").string()})),
             Catch::Contains("--n-mels") && Catch::Contains("--num-mel-bins"));
  CHECK_THAT(parse_error(tone_args(d / "in", d / "out", {"--features", "fbank", "--frame-length", "-25"})),
             Catch::Contains("frame_length"));
  CHECK_THAT(parse_error(tone_args(d / "in", d / "out", {"--features", "fbank", "--num-mel-bins", "400"})),
             Catch::Contains("num_mel_bins"));
  CHECK_THROWS_WITH(parsed(tone_args(d / "in", d / "out", {"--features", "fbank", "--window-type", "kaiser"})),
                    Catch::Contains("kaiser"));
  const builder::BuildConfig linear =
      parsed(tone_args(d / "in", d / "out", {"--features", "fbank", "--use-log-fbank", "false"}));
  CHECK_THROWS_WITH(builder::run_build(linear), Catch::Contains("--use-log-fbank false") &&
                                                    Catch::Contains("--dtype float32"));
  const builder::BuildConfig seed =
      parsed(tone_args(d / "in", d / "out", {"--features", "fbank", "--dither-seed", "9223372036854775808"}));
  CHECK_THROWS_WITH(builder::run_build(seed), Catch::Contains("--dither-seed"));
  CHECK_FALSE(fs::exists(d / "out"));

  std::vector<std::string> argv = {MELFORGE_BUILD_EXE};
  for (const auto& a : tone_args(d / "in", d / "out", {"--features", "fbank", "--n-mels", "40"})) argv.push_back(a);
  const auto r = test::run_child(argv, d / "log.txt");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--n-mels") && Catch::Contains("--num-mel-bins"));
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("fbank shards merge with their attributes, and a mel shard among them is refused", "[fbank][build][shard]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  builder::BuildConfig config = parsed(tone_args(d / "in", d / "unused", kRecipe));
  const auto dirs = test::build_shards(config, d / "fb", 2);
  test::merge_shards(dirs, d / "merged", false);
  for (const std::string split : {"train", "val", "test"}) {
    CAPTURE(split);
    const data::MelInfo merged = data::read_split_info(d / "merged" / (split + ".h5"), split).info;
    CHECK(merged.features == "fbank");
    CHECK(merged.fbank.to_string() == config.mel.fbank.to_string());
    const data::MelInfo shard = data::read_split_info(dirs[0] / (split + ".h5"), split).info;
    CHECK(merged.first_difference(shard, "merged", "shard").empty());
  }

  builder::BuildConfig mel = parsed(tone_args(d / "in", d / "mel-2", {"--n-fft", "256", "--hop-length", "80"}));
  mel.build.shard = "2/2";
  builder::run_build(mel);
  std::string message = "(no error)";
  try {
    test::merge_shards({dirs[0], d / "mel-2"}, d / "mixed", false);
  } catch (const FormatError& e) {
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("mel-2") && Catch::Contains("features mel but fbank") &&
                          Catch::Contains("--features"));
  CHECK_FALSE(fs::exists(d / "mixed"));
}

TEST_CASE("hostile fbank attributes are refused naming the file and the attribute", "[fbank][build][untrusted]") {
  const fs::path& built = fbank_dataset();
  struct Case {
    std::string name;
    h5::AttributeValue value;
    std::string named;
  };
  const Case c = GENERATE(Case{"num_mel_bins", int64_t{1} << 40, "num_mel_bins"},
                          Case{"num_mel_bins", int64_t{100000}, "num_mel_bins"},
                          Case{"num_mel_bins", 20.5, "num_mel_bins"},
                          Case{"frame_length", -25.0, "frame_length"},
                          Case{"frame_length", 1e300, "frame_length"},
                          Case{"frame_shift", std::numeric_limits<double>::quiet_NaN(), "frame_shift"},
                          Case{"window_type", std::string("kaiser"), "window_type"},
                          Case{"snip_edges", int64_t{7}, "snip_edges"},
                          Case{"dither_seed", int64_t{-1}, "dither_seed"},
                          Case{"vtln_warp", 0.9, "vtln_warp"},
                          Case{"features", std::string("mfcc"), "features"},
                          Case{"n_mels", int64_t{19}, "n_mels"},
                          Case{"hop_length", int64_t{64}, "hop_length"});
  CAPTURE(c.name, h5::to_string(c.value));
  TempDir d;
  const fs::path file = d / "train.h5";
  fs::copy_file(built / "train.h5", file);
  {
    auto f = h5::open_file(file, true);
    h5::write_attribute(f, c.name, c.value);
  }
  const std::string message = read_error(file);
  CHECK_THAT(message, Catch::Contains(file.string()) && Catch::Contains(c.named));
}

TEST_CASE("a missing fbank attribute is refused naming the file and the attribute", "[fbank][build][untrusted]") {
  const fs::path& built = fbank_dataset();
  const std::string name = GENERATE("frame_shift", "use_energy", "window_type", "subtract_mean");
  CAPTURE(name);
  TempDir d;
  fs::copy_file(built / "train.h5", d / "missing.h5");
  {
    auto f = h5::open_file(d / "missing.h5", true);
    REQUIRE(H5Adelete(f.id(), name.c_str()) >= 0);
  }
  CHECK_THAT(read_error(d / "missing.h5"), Catch::Contains("missing.h5") && Catch::Contains("'" + name + "'"));
}

TEST_CASE("a checkpoint's JSON carries the fbank parameters, and older JSON without features reads as mel",
          "[fbank][build]") {
  const fs::path& built = fbank_dataset();
  const data::MelInfo fb = data::read_split_info(built / "train.h5", "train").info;
  const nlohmann::json j = fb.to_json();
  CHECK(j["features"] == "fbank");
  CHECK(j["num_mel_bins"] == 20);
  CHECK(j["window_type"] == "hamming");
  const data::MelInfo back = data::MelInfo::from_json(j);
  CHECK(back.first_difference(fb, "a", "b").empty());
  CHECK(back.mel_args().to_string() == fb.mel_args().to_string());

  nlohmann::json old = j;
  for (const auto& [name, value] : data::fbank_attributes(fb.fbank)) old.erase(name);
  old.erase("features");
  const data::MelInfo legacy = data::MelInfo::from_json(old);
  CHECK(legacy.features == "mel");
  CHECK_THAT(legacy.first_difference(fb, "the checkpoint", "the dataset"),
             Catch::Contains("features is mel in the checkpoint but fbank in the dataset"));

  nlohmann::json missing = j;
  missing.erase("frame_shift");
  CHECK_THROWS_WITH(data::MelInfo::from_json(missing), Catch::Contains("frame_shift"));
  nlohmann::json hostile = j;
  hostile["num_mel_bins"] = 1000000;
  CHECK_THROWS_AS(data::MelInfo::from_json(hostile).mel_args(), FormatError);
  nlohmann::json other = j;
  other["window_type"] = "povey";
  CHECK_THAT(data::MelInfo::from_json(other).first_difference(fb, "x", "y"),
             Catch::Contains("window_type is 'povey' in x but 'hamming' in y"));
}

}  // namespace melforge_test_fbank_build
