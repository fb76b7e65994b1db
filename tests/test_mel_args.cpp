// MelArgs: enum spellings, stream operators, the command-line options and to_string.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "mel/mel_args.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge_test_mel_args {

using namespace melforge;
using namespace melforge::mel;
namespace po = boost::program_options;

namespace {

/// Parses `argv` (without the program name) into a copy of `start` through add_options.
MelArgs parse_flags(const std::vector<std::string>& flags, MelArgs start = {}) {
  po::options_description desc("mel");
  add_options(desc, start);
  std::vector<const char*> argv{"prog"};
  for (const auto& f : flags) argv.push_back(f.c_str());
  po::variables_map vm;
  po::store(po::parse_command_line(static_cast<int>(argv.size()), argv.data(), desc), vm);
  po::notify(vm);
  return start;
}

template <class E>
void check_round_trip(const std::vector<E>& values, E (*parse)(const std::string&)) {
  for (E v : values) {
    CHECK(parse(to_string(v)) == v);
    std::ostringstream out;
    out << v;
    CHECK(out.str() == to_string(v));
    std::istringstream in(out.str());
    E read{};
    in >> read;
    CHECK(read == v);
  }
}

}  // namespace

TEST_CASE("enum spellings round-trip", "[args]") {
  check_round_trip<Window>({Window::hann, Window::hamming}, parse_window);
  check_round_trip<PadMode>({PadMode::reflect, PadMode::constant}, parse_pad_mode);
  check_round_trip<MelScale>({MelScale::htk, MelScale::slaney}, parse_mel_scale);
  check_round_trip<MelNorm>({MelNorm::none, MelNorm::slaney}, parse_mel_norm);
  check_round_trip<LogMode>({LogMode::db, LogMode::ln, LogMode::none}, parse_log_mode);
  check_round_trip<DType>({DType::float16, DType::float32}, parse_dtype);
  check_round_trip<Device>({Device::auto_select, Device::cpu, Device::cuda}, parse_device);
  CHECK(to_string(Window::hann) == "hann");
  CHECK(to_string(LogMode::db) == "db");
  CHECK(to_string(DType::float16) == "float16");
  CHECK(to_string(Device::auto_select) == "auto");
}

TEST_CASE("enum parse errors list the accepted values", "[args]") {
  CHECK_THROWS_AS(parse_window("hanning"), InvalidArgument);
  CHECK_THROWS_WITH(parse_window("hanning"), Catch::Contains("hann, hamming"));
  CHECK_THROWS_WITH(parse_pad_mode("zero"), Catch::Contains("reflect, constant"));
  CHECK_THROWS_WITH(parse_mel_scale("mel"), Catch::Contains("htk, slaney"));
  CHECK(parse_mel_scale("HTK") == MelScale::htk);
  CHECK_THROWS_WITH(parse_mel_norm(""), Catch::Contains("none, slaney"));
  CHECK_THROWS_WITH(parse_log_mode("log10"), Catch::Contains("db, ln, none"));
  CHECK_THROWS_WITH(parse_dtype("fp16"), Catch::Contains("float16, float32"));
  CHECK_THROWS_WITH(parse_device("gpu"), Catch::Contains("auto, cpu, cuda"));
  std::istringstream in("bogus");
  LogMode mode = LogMode::db;
  CHECK_THROWS_AS(in >> mode, InvalidArgument);
}

TEST_CASE("add_options binds every flag to its field", "[args]") {
  const MelArgs a = parse_flags({"--sample-rate", "22050", "--n-fft", "1024", "--win-length", "800", "--hop-length",
                                 "220", "--window", "hamming", "--center", "false", "--pad-mode", "constant",
                                 "--power", "1", "--n-mels", "80", "--f-min", "30.5", "--f-max", "11000",
                                 "--mel-scale", "slaney", "--mel-norm", "slaney", "--log", "ln", "--amin", "1e-8",
                                 "--log-eps", "0.001"});
  CHECK(a.sample_rate == 22050);
  CHECK(a.n_fft == 1024);
  CHECK(a.win_length == 800);
  CHECK(a.hop_length == 220);
  CHECK(a.window == Window::hamming);
  CHECK_FALSE(a.center);
  CHECK(a.pad_mode == PadMode::constant);
  CHECK(a.power == 1.0f);
  CHECK(a.n_mels == 80);
  CHECK(a.f_min == 30.5f);
  CHECK(a.f_max == 11000.0f);
  CHECK(a.mel_scale == MelScale::slaney);
  CHECK(a.mel_norm == MelNorm::slaney);
  CHECK(a.log == LogMode::ln);
  CHECK(a.amin == 1e-8f);
  CHECK(a.log_eps == 0.001f);
  CHECK(parse_flags({"--center", "true"}, a).center);
}

TEST_CASE("add_options keeps unset fields and rejects bad values", "[args]") {
  MelArgs start;
  start.n_mels = 40;
  start.log = LogMode::none;
  const MelArgs a = parse_flags({"--n-fft", "256"}, start);
  CHECK(a.n_fft == 256);
  CHECK(a.n_mels == 40);
  CHECK(a.log == LogMode::none);
  CHECK(a.sample_rate == 16000);
  CHECK_THROWS_AS(parse_flags({"--window", "blackman"}), InvalidArgument);
  CHECK_THROWS(parse_flags({"--n-fft", "abc"}));
  CHECK_THROWS(parse_flags({"--center", "maybe"}));

  po::options_description desc("mel");
  add_options(desc, start);
  std::ostringstream help;
  help << desc;
  for (const char* flag : {"--sample-rate", "--n-fft", "--win-length", "--hop-length", "--window", "--center",
                           "--pad-mode", "--power", "--n-mels", "--f-min", "--f-max", "--mel-scale", "--mel-norm",
                           "--log", "--amin", "--log-eps"}) {
    CHECK_THAT(help.str(), Catch::Contains(flag));
  }
  CHECK_THAT(help.str(), Catch::Contains("(=40)") && Catch::Contains("(=none)") && Catch::Contains("(=true)") &&
                             Catch::Contains("(=1e-10)"));
}

TEST_CASE("to_string shows the effective parameters", "[args]") {
  MelArgs a;
  const std::string s = a.to_string();
  CHECK_THAT(s, Catch::Contains("n_fft=512") && Catch::Contains("win_length=512") &&
                    Catch::Contains("hop_length=256") && Catch::Contains("f_max=8000") &&
                    Catch::Contains("center=true") && Catch::Contains("log=db") && Catch::Contains("amin=1e-10"));
  a.win_length = 400;
  a.f_max = 7600.0f;
  CHECK_THAT(a.to_string(), Catch::Contains("hop_length=200") && Catch::Contains("f_max=7600"));
}

}  // namespace melforge_test_mel_args
