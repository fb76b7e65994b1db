// The command-line conventions of issue 16 in melforge-build: flags spelled the torchaudio way (--n_fft, --norm) are
// read as the registered flag, on the command line and in a --config file; an unknown flag or key names the nearest
// one ("did you mean --n-fft?") and fails with exit 2 before any work; value names are read in any letter case.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <sys/stat.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench.h"
#include "build_cli.h"
#include "melforge/common/flags.h"
#include "merge.h"
#include "reliability/child_process.h"
#include "reliability/corpus.h"
#include "test_skip.h"
#include "test_util.h"

namespace melforge_test_flag_conventions {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

/// Every parsed field a flag of the table below sets, as one line, to compare two parses.
std::string summary(const builder::BuildConfig& c) {
  std::ostringstream s;
  s << c.mel.to_string() << " split=" << c.build.split << " max_ram=" << c.build.max_ram
    << " overwrite=" << c.build.overwrite << " frames_per_chunk=" << c.build.frames_per_chunk
    << " max=" << c.clips.max_seconds << " short=" << c.clips.short_seconds << " channel=" << c.decode.channel;
  return s.str();
}

/// `args` parsed as melforge-build parses its command line (no --help expected); parse errors propagate.
builder::BuildConfig parsed(const std::vector<std::string>& args) {
  builder::BuildConfig config;
  std::string config_file;
  po::options_description all;
  builder::add_build_groups(all, config, config_file);
  std::ostringstream help;
  const bool not_help = builder::parse_build_args(args, all, help);
  CHECK(not_help);
  return config;
}

/// The message of the boost::program_options::error that parsing `args` throws ("" when none).
std::string parse_error(const std::vector<std::string>& args) {
  try {
    parsed(args);
  } catch (const po::error& e) {
    return e.what();
  }
  return "";
}

/// Every long name (canonical and alias) registered in `desc`.
std::vector<std::string> long_names(const po::options_description& desc) {
  std::vector<std::string> out;
  for (const auto& option : desc.options()) {
    const auto [names, count] = option->long_names();
    for (std::size_t i = 0; i < count; ++i)
      if (!names[i].empty()) out.push_back(names[i]);
  }
  return out;
}

/// The options melforge-build, `melforge-build bench` and `melforge-build merge` register, by sub-command.
std::vector<std::pair<std::string, po::options_description>> build_descriptions() {
  static builder::BuildConfig config;
  static builder::BenchOptions bench;
  static builder::MergeOptions merge;
  static std::string config_file;
  std::vector<std::pair<std::string, po::options_description>> out;
  out.emplace_back("build", po::options_description());
  builder::add_build_groups(out.back().second, config, config_file);
  out.emplace_back("bench", po::options_description());
  builder::add_build_groups(out.back().second, config, config_file);
  builder::add_options(out.back().second, bench);
  out.emplace_back("merge", po::options_description());
  out.back().second.add_options()("help,h", "show this help and exit");
  builder::add_options(out.back().second, merge);
  return out;
}

/// The proper prefixes of `name` (at least 2 characters) that are neither a registered name nor one with '_' for
/// '-' (`--n-mel` of `--n-mels`, `--long-sec` of `--long-seconds`).
std::vector<std::string> prefixes(const std::string& name, const po::options_description& desc) {
  std::vector<std::string> out;
  for (std::size_t n = 2; n < name.size(); ++n)
    if (canonical_flag(name.substr(0, n), desc).empty()) out.push_back(name.substr(0, n));
  return out;
}

}  // namespace

TEST_CASE("a prefix of a flag is never taken for the flag, on the command line or in a --config file",
          "[flags][untrusted]") {
  TempDir d;
  std::size_t tried = 0;
  for (const auto& [command, desc] : build_descriptions()) {
    for (const std::string& name : long_names(desc)) {
      for (const std::string& prefix : prefixes(name, desc)) {
        CAPTURE(command, name, prefix);
        ++tried;
        CHECK_THROWS_WITH(parse_flags({"--" + prefix, "1"}, desc),
                          Catch::StartsWith("unrecognised option '--" + prefix + "'; did you mean --"));
        CHECK_THROWS_WITH(parse_flags({"--" + prefix + "=1"}, desc),
                          Catch::StartsWith("unrecognised option '--" + prefix + "'"));
        CHECK_THROWS_WITH(canonical_config(prefix + " = 1\n", desc, "c.ini"),
                          Catch::StartsWith("unrecognised option '" + prefix + "' in c.ini"));
      }
    }
  }
  CHECK(tried > 500);
  CHECK(parse_error({"--n-mel", "32"}) == "unrecognised option '--n-mel'; did you mean --n-mels?");
  CHECK(parse_error({"--long-sec", "5"}) == "unrecognised option '--long-sec'; did you mean --long-seconds?");
  CHECK(parse_error({"--n_mel=32"}) == "unrecognised option '--n_mel'; did you mean --n-mels?");
  test::write_text(d / "p.ini", "n-mel = 32\n");
  CHECK(parse_error({"--config", (d / "p.ini").string()}) ==
        "unrecognised option 'n-mel' in --config file '" + (d / "p.ini").string() + "'; did you mean n-mels?");
  CHECK((strict_command_line_style() & po::command_line_style::allow_guessing) == 0);
  CHECK(parsed({"--n-mels", "32"}).mel.n_mels == 32);
}

