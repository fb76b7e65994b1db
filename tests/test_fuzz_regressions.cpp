// Regression tests for the bugs the libFuzzer targets of tests/fuzz found (docs/RELIABILITY.md, "Fuzzing"). The
// inputs that found them are also in the seed corpora (tests/fuzz/corpus/<target>/regress_* and
// float_near_max_44k), which the sanitizer build replays as tests.
#include <sndfile.h>

#include <boost/program_options.hpp>
#include <catch2/catch.hpp>
#include <climits>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "audio/decode.h"
#include "build_options.h"
#include "mel/mel_args.h"
#include "melforge/common/errors.h"
#include "segment/segment_args.h"
#include "test_util.h"

namespace melforge_test_fuzz_regressions {

namespace fs = std::filesystem;
using melforge::test::TempDir;

namespace {

/// Writes mono float32 WAV samples at `rate`.
void write_float_wav(const fs::path& path, int rate, const std::vector<float>& samples) {
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = 1;
  info.format = SF_FORMAT_WAV | SF_FORMAT_FLOAT;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  REQUIRE(f != nullptr);
  const sf_count_t written = sf_writef_float(f, samples.data(), static_cast<sf_count_t>(samples.size()));
  REQUIRE(sf_close(f) == 0);
  REQUIRE(written == static_cast<sf_count_t>(samples.size()));
}

}  // namespace

TEST_CASE("a float file with finite samples too large to mix, resample or square is rejected", "[decode][fuzz]") {
  TempDir dir;
  const fs::path path = dir / "huge.wav";
  const float amplitude = GENERATE(3e38f, 1e7f);
  const int target = GENERATE(44100, 16000);
  std::vector<float> samples(2205);
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = (i / 3) % 2 ? amplitude : -amplitude;
  samples[0] = 0.5f;
  write_float_wav(path, 44100, samples);
  melforge::audio::DecodeOptions opts;
  opts.sample_rate = target;
  CHECK_THROWS_WITH(melforge::audio::decode(path, opts),
                    Catch::Contains("sample value") && Catch::Contains("at frame 1,") && Catch::Contains("1e6"));
}

TEST_CASE("a float file within +-1e6 decodes to finite samples, resampled or not", "[decode][fuzz]") {
  TempDir dir;
  const fs::path path = dir / "loud.wav";
  std::vector<float> samples(2205);
  for (size_t i = 0; i < samples.size(); ++i) samples[i] = (i / 3) % 2 ? 1e6f : -1e6f;
  write_float_wav(path, 44100, samples);
  melforge::audio::DecodeOptions opts;
  opts.sample_rate = GENERATE(44100, 16000);
  const auto audio = melforge::audio::decode(path, opts);
  REQUIRE(!audio.samples.empty());
  for (float x : audio.samples) REQUIRE(std::isfinite(x));
}

TEST_CASE("a --max-ram beyond int64 is an invalid argument, not an overflowing conversion", "[options][fuzz]") {
  using melforge::builder::parse_byte_size;
  CHECK_THROWS_AS(parse_byte_size("1e300", "--max-ram"), melforge::InvalidArgument);
  CHECK_THROWS_WITH(parse_byte_size("8388608T", "--max-ram"), Catch::Contains("too large"));
  CHECK(parse_byte_size("8388607T", "--max-ram") == int64_t{8388607} << 40);
}

TEST_CASE("n_fft and n_mels are bounded before the filterbank is built", "[mel_args][fuzz]") {
  melforge::mel::MelArgs args;
  args.n_mels = INT_MAX;
  CHECK_THROWS_WITH(args.validate(), Catch::Contains("too large for n_fft"));
  args = {};
  args.n_fft = 1 << 30;
  CHECK_THROWS_WITH(args.validate(), Catch::Contains("n_fft must be in [2, 65536]"));
  args = {};
  args.n_fft = melforge::mel::MelArgs::kMaxNfft;
  args.n_mels = 32;
  CHECK_NOTHROW(args.validate());
}

TEST_CASE("a long segment of 2^31 samples or more is an invalid argument", "[segment][fuzz]") {
  melforge::segment::SegmentArgs args;
  args.long_seconds = GENERATE(1e300, 1e6, 134218.0);
  CHECK_THROWS_WITH(args.validate(16000), Catch::Contains("2^31 samples or more"));
  args.long_seconds = 134217.0;
  CHECK_NOTHROW(args.validate(16000));
  CHECK(args.num_short(16000) == static_cast<int>(std::llround(134217.0 * 16000) / 4000));
}

TEST_CASE("a default tile or a cap of 2^31 samples or more is an invalid argument", "[options][fuzz]") {
  melforge::builder::ClipOptions clips;
  clips.short_seconds = GENERATE(1e300, 134218.0, std::nan(""), 0.0);
  CHECK_THROWS_WITH(clips.validate(16000, 160), Catch::Contains("--short-seconds"));
  clips.short_seconds = 134217.0;
  CHECK_NOTHROW(clips.validate(16000, 160));
  CHECK(clips.tile_frames(16000, 160) == std::llround(134217.0 * 16000 / 160));
  clips.max_seconds = GENERATE(1e300, -1.0, std::nan(""));
  CHECK_THROWS_WITH(clips.validate(16000, 160), Catch::Contains("--max-seconds"));
}

TEST_CASE("the segment layout's flags are refused whatever their value", "[options][fuzz]") {
  namespace po = boost::program_options;
  const std::string flag = GENERATE("num-long", "long-seconds", "short-files");
  const std::string value = GENERATE("1", "1e300", "auto");
  melforge::builder::ClipOptions clips;
  po::options_description desc;
  melforge::builder::add_options(desc, clips);
  std::istringstream in(flag + " = " + value + "\n");
  po::variables_map vm;
  po::store(po::parse_config_file(in, desc), vm);
  CHECK_THROWS_WITH(po::notify(vm), Catch::Contains("--" + flag) && Catch::Contains("--max-seconds"));
}

}  // namespace melforge_test_fuzz_regressions
