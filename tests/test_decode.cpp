// Tests for melforge::audio (kernels/audio/decode.h). Every input file is written here, with libsndfile's writer or
// by hand, into a fresh temporary folder: there are no binary fixtures.
#include <fcntl.h>
#include "melforge_test_paths.h"
#include <grp.h>
#include <sndfile.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <numbers>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "audio/decode.h"
#include "featurize/featurize.h"
#include "melforge/common/errors.h"
#include "reliability/child_process.h"
#include "test_skip.h"

namespace melforge_test_decode {

namespace fs = std::filesystem;
using melforge::AudioError;
using melforge::audio::AudioInfo;
using melforge::audio::decode;
using melforge::audio::DecodedAudio;
using melforge::audio::DecodeOptions;
using melforge::audio::output_frames;
using melforge::audio::probe;

namespace {

/// A fresh folder under the system temp dir, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "melforge_test_decode_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

/// Opens `path` for writing with libsndfile, or fails the test.
SNDFILE* open_for_write(const fs::path& path, int format, int channels, int rate) {
  SF_INFO info{};
  info.format = format;
  info.channels = channels;
  info.samplerate = rate;
  REQUIRE(sf_format_check(&info) == SF_TRUE);
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  INFO("sf_open for writing " << path << ": " << sf_strerror(nullptr));
  REQUIRE(f != nullptr);
  return f;
}

/// Writes interleaved [frames][channels] floats as they are (no clipping or scaling for float formats).
void write_float(const fs::path& path, int format, int channels, int rate, const std::vector<float>& data) {
  SNDFILE* f = open_for_write(path, format, channels, rate);
  const auto frames = static_cast<sf_count_t>(data.size() / static_cast<size_t>(channels));
  const sf_count_t written = sf_writef_float(f, data.data(), frames);
  REQUIRE(sf_close(f) == 0);
  REQUIRE(written == frames);
}

/// Writes interleaved [frames][channels] left-aligned 32-bit integers; libsndfile keeps the top `bits` bits.
void write_int(const fs::path& path, int format, int channels, int rate, const std::vector<int>& data) {
  SNDFILE* f = open_for_write(path, format, channels, rate);
  const auto frames = static_cast<sf_count_t>(data.size() / static_cast<size_t>(channels));
  const sf_count_t written = sf_writef_int(f, data.data(), frames);
  REQUIRE(sf_close(f) == 0);
  REQUIRE(written == frames);
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

/// Byte offset of the 8-byte header of RIFF chunk `id` in a WAV file, found by walking the chunk list.
size_t riff_chunk_offset(const std::vector<char>& bytes, const std::string& id) {
  size_t pos = 12;
  while (pos + 8 <= bytes.size()) {
    uint32_t size = 0;
    for (int i = 3; i >= 0; --i) size = (size << 8) | static_cast<unsigned char>(bytes[pos + 4 + static_cast<size_t>(i)]);
    if (std::string(bytes.data() + pos, 4) == id) return pos;
    pos += 8 + size + (size & 1u);
  }
  FAIL("no " << id << " chunk");
  return 0;
}

void patch_u32le(std::vector<char>& bytes, size_t pos, uint32_t value) {
  for (size_t i = 0; i < 4; ++i) bytes[pos + i] = static_cast<char>((value >> (8 * i)) & 0xFFu);
}

/// Runs `fn`, requires an AudioError whose message starts with "<path>: " and contains `needle`.
void require_audio_error(const std::function<void()>& fn, const fs::path& path, const std::string& needle) {
  try {
    fn();
  } catch (const AudioError& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    CHECK(msg.rfind(path.string() + ": ", 0) == 0);
    CHECK(msg.find(needle) != std::string::npos);
    return;
  }
  FAIL("no AudioError thrown for " << path << " (expected '" << needle << "')");
}

/// What probe() and decode() said about one file: the AudioError's message, "no error", or "other error: <what>".
struct ProbeDecodeOutcome {
  /// probe(path)'s outcome.
  std::string probe;
  /// decode(path, DecodeOptions{})'s outcome.
  std::string decode;
};

/// Runs probe() and decode() on `path` in a child process that first drops to uid and gid 65534 (root's reads
/// bypass file permissions, so chmod 000 blocks nothing for it). std::nullopt when the child could not drop its
/// privileges.
std::optional<ProbeDecodeOutcome> probe_and_decode_as_nobody(const fs::path& path) {
  melforge::test::ChildOptions as;
  as.uid = 65534;
  const auto text = melforge::test::run_in_child([&] {
    const auto outcome = [](const std::function<void()>& fn) -> std::string {
      try {
        fn();
        return "no error";
      } catch (const AudioError& e) {
        return e.what();
      } catch (const std::exception& e) {
        return std::string("other error: ") + e.what();
      }
    };
    return outcome([&] { probe(path); }) + '\0' + outcome([&] { decode(path, DecodeOptions{}); });
  }, as);
  if (!text) return std::nullopt;
  const auto sep = text->find('\0');
  REQUIRE(sep != std::string::npos);
  return ProbeDecodeOutcome{text->substr(0, sep), text->substr(sep + 1)};
}

/// Deterministic integer samples covering [-2^(bits-1), 2^(bits-1)-1], both extremes included.
std::vector<int64_t> pcm_values(int bits, size_t count, uint32_t seed) {
  const int64_t lo = -(int64_t{1} << (bits - 1));
  const int64_t hi = (int64_t{1} << (bits - 1)) - 1;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<int64_t> v(count);
  for (auto& x : v) x = dist(rng);
  if (count >= 2) {
    v[0] = lo;
    v[1] = hi;
  }
  return v;
}

/// Left-aligns a `bits`-bit sample into the int libsndfile's sf_writef_int expects.
int left_align(int64_t value, int bits) {
  return static_cast<int>(static_cast<uint32_t>(static_cast<int32_t>(value)) << (32 - bits));
}

/// Naive reference of mix-down: the mean of the channels of each frame, in double.
std::vector<double> mean_of_channels(const std::vector<double>& interleaved, int channels) {
  std::vector<double> out(interleaved.size() / static_cast<size_t>(channels), 0.0);
  for (size_t f = 0; f < out.size(); ++f) {
    double sum = 0.0;
    for (int c = 0; c < channels; ++c) sum += interleaved[f * static_cast<size_t>(channels) + static_cast<size_t>(c)];
    out[f] = sum / channels;
  }
  return out;
}

std::vector<float> sine(double freq, double amp, int rate, int64_t frames, double phase = 0.0) {
  std::vector<float> out(static_cast<size_t>(frames));
  for (int64_t n = 0; n < frames; ++n) {
    out[static_cast<size_t>(n)] =
        static_cast<float>(amp * std::sin(2.0 * std::numbers::pi * freq * static_cast<double>(n) / rate + phase));
  }
  return out;
}

/// Frequency from the first and last upward zero crossings, each located by linear interpolation.
double zero_crossing_frequency(const std::vector<float>& x, size_t begin, size_t end, int rate) {
  double first = -1.0;
  double last = -1.0;
  int crossings = 0;
  for (size_t i = begin; i + 1 < end; ++i) {
    if (x[i] < 0.0f && x[i + 1] >= 0.0f) {
      const double t = static_cast<double>(i) + x[i] / (x[i] - x[i + 1]);
      if (first < 0.0) first = t;
      last = t;
      ++crossings;
    }
  }
  REQUIRE(crossings >= 2);
  return (crossings - 1) * rate / (last - first);
}

struct PcmFormat {
  const char* name;
  int format;
  int bits;
};

const PcmFormat kPcmFormats[] = {
    {"WAV PCM_U8", SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 8},     {"WAV PCM_16", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16},
    {"WAV PCM_24", SF_FORMAT_WAV | SF_FORMAT_PCM_24, 24},    {"WAV PCM_32", SF_FORMAT_WAV | SF_FORMAT_PCM_32, 32},
    {"FLAC PCM_S8", SF_FORMAT_FLAC | SF_FORMAT_PCM_S8, 8},   {"FLAC PCM_16", SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16},
    {"FLAC PCM_24", SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 24},  {"AIFF PCM_16", SF_FORMAT_AIFF | SF_FORMAT_PCM_16, 16},
    {"W64 PCM_24", SF_FORMAT_W64 | SF_FORMAT_PCM_24, 24},
};

}  // namespace

TEST_CASE("integer PCM decodes to k / 2^(bits-1), mixed down or picked per channel", "[decode]") {
  const auto fmt_index = GENERATE(range(size_t{0}, std::size(kPcmFormats)));
  const PcmFormat& fmt = kPcmFormats[fmt_index];
  const int channels = GENERATE(1, 2, 3, 5, 8);
  const int rate = 16000;
  const int64_t frames = 2999;
  INFO(fmt.name << ", " << channels << " channels");

  TempDir dir;
  const fs::path path = dir / "pcm.wav";
  const auto values = pcm_values(fmt.bits, static_cast<size_t>(frames * channels), 1234u + fmt_index * 10u + channels);
  std::vector<int> aligned(values.size());
  std::vector<double> expected(values.size());
  const double scale = std::ldexp(1.0, -(fmt.bits - 1));
  for (size_t i = 0; i < values.size(); ++i) {
    aligned[i] = left_align(values[i], fmt.bits);
    expected[i] = static_cast<double>(values[i]) * scale;
  }
  write_int(path, fmt.format, channels, rate, aligned);

  const AudioInfo info = probe(path);
  CHECK(info.frames == frames);
  CHECK(info.channels == channels);
  CHECK(info.sample_rate == rate);
  CHECK(info.seconds() == Approx(static_cast<double>(frames) / rate));
  CHECK(info.format.rfind(std::string(fmt.name).substr(0, std::string(fmt.name).find(' ')), 0) == 0);
  if (channels <= 2) CHECK(info.format == fmt.name);

  SECTION("mix-down is the mean of the channels") {
    const DecodedAudio audio = decode(path, DecodeOptions{rate, -1});
    REQUIRE(static_cast<int64_t>(audio.samples.size()) == frames);
    CHECK(static_cast<int64_t>(audio.samples.size()) == output_frames(audio.info, rate));
    CHECK_FALSE(audio.resampled);
    const auto ref = mean_of_channels(expected, channels);
    double max_err = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::abs(audio.samples[i] - ref[i]));
    // One channel of up to 24 bits is exact in float; 32-bit values round to float's 24-bit mantissa (2^-24), and
    // the mean of up to 8 values in [-1, 1] summed in float is off by less than 8 * 2^-24.
    const double tol = channels > 1 ? 8.0 * std::ldexp(1.0, -24) : (fmt.bits <= 24 ? 0.0 : std::ldexp(1.0, -24));
    CHECK(max_err <= tol);
    // k / 2^(bits-1) lies in [-1, 1); for 32 bits the largest values round up to exactly 1.0f.
    int out_of_range = 0;
    for (float s : audio.samples) {
      if (s < -1.0f || (fmt.bits <= 24 ? s >= 1.0f : s > 1.0f)) ++out_of_range;
    }
    CHECK(out_of_range == 0);
  }
  SECTION("picking a channel returns that channel exactly") {
    const int channel = channels - 1;
    const DecodedAudio audio = decode(path, DecodeOptions{rate, channel});
    REQUIRE(static_cast<int64_t>(audio.samples.size()) == frames);
    int mismatches = 0;
    for (int64_t f = 0; f < frames; ++f) {
      const double want = expected[static_cast<size_t>(f * channels + channel)];
      // Exact for up to 24 bits; 32-bit values round to float's 24-bit mantissa.
      const double tol = fmt.bits <= 24 ? 0.0 : std::ldexp(1.0, -24);
      if (std::abs(audio.samples[static_cast<size_t>(f)] - want) > tol) ++mismatches;
    }
    CHECK(mismatches == 0);
  }
  SECTION("a channel that is not in the file is an error") {
    require_audio_error([&] { decode(path, DecodeOptions{rate, channels}); }, path,
                        "channel " + std::to_string(channels) + " requested but the file has " +
                            std::to_string(channels));
  }
}

TEST_CASE("float and double files decode unchanged, values beyond [-1, 1] included", "[decode]") {
  const int format = GENERATE(SF_FORMAT_WAV | SF_FORMAT_FLOAT, SF_FORMAT_WAV | SF_FORMAT_DOUBLE);
  const int channels = GENERATE(1, 2, 4);
  TempDir dir;
  const fs::path path = dir / "float.wav";
  std::mt19937 rng(99u + static_cast<unsigned>(channels));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> data(static_cast<size_t>(1500 * channels));
  for (auto& x : data) x = dist(rng);
  write_float(path, format, channels, 16000, data);

  const AudioInfo info = probe(path);
  CHECK(info.format == ((format & SF_FORMAT_SUBMASK) == SF_FORMAT_FLOAT ? "WAV FLOAT" : "WAV DOUBLE"));
  const DecodedAudio audio = decode(path, DecodeOptions{16000, channels == 1 ? -1 : 1});
  REQUIRE(audio.samples.size() == 1500);
  const int channel = channels == 1 ? 0 : 1;
  int mismatches = 0;
  for (size_t f = 0; f < 1500; ++f) {
    if (audio.samples[f] != data[f * static_cast<size_t>(channels) + static_cast<size_t>(channel)]) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(*std::max_element(audio.samples.begin(), audio.samples.end()) > 1.0f);
}

TEST_CASE("OGG Vorbis decodes to the right length and close to the signal", "[decode]") {
  const int channels = GENERATE(1, 2, 6);
  TempDir dir;
  const fs::path path = dir / "tone.ogg";
  const int64_t frames = 24000;
  const auto tone = sine(500.0, 0.5, 16000, frames);
  std::vector<float> data(static_cast<size_t>(frames * channels));
  for (int64_t f = 0; f < frames; ++f) {
    for (int c = 0; c < channels; ++c) data[static_cast<size_t>(f * channels + c)] = tone[static_cast<size_t>(f)];
  }
  write_float(path, SF_FORMAT_OGG | SF_FORMAT_VORBIS, channels, 16000, data);

  const AudioInfo info = probe(path);
  CHECK(info.format == "OGG VORBIS");
  CHECK(info.frames == frames);
  const DecodedAudio audio = decode(path, DecodeOptions{16000, -1});
  REQUIRE(static_cast<int64_t>(audio.samples.size()) == frames);
  // Vorbis is lossy: require a signal-to-error ratio above 20 dB away from the edges, and the tone's frequency.
  double signal = 0.0;
  double error = 0.0;
  for (int64_t f = 1000; f < frames - 1000; ++f) {
    const double want = tone[static_cast<size_t>(f)];
    signal += want * want;
    error += (audio.samples[static_cast<size_t>(f)] - want) * (audio.samples[static_cast<size_t>(f)] - want);
  }
  CHECK(10.0 * std::log10(signal / error) > 20.0);
  CHECK(zero_crossing_frequency(audio.samples, 1000, static_cast<size_t>(frames - 1000), 16000) ==
        Approx(500.0).epsilon(1e-3));
}

TEST_CASE("resampling to 16 kHz keeps a sine's frequency and amplitude", "[decode][resample]") {
  const int rate = GENERATE(8000, 11025, 16000, 22050, 32000, 44100, 48000, 88200, 96000);
  const double freq = GENERATE(440.0, 3000.0);
  const int target = 16000;
  const double amp = 0.5;
  const int64_t frames = static_cast<int64_t>(1.2345 * rate);
  INFO(rate << " Hz, " << freq << " Hz tone");
  TempDir dir;
  const fs::path path = dir / "sine.wav";
  write_float(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 1, rate, sine(freq, amp, rate, frames));

  const AudioInfo info = probe(path);
  const DecodedAudio audio = decode(path, DecodeOptions{target, -1});
  REQUIRE(static_cast<int64_t>(audio.samples.size()) == output_frames(info, target));
  CHECK(audio.resampled == (rate != target));
  CHECK(static_cast<double>(audio.samples.size()) == Approx(frames * static_cast<double>(target) / rate).margin(1.0));

  // soxr's default filter is linear phase and soxr_oneshot removes its delay, so output sample k lies at time
  // k / 16000 and matches the analytic sine. SOXR_HQ is 20-bit precision (errors near 2^-20 ~ 1e-6 of full scale)
  // with a passband flat to 0.01 dB up to 0.913 * Nyquist of the lower rate (3.65 kHz at 8 kHz), so both tones pass
  // almost untouched: the measured error is below 1e-6. The bound 1e-4 (0.02% of the amplitude) keeps a 100x margin
  // while a wrong rate, a delay of one sample (error ~ 2*pi*f/16000*0.5 >= 0.09) or a gain error fails it. The first
  // and last 25 ms are left out: the tone starts and stops abruptly there and the filter rings.
  const auto ref = sine(freq, amp, target, static_cast<int64_t>(audio.samples.size()));
  const size_t edge = static_cast<size_t>(0.025 * target);
  const size_t end = audio.samples.size() - edge;
  double max_err = 0.0;
  double energy = 0.0;
  for (size_t k = edge; k < end; ++k) {
    max_err = std::max(max_err, std::abs(static_cast<double>(audio.samples[k]) - ref[k]));
    energy += static_cast<double>(audio.samples[k]) * audio.samples[k];
  }
  CHECK(max_err < 1e-4);
  const double measured_amp = std::sqrt(2.0 * energy / static_cast<double>(end - edge));
  // The RMS over a window that is not a whole number of periods is off by up to ~1e-4 relative.
  CHECK(measured_amp == Approx(amp).epsilon(1e-3));
  // 1.2 s of tone gives hundreds of interpolated zero crossings: their spacing pins the frequency to ~1e-6.
  CHECK(zero_crossing_frequency(audio.samples, edge, end, target) == Approx(freq).epsilon(1e-5));
}

TEST_CASE("decode returns exactly output_frames samples for awkward lengths", "[decode][resample]") {
  const int rate = GENERATE(8000, 22050, 44100, 96000);
  const int64_t frames = GENERATE(as<int64_t>{}, 1, 2, 5, 99, 1001, 44101, 70001);
  const int channels = GENERATE(1, 2);
  INFO(frames << " frames at " << rate << " Hz, " << channels << " channels");
  TempDir dir;
  const fs::path path = dir / "len.wav";
  std::vector<int> data(static_cast<size_t>(frames * channels));
  std::mt19937 rng(static_cast<unsigned>(frames + rate));
  std::uniform_int_distribution<int> dist(-20000, 20000);
  for (auto& x : data) x = left_align(dist(rng), 16);
  write_int(path, SF_FORMAT_WAV | SF_FORMAT_PCM_16, channels, rate, data);

  const AudioInfo info = probe(path);
  REQUIRE(info.frames == frames);
  const DecodedAudio audio = decode(path, DecodeOptions{16000, -1});
  CHECK(static_cast<int64_t>(audio.samples.size()) == output_frames(info, 16000));
  CHECK_FALSE(audio.samples.empty());
  for (float s : audio.samples) REQUIRE(std::isfinite(s));
}

TEST_CASE("output_frames rounds frames * target / rate to the nearest integer, at least 1", "[decode]") {
  AudioInfo info;
  info.channels = 1;
  info.sample_rate = 16000;
  info.frames = 12345;
  CHECK(output_frames(info, 16000) == 12345);
  info.sample_rate = 22050;
  info.frames = 22050;
  CHECK(output_frames(info, 16000) == 16000);
  info.frames = 22050 * 3 + 1;  // 48000.7256... -> 48001
  CHECK(output_frames(info, 16000) == 48001);
  info.sample_rate = 44100;
  info.frames = 44100 + 1;  // 16000.3628... -> 16000
  CHECK(output_frames(info, 16000) == 16000);
  info.sample_rate = 96000;
  info.frames = 1;  // 0.1666... rounds to 0, but decode never returns an empty signal
  CHECK(output_frames(info, 16000) == 1);
  info.frames = 3;  // 0.5 -> 1 (halves round up)
  CHECK(output_frames(info, 16000) == 1);
  info.frames = 9;  // 1.5 -> 2
  CHECK(output_frames(info, 16000) == 2);
  info.sample_rate = 8000;
  info.frames = int64_t{1} << 40;  // no overflow for long inputs
  CHECK(output_frames(info, 16000) == (int64_t{1} << 41));
  info.frames = 0;
  CHECK(output_frames(info, 16000) == 0);
  for (int64_t n = 1; n < 2000; n += 7) {
    info.sample_rate = 44100;
    info.frames = n;
    const double exact = static_cast<double>(n) * 16000.0 / 44100.0;
    CHECK(static_cast<double>(output_frames(info, 16000)) == Approx(std::max(1.0, std::floor(exact + 0.5))));
  }
}

TEST_CASE("hostile and broken inputs give AudioError naming the file", "[decode][errors]") {
  TempDir dir;
  const DecodeOptions opts;
  const auto both = [&](const fs::path& path, const std::string& needle) {
    INFO(path);
    require_audio_error([&] { probe(path); }, path, needle);
    require_audio_error([&] { decode(path, opts); }, path, needle);
  };

  SECTION("zero-byte file") {
    const fs::path path = dir / "empty.wav";
    write_bytes(path, {});
    both(path, "empty file");
  }
  SECTION("text file named .wav") {
    const fs::path path = dir / "text.wav";
    const std::string text = "this is not audio, just some text that happens to end in .wav\n";
    write_bytes(path, std::vector<char>(text.begin(), text.end()));
    both(path, "not an audio file: ");
  }
  SECTION("missing path") {
    both(dir / "missing.wav", "no such file");
    both(dir / "no_such_folder" / "missing.wav", "no such file");
  }
  SECTION("directory named x.wav") {
    const fs::path path = dir / "x.wav";
    fs::create_directory(path);
    both(path, "is a directory");
  }
  SECTION("FIFO named x.wav is refused without blocking") {
    const fs::path path = dir / "fifo.wav";
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    both(path, "not a regular file");
  }
  SECTION("dangling symlink") {
    const fs::path path = dir / "dangling.wav";
    fs::create_symlink(dir / "nowhere.wav", path);
    both(path, "no such file");
  }
  SECTION("WAV cut inside its header") {
    const fs::path full = dir / "full.wav";
    write_int(full, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, 16000, std::vector<int>(1000, 1 << 20));
    const auto bytes = read_bytes(full);
    const size_t cut = GENERATE(4, 12, 20, 30, 40);
    const fs::path path = dir / "cut_header.wav";
    write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut)));
    INFO("kept " << cut << " bytes");
    both(path, "not an audio file: ");
  }
  SECTION("WAV with a complete header and no data bytes") {
    const fs::path full = dir / "full.wav";
    write_int(full, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, 16000, std::vector<int>(1000, 1 << 20));
    auto bytes = read_bytes(full);
    bytes.resize(riff_chunk_offset(bytes, "data") + 8);
    const fs::path path = dir / "no_data.wav";
    write_bytes(path, bytes);
    both(path, "no audio frames");
  }
  SECTION("NaN and Inf samples in float WAVs") {
    const int format = GENERATE(SF_FORMAT_WAV | SF_FORMAT_FLOAT, SF_FORMAT_WAV | SF_FORMAT_DOUBLE);
    const float bad = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity());
    std::vector<float> data(2 * 70000, 0.25f);
    data[2 * 68000 + 1] = bad;
    data[2 * 69000] = std::numeric_limits<float>::quiet_NaN();
    const fs::path path = dir / "nan.wav";
    write_float(path, format, 2, 16000, data);
    CHECK(probe(path).frames == 70000);
    const std::string kind = std::isnan(bad) ? "NaN" : "Inf";
    for (int channel : {-1, 0, 1}) {
      require_audio_error([&] { decode(path, DecodeOptions{16000, channel}); }, path,
                          kind + " sample at frame 68000, channel 1 (sample index 136001)");
    }
  }
}