TEST_CASE("a --config that is a FIFO, a device or a folder is refused before reading", "[flags][untrusted]") {
  TempDir d;
  const fs::path fifo = d / "fifo.ini";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string path = GENERATE(as<std::string>{}, "/dev/zero", "FIFO", "FOLDER");
  const std::string given = path == "FIFO" ? fifo.string() : path == "FOLDER" ? d.path().string() : path;
  CAPTURE(given);
  CHECK_THROWS_AS(parsed({"--config", given}), InvalidArgument);
  CHECK_THROWS_WITH(parsed({"--config", given}), Catch::Contains("--config") && Catch::Contains("regular file"));
}

TEST_CASE("torchaudio spellings of the flags set the same fields as the dashed ones", "[flags]") {
  const auto row = GENERATE(table<std::string, std::string, std::string>({
      {"n_fft", "n-fft", "1024"},
      {"hop_length", "hop-length", "100"},
      {"win_length", "win-length", "300"},
      {"sample_rate", "sample-rate", "22050"},
      {"n_mels", "n-mels", "40"},
      {"f_min", "f-min", "20"},
      {"f_max", "f-max", "7000"},
      {"mel_scale", "mel-scale", "slaney"},
      {"pad_mode", "pad-mode", "constant"},
      {"norm", "mel-norm", "slaney"},
      {"mel_norm", "mel-norm", "slaney"},
      {"window_fn", "window", "hamming"},
      {"log_eps", "log-eps", "0.001"},
      {"max_ram", "max-ram", "1G"},
      {"frames_per_chunk", "frames-per-chunk", "7"},
      {"max_seconds", "max-seconds", "3"},
      {"short_seconds", "short-seconds", "0.5"},
  }));
  const std::string& alias = std::get<0>(row);
  const std::string& canonical = std::get<1>(row);
  const std::string& value = std::get<2>(row);
  const bool equals_form = GENERATE(false, true);
  CAPTURE(alias, equals_form);
  const auto args = [&](const std::string& name) {
    return equals_form ? std::vector<std::string>{"--" + name + "=" + value}
                       : std::vector<std::string>{"--" + name, value};
  };
  const std::string by_alias = summary(parsed(args(alias)));
  CHECK(by_alias == summary(parsed(args(canonical))));
  CHECK(by_alias != summary(parsed({})));
  CHECK(parsed({"--include_hidden"}).build.include_hidden);
  CHECK(parsed({"--compression_level=7"}).build.compression_level == 7);
}

TEST_CASE("value names are read in any letter case, and a wrong one is still refused", "[flags]") {
  CHECK(mel::parse_mel_norm("Slaney") == mel::MelNorm::slaney);
  CHECK(mel::parse_mel_norm("NONE") == mel::MelNorm::none);
  CHECK(mel::parse_mel_scale("HTK") == mel::MelScale::htk);
  CHECK(mel::parse_mel_scale("Slaney") == mel::MelScale::slaney);
  CHECK(mel::parse_window("Hann") == mel::Window::hann);
  CHECK(mel::parse_window("HAMMING") == mel::Window::hamming);
  CHECK(mel::parse_pad_mode("Reflect") == mel::PadMode::reflect);
  CHECK(mel::parse_pad_mode("Constant") == mel::PadMode::constant);
  CHECK(mel::parse_log_mode("DB") == mel::LogMode::db);
  CHECK(mel::parse_dtype("Float32") == mel::DType::float32);
  CHECK_THROWS_AS(mel::parse_mel_norm("slaneyy"), InvalidArgument);
  CHECK_THROWS_AS(mel::parse_window("hanning"), InvalidArgument);
  const auto c = parsed({"--norm", "Slaney", "--mel_scale", "HTK", "--window", "Hann", "--pad-mode", "Reflect"});
  CHECK(c.mel.mel_norm == mel::MelNorm::slaney);
  CHECK(c.mel.mel_scale == mel::MelScale::htk);
  CHECK(c.mel.window == mel::Window::hann);
  CHECK(c.mel.pad_mode == mel::PadMode::reflect);
}

