// libFuzzer target: the INI-style --config file of melforge-build. The input is the file's text; it is parsed with
// Boost.Program_options' parse_config_file against the same options melforge-build registers (builder/build_cli.h),
// after canonical_config rewrote its keys (common/flags.h),
// notified into a BuildConfig and validated (BuildConfig::validate). --input and --output are preset to an empty
// scratch folder and a missing path below it, so most inputs reach the checks of the other options. Checks,
// besides crashes and sanitizer reports: the only errors are InvalidArgument and Boost.Program_options errors (as
// melforge-build reports them), and a configuration that validates gives sane derived sizes. The segment layout's
// flags (--num-long, --long-seconds, --short-files) are refused with InvalidArgument since schema 3. Issue 29: every
// key of an accepted file is a registered name or alias (canonical_flag finds it): a prefix of a flag is never taken
// for the flag.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "build_cli.h"
#include "build_options.h"
#include "fuzz_util.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"

namespace po = boost::program_options;
using melforge::fuzz::require;

namespace {

/// An empty folder for --input, removed at exit.
struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/melforge-fuzz-config-XXXXXX";
    require(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
    dir = pattern;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

const std::filesystem::path& scratch() {
  static const Scratch s;
  return s.dir;
}

void check_derived(const melforge::builder::BuildConfig& c) {
  const int sr = c.mel.sample_rate;
  const int64_t S = c.clips.short_samples(sr);
  require(S >= 1, "validated config has short_samples < 1");
  require(c.clips.tile_frames(sr, c.mel.hop()) >= 1, "validated config gives no frame per default tile");
  require(c.clips.max_samples(sr) >= 0, "validated config has a negative --max-seconds in samples");
  require(c.clips.max_seconds == 0 || c.clips.max_samples(sr) >= 1, "validated --max-seconds caps at no sample");
  require(c.build.max_ram_bytes() >= 0, "validated config has a negative --max-ram");
  const auto r = c.build.split_ratios();
  require(r.size() == 3, "split_ratios does not give three ratios");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  melforge::builder::BuildConfig config;
  config.build.input = scratch();
  config.build.output = scratch() / "out";
  std::string config_file;
  po::options_description all("melforge-build");
  melforge::builder::add_build_groups(all, config, config_file);

  try {
    std::istringstream in(melforge::canonical_config(std::string(reinterpret_cast<const char*>(data), size), all,
                                                     "the config file"));
    po::variables_map vm;
    const po::parsed_options parsed = po::parse_config_file(in, all);
    for (const auto& option : parsed.options)
      require(!melforge::canonical_flag(option.string_key, all).empty(), "a key that names no flag was accepted");
    po::store(parsed, vm);
    po::notify(vm);
    config.validate();
  } catch (const melforge::InvalidArgument&) {
    return 0;
  } catch (const po::error&) {
    return 0;
  }
  check_derived(config);
  return 0;
}