TEST_CASE("a negative channel other than -1 or a non-positive rate is an invalid argument", "[decode][errors]") {
  TempDir dir;
  const fs::path path = dir / "ok.wav";
  write_int(path, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, 16000, std::vector<int>(100, 0));
  CHECK_THROWS_AS(decode(path, DecodeOptions{16000, -2}), melforge::InvalidArgument);
  CHECK_THROWS_AS(decode(path, DecodeOptions{0, -1}), melforge::InvalidArgument);
  CHECK_NOTHROW(decode(path, DecodeOptions{16000, 0}));
}

TEST_CASE("truncated or patched WAV data decodes exactly the frames present", "[decode][truncated]") {
  // libsndfile trusts the file size over a WAV's data chunk size: when the chunk claims more bytes than the file
  // holds it logs "data : N (should be M)" and reads the whole frames present; a trailing partial frame is dropped.
  // Streaming writers leave such sizes (0x7FFFFFFF, 0xFFFFFFFF) in valid files, so melforge keeps that behaviour:
  // the decoded signal is exactly the complete frames in the file, never bytes from beyond them.
  TempDir dir;
  const int channels = GENERATE(1, 2);
  const int64_t frames = 8000;
  const auto values = pcm_values(16, static_cast<size_t>(frames * channels), 7u);
  std::vector<int> aligned(values.size());
  for (size_t i = 0; i < values.size(); ++i) aligned[i] = left_align(values[i], 16);
  const fs::path full = dir / "full.wav";
  write_int(full, SF_FORMAT_WAV | SF_FORMAT_PCM_16, channels, 16000, aligned);
  auto bytes = read_bytes(full);
  const size_t data_at = riff_chunk_offset(bytes, "data");
  const size_t block = static_cast<size_t>(2 * channels);
  const auto check_prefix = [&](const fs::path& path, int64_t expect_frames) {
    const AudioInfo info = probe(path);
    CHECK(info.frames == expect_frames);
    const DecodedAudio audio = decode(path, DecodeOptions{16000, 0});
    REQUIRE(static_cast<int64_t>(audio.samples.size()) == expect_frames);
    int mismatches = 0;
    for (int64_t f = 0; f < expect_frames; ++f) {
      const double want = static_cast<double>(values[static_cast<size_t>(f * channels)]) / 32768.0;
      if (audio.samples[static_cast<size_t>(f)] != want) ++mismatches;
    }
    CHECK(mismatches == 0);
  };

  SECTION("data chunk cut mid-file, on and off a frame boundary") {
    const size_t extra = GENERATE(0, 1, 3);
    const size_t keep_frames = 3001;
    const size_t keep = data_at + 8 + keep_frames * block + (extra % block);
    const fs::path path = dir / "cut_data.wav";
    write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep)));
    INFO("cut after " << keep << " bytes");
    check_prefix(path, static_cast<int64_t>(keep_frames));
  }
  SECTION("data chunk size patched larger than the file") {
    const uint32_t claimed = GENERATE(as<uint32_t>{}, 2 * 8000 * 2 + 4, 0x7FFFFFFFu, 0xFFFFFFFFu);
    patch_u32le(bytes, data_at + 4, claimed);
    const fs::path path = dir / "claims_more.wav";
    write_bytes(path, bytes);
    check_prefix(path, frames);
  }
  SECTION("data chunk size patched smaller: only the claimed frames are read") {
    patch_u32le(bytes, data_at + 4, static_cast<uint32_t>(1234 * block));
    const fs::path path = dir / "claims_less.wav";
    write_bytes(path, bytes);
    check_prefix(path, 1234);
  }
}