TEST_CASE("an unknown flag names the nearest registered one", "[flags]") {
  const auto [flag, expected] = GENERATE(table<std::string, std::string>({
      {"--nfft", "unrecognised option '--nfft'; did you mean --n-fft?"},
      {"--hop_lenght", "unrecognised option '--hop_lenght'; did you mean --hop-length?"},
      {"--samplerate", "unrecognised option '--samplerate'; did you mean --sample-rate?"},
      {"--nmels", "unrecognised option '--nmels'; did you mean --n-mels?"},
      {"--nrom", "unrecognised option '--nrom'; did you mean --norm?"},
      {"--xyzzy", "unrecognised option '--xyzzy'"},
  }));
  CAPTURE(flag);
  CHECK(parse_error({flag, "1"}) == expected);
  CHECK(parse_error({flag + "=1"}) == expected);
  CHECK_THROWS_WITH(parsed({"--mel", "htk"}), "unrecognised option '--mel'; did you mean --mel-norm?");
  CHECK(edit_distance("n-fft", "nfft") == 1);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("config file keys take the same spellings, and an unknown key names the nearest one", "[flags]") {
  TempDir d;
  test::write_text(d / "a.ini", "n_fft = 128\nnorm = Slaney\n# hop_lenght = 3\n\nmax_seconds=3\n");
  const auto c = parsed({"--config", (d / "a.ini").string()});
  CHECK(c.mel.n_fft == 128);
  CHECK(c.mel.mel_norm == mel::MelNorm::slaney);
  CHECK(c.clips.max_seconds == 3.0);
  test::write_text(d / "b.ini", "n-fft = 128\nnfft = 256\n");
  CHECK(parse_error({"--config", (d / "b.ini").string()}) ==
        "unrecognised option 'nfft' in --config file '" + (d / "b.ini").string() + "'; did you mean n-fft?");
}

TEST_CASE("the removed segment flags are refused in every spelling, naming --max-seconds", "[flags]") {
  const auto [flag, value] = GENERATE(table<std::string, std::string>({
      {"num-long", "3"},
      {"num_long", "auto"},
      {"long-seconds", "2"},
      {"long_seconds", "1"},
      {"short-files", "skip"},
      {"short_files", "pad"},
  }));
  CAPTURE(flag);
  CHECK_THROWS_AS(parsed({"--" + flag, value}), InvalidArgument);
  CHECK_THROWS_WITH(parsed({"--" + flag + "=" + value}),
                    Catch::Contains("stores every clip whole") && Catch::Contains("--max-seconds"));
  TempDir d;
  test::write_text(d / "c.ini", flag + " = " + value + "\n");
  CHECK_THROWS_WITH(parsed({"--config", (d / "c.ini").string()}),
                    Catch::Contains("stores every clip whole") && Catch::Contains("--max-seconds"));
  CHECK(parsed({"--max_seconds", "2.5"}).clips.max_seconds == 2.5);
  CHECK(parsed({}).clips.max_seconds == 0);
}

TEST_CASE("melforge-build reads the aliases, and refuses an unknown flag with exit 2 before any work", "[flags]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const auto alias = test::run_child(
      test::build_args(d / "in", d / "out", {"--norm", "Slaney", "--mel_scale", "HTK", "--win_length=200"}),
      d / "log.txt");
  INFO(alias.output);
  REQUIRE(alias.exit_code == 0);
  const auto report = nlohmann::json::parse(test::read_file_bytes(d / "out" / "build_report.json"));
  CHECK(report["config"]["mel_norm"] == "slaney");
  CHECK(report["config"]["mel_scale"] == "htk");
  CHECK(report["config"]["win_length"] == 200);

  const std::string flag = GENERATE(std::string("--nfft"), std::string("--mel"));
  const auto unknown = test::run_child(test::build_args(d / "in", d / "bad", {flag, "256"}), d / "log2.txt");
  INFO(unknown.output);
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.output,
             Catch::Contains(flag == "--nfft" ? "did you mean --n-fft?" : "'--mel'; did you mean --mel-norm?"));
  CHECK_FALSE(fs::exists(d / "bad"));

  const auto help = test::run_child({MELFORGE_BUILD_EXE, "--help"}, d / "help.txt");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.output, Catch::Contains("--n-fft arg") && Catch::Contains("--mel-norm arg") &&
                              !Catch::Contains("--n_fft arg") && !Catch::Contains("--norm arg"));
}

}  // namespace melforge_test_flag_conventions