TEST_CASE("a FLAC stream cut short is reported as truncated", "[decode][truncated]") {
  TempDir dir;
  const fs::path full = dir / "noise.flac";
  const int64_t frames = 32000;
  std::vector<int> data(static_cast<size_t>(frames));
  std::mt19937 rng(5u);
  std::uniform_int_distribution<int> dist(-16000, 16000);
  for (auto& x : data) x = left_align(dist(rng), 16);
  write_int(full, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 1, 16000, data);
  const auto bytes = read_bytes(full);
  REQUIRE(bytes.size() > 20000);
  const fs::path path = dir / "cut.flac";
  write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 3)));
  // STREAMINFO still claims every frame; the decoder runs out of data part-way.
  CHECK(probe(path).frames == frames);
  require_audio_error([&] { decode(path, DecodeOptions{}); }, path, "truncated: header claims 32000 frames, read ");
}

TEST_CASE("an OGG stream cut short has no known length and is refused", "[decode][truncated]") {
  TempDir dir;
  const fs::path full = dir / "noise.ogg";
  std::vector<float> data(32000);
  std::mt19937 rng(6u);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  for (auto& x : data) x = dist(rng);
  write_float(full, SF_FORMAT_OGG | SF_FORMAT_VORBIS, 1, 16000, data);
  const auto bytes = read_bytes(full);
  const fs::path path = dir / "cut.ogg";
  write_bytes(path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)));
  // Vorbis length comes from the granule position of the last page; without the final page libsndfile reports an
  // unknown length, which decode cannot plan for.
  require_audio_error([&] { probe(path); }, path, "does not give the number of frames");
  require_audio_error([&] { decode(path, DecodeOptions{}); }, path, "does not give the number of frames");
}

TEST_CASE("a symlink decodes like its target", "[decode]") {
  TempDir dir;
  const fs::path target = dir / "target.wav";
  std::vector<int> data(4410 * 2);
  for (size_t i = 0; i < data.size(); ++i) data[i] = left_align(static_cast<int64_t>(i % 2000) - 1000, 16);
  write_int(target, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 2, 44100, data);
  const fs::path link = dir / "link.wav";
  fs::create_symlink(target, link);
  const DecodedAudio a = decode(target, DecodeOptions{});
  const DecodedAudio b = decode(link, DecodeOptions{});
  CHECK(b.info.frames == 4410);
  CHECK(b.info.channels == 2);
  CHECK(b.resampled);
  CHECK(a.samples == b.samples);
  CHECK(b.samples.size() == 1600);
}

TEST_CASE("add_options registers --channel bound to DecodeOptions::channel", "[decode][options]") {
  namespace po = boost::program_options;
  DecodeOptions opts;
  po::options_description desc;
  melforge::audio::add_options(desc, opts);
  SECTION("default stays -1") {
    const char* argv[] = {"prog"};
    po::variables_map vm;
    po::store(po::parse_command_line(1, argv, desc), vm);
    po::notify(vm);
    CHECK(opts.channel == -1);
  }
  SECTION("--channel 3") {
    const char* argv[] = {"prog", "--channel", "3"};
    po::variables_map vm;
    po::store(po::parse_command_line(3, argv, desc), vm);
    po::notify(vm);
    CHECK(opts.channel == 3);
  }
  CHECK(desc.find_nothrow("sample-rate", false) == nullptr);
}

namespace {

/// Runs a shell command, returning its exit status.
int run_command(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

}  // namespace

TEST_CASE("an unreadable file (chmod 000) gives AudioError naming the file: permission denied", "[decode][errors]") {
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  const fs::path path = dir / "locked.wav";
  write_int(path, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, 16000, std::vector<int>(100, 0));
  fs::permissions(path, fs::perms::none);
  if (::geteuid() != 0) {
    require_audio_error([&] { probe(path); }, path, "permission denied");
    require_audio_error([&] { decode(path, DecodeOptions{}); }, path, "permission denied");
    return;
  }
  const auto as_nobody = probe_and_decode_as_nobody(path);
  if (!as_nobody)
    MELFORGE_SKIP("running as root, whose reads bypass chmod 000, and a child cannot switch to uid/gid 65534");
  for (const std::string& msg : {as_nobody->probe, as_nobody->decode}) {
    INFO("message: " << msg);
    CHECK(msg.rfind(path.string() + ": ", 0) == 0);
    CHECK(msg.find("permission denied") != std::string::npos);
  }
}

TEST_CASE("tools/make_bad_inputs.py writes files whose decode outcome matches its manifest", "[decode][tools]") {
  TempDir dir;
  const fs::path root = dir / "corpus";
  const fs::path manifest = dir / "bad.json";
  REQUIRE(run_command("/usr/bin/python3 " + quoted(fs::path(MELFORGE_TOOLS_DIR) / "make_bad_inputs.py") +
                      " --out " + quoted(root) + " --class digits --manifest " + quoted(manifest) +
                      " > /dev/null") == 0);
  const auto text = read_bytes(manifest);
  const auto json = nlohmann::json::parse(text.begin(), text.end());
  REQUIRE(json.at("files").size() == 7);
  int ok = 0;
  for (const auto& entry : json.at("files")) {
    const fs::path path = root / "digits" / entry.at("name").get<std::string>();
    INFO(path);
    if (entry.at("expect") == "ok") {
      const DecodedAudio audio = decode(path, DecodeOptions{});
      CHECK_FALSE(audio.samples.empty());
      ++ok;
    } else {
      require_audio_error([&] { decode(path, DecodeOptions{}); }, path, entry.at("reason").get<std::string>());
    }
  }
  CHECK(ok == 2);
  const DecodedAudio stereo = decode(root / "digits" / "ok_stereo_44k.wav", DecodeOptions{});
  CHECK(stereo.info.channels == 2);
  CHECK(stereo.info.sample_rate == 44100);
  CHECK(stereo.resampled);
  CHECK(stereo.samples.size() == 16000);
  CHECK(decode(root / "digits" / "ok_short_0.05s.wav", DecodeOptions{}).samples.size() == 800);
}

TEST_CASE("tools/make_digits_corpus.py --size small writes 100 decodable 16 kHz files, idempotently",
          "[decode][tools]") {
  if (run_command("command -v espeak-ng > /dev/null 2>&1") != 0) {
    MELFORGE_SKIP("espeak-ng is not installed (tools/setup.sh installs it)");
  }
  TempDir dir;
  const fs::path out = dir / "corpus";
  const fs::path log = dir / "log.txt";
  const std::string cmd = "/usr/bin/python3 " + quoted(fs::path(MELFORGE_TOOLS_DIR) / "make_digits_corpus.py") +
                          " --out " + quoted(out) + " --size small --seed 3 > " + quoted(log) + " 2>&1";
  REQUIRE(run_command(cmd) == 0);
  const char* digits[] = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};
  int files = 0;
  for (const char* digit : digits) {
    int in_class = 0;
    for (const auto& entry : fs::directory_iterator(out / digit)) {
      const AudioInfo info = probe(entry.path());
      INFO(entry.path());
      CHECK(info.sample_rate == 16000);
      CHECK(info.channels == 1);
      CHECK(info.format == "WAV PCM_16");
      CHECK(info.seconds() >= 0.4);
      CHECK(info.seconds() <= 1.5);
      const DecodedAudio audio = decode(entry.path(), DecodeOptions{});
      float peak = 0.0f;
      for (float s : audio.samples) peak = std::max(peak, std::abs(s));
      CHECK(peak > 0.2f);
      ++in_class;
    }
    CHECK(in_class == 10);
    files += in_class;
  }
  CHECK(files == 100);
  CHECK(fs::exists(out / ".melforge_corpus.json"));
  const auto first = read_bytes(out / "seven" / "en-us-f2_140_50.wav");
  REQUIRE(run_command(cmd) == 0);
  const auto second_log = read_bytes(log);
  CHECK(std::string(second_log.begin(), second_log.end()).find("nothing to do") != std::string::npos);
  CHECK(read_bytes(out / "seven" / "en-us-f2_140_50.wav") == first);
}

namespace {

/// A `key:` field of /proc/self/status in kB (VmRSS, VmHWM), or -1 when absent.
int64_t self_status_kb(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1));
  return -1;
}

/// Resets this process's peak RSS (VmHWM) to its current RSS (Linux 4.0+: "5" to /proc/self/clear_refs). False when
/// the kernel refuses.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return out.good() && self_status_kb("VmHWM") <= self_status_kb("VmRSS") + 256;
}

/// Writes `seconds` of a 440 Hz tone, mono 16-bit PCM WAV at `rate`, a second at a time.
void write_long_wav(const fs::path& path, int rate, int seconds) {
  SNDFILE* f = open_for_write(path, SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, rate);
  std::vector<short> second(static_cast<size_t>(rate));
  for (size_t i = 0; i < second.size(); ++i)
    second[i] = static_cast<short>(12000 * std::sin(2 * std::numbers::pi * 440.0 * static_cast<double>(i) / rate));
  for (int s = 0; s < seconds; ++s) REQUIRE(sf_writef_short(f, second.data(), rate) == rate);
  REQUIRE(sf_close(f) == 0);
}

/// The 8-byte header of RIFF chunk `id` with a `size` byte body, little-endian.
std::string riff_chunk(const std::string& id, uint32_t size) {
  std::string h = id;
  for (int i = 0; i < 4; ++i) h += static_cast<char>((size >> (8 * i)) & 0xFFu);
  return h;
}

/// A RIFF WAVE file of `chunks` (each a header from riff_chunk followed by its body).
std::vector<char> riff_wave(const std::string& chunks) {
  const std::string body = "WAVE" + chunks;
  const std::string file = riff_chunk("RIFF", static_cast<uint32_t>(body.size())) + body;
  return {file.begin(), file.end()};
}

/// A 16-byte WAVE fmt chunk body: format tag, channels, 8 kHz, 16 bits.
std::string wave_fmt(uint16_t tag, uint16_t channels) {
  std::string f;
  const auto put = [&f](uint32_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) f += static_cast<char>((v >> (8 * i)) & 0xFFu);
  };
  put(tag, 2), put(channels, 2), put(8000, 4), put(16000u * channels, 4), put(2u * channels, 2), put(16, 2);
  return riff_chunk("fmt ", 16) + f;
}

}  // namespace

TEST_CASE("decoding a long file into its arena slice holds a bounded buffer, not a second copy of the file",
          "[decode][resources]") {
  if (!reset_peak_rss()) MELFORGE_SKIP("the kernel does not reset VmHWM through /proc/self/clear_refs");
  const int rate = GENERATE(8000, 16000);
  CAPTURE(rate);
  TempDir d;
  const fs::path path = d / "long.wav";
  write_long_wav(path, rate, 1200);
  const DecodeOptions opts{8000, -1};
  const AudioInfo info = probe(path);
  const int64_t n = output_frames(info, opts.sample_rate);
  std::vector<float> arena(static_cast<size_t>(n), 2.0f);
  melforge::segment::FilePlan plan;
  plan.arena_samples = n;

  REQUIRE(reset_peak_rss());
  const int64_t rss_kb = self_status_kb("VmRSS");
  const int64_t written = melforge::featurize::decode_into(path, opts, plan, arena.data());
  const int64_t growth = (self_status_kb("VmHWM") - rss_kb) * 1024;
  const int64_t bound = melforge::audio::decode_bytes(info, opts, n);
  INFO("slice " << n * 4 / 1024 << " KiB; peak RSS grew by " << growth / 1024 << " KiB while decoding; decode_bytes "
                << bound / 1024 << " KiB");
  CHECK(written == n);
  CHECK(bound <= (int64_t{2} << 20));
  CHECK(growth <= bound + (int64_t{4} << 20));
  CHECK(std::fabs(arena[static_cast<size_t>(n / 2)]) <= 0.5f);
  CHECK(std::fabs(arena[static_cast<size_t>(n - 1)]) <= 0.5f);
}

TEST_CASE("a file's skip reason is its own when many files are opened at once on several threads",
          "[decode][errors][threads]") {
  TempDir d;
  std::vector<fs::path> files;
  const auto add = [&](const std::string& name, const std::vector<char>& bytes) {
    write_bytes(d / name, bytes);
    files.push_back(d / name);
  };
  const std::string text(4000, 'x');
  add("text.wav", {text.begin(), text.end()});
  add("bad_fmt.wav", riff_wave(wave_fmt(0x3333, 1) + riff_chunk("data", 4000) + std::string(4000, '\0')));
  add("no_data.wav", riff_wave(wave_fmt(1, 1) + riff_chunk("LIST", 4) + "INFO" + std::string(100, '\0')));
  add("no_channels.wav", riff_wave(wave_fmt(1, 0) + riff_chunk("data", 4000) + std::string(4000, '\0')));
  const std::string flac = "fLaC" + std::string(1000, '\x12');
  add("cut.flac", {flac.begin(), flac.end()});
  for (int i = 0; i < 4; ++i) {
    files.push_back(d / ("good" + std::to_string(i) + ".wav"));
    write_float(files.back(), SF_FORMAT_WAV | SF_FORMAT_PCM_16, 1, 8000, std::vector<float>(800 + 100 * i, 0.1f));
  }
  const auto outcome = [](const fs::path& path) -> std::string {
    try {
      probe(path);
      return "ok";
    } catch (const AudioError& e) {
      return e.what();
    }
  };
  std::vector<std::string> expected;
  for (const auto& f : files) expected.push_back(outcome(f));
  std::set<std::string> reasons(expected.begin(), expected.end());
  for (const auto& e : expected) CHECK(e.find("No Error") == std::string::npos);
  REQUIRE(reasons.size() == 6);

  constexpr int kThreads = 8;
  constexpr int kRounds = 1000;
  std::atomic<int64_t> wrong{0};
  std::mutex first_mutex;
  std::string first_wrong;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        for (size_t k = 0; k < files.size(); ++k) {
          const size_t i = (k + static_cast<size_t>(t + r)) % files.size();
          const std::string got = outcome(files[i]);
          if (got == expected[i]) continue;
          ++wrong;
          const std::lock_guard lock(first_mutex);
          if (first_wrong.empty()) first_wrong = got + " (expected " + expected[i] + ")";
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  INFO(wrong.load() << " of " << kThreads * kRounds * files.size() << " outcomes wrong; first: " << first_wrong);
  CHECK(wrong.load() == 0);
}

}  // namespace melforge_test_decode
