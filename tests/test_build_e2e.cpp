// End-to-end builds of small generated corpora through the library and through the melforge-build binary.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "audio/decode.h"
#include "build_fixture.h"
#include "mel/half.h"
#include "mel/mel_math.h"
#include "mel_clips.h"
#include "mel/filterbank.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "pipeline.h"
#include "test_util.h"
#include "test_skip.h"

namespace melforge_test_build_e2e {

using namespace melforge;
using melforge::test::read_split;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

int run_cli(const std::string& args) {
  const std::string cmd = std::string(MELFORGE_BUILD_EXE) + " " + args + " >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/// Runs melforge-build with `args`, its stderr into `err`; returns the exit code.
int run_cli_stderr(const std::string& args, const fs::path& err) {
  const std::string cmd = std::string(MELFORGE_BUILD_EXE) + " " + args + " >/dev/null 2>" + err.string();
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("a small corpus with bad files builds, and every file is accounted for", "[e2e]") {
  TempDir d;
  const int good = test::write_tone_corpus(d / "in", 3, 6);
  test::write_text(d / "in/class0/empty.wav", "");
  test::write_text(d / "in/class0/text.wav", "this is not audio at all, just text pretending to be a wav file\n");
  test::write_text(d / "in/class1/readme.txt", "notes");
  test::write_tone(d / "in/class1/tiny.wav", 440, 100, 8000);
  test::write_tone(d / "in/class2/one_sample.wav", 440, 1, 8000);
  test::write_tone(d / "in/class2/nan.wav", 440, 9000, 8000, 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 4000);
  test::write_tone(d / "in/class2/header_only.wav", 440, 9000, 8000);
  fs::resize_file(d / "in/class2/header_only.wav", 20);
  const int bad = 5;
  test::write_tone(d / "in/class1/truncated.wav", 440, 9000, 8000);
  fs::resize_file(d / "in/class1/truncated.wav", 44 + 2 * 5000);

  auto c = test::tone_build_config(d / "in", d / "out");
  const auto r = builder::run_build(c).report;

  INFO("skipped: " << r["skipped"].dump());
  // A truncated data chunk is either decoded as far as it goes or skipped as truncated: never lost.
  CHECK(r["files"]["scanned"].get<int>() == good + 2 + bad + 1);
  const int written = r["files"]["written"].get<int>();
  const int skipped_n = r["files"]["skipped"].get<int>();
  CHECK(written + skipped_n == good + 2 + bad + 1);
  CHECK((written == good + 2 || written == good + 3));
  CHECK(r["clips"]["padded"].get<int>() == 2);
  CHECK(r["clips"]["capped"].get<int>() == 0);
  CHECK(r["clips"]["rows"].get<int>() == written);
  const auto& ps = r["files"]["per_split"];
  CHECK(ps["train"].get<int>() + ps["val"].get<int>() + ps["test"].get<int>() == written);
  std::set<std::string> skipped;
  for (const auto& s : r["skipped"]) {
    skipped.insert(s["path"].get<std::string>());
    CHECK_FALSE(s["reason"].get<std::string>().empty());
  }
  skipped.erase("class1/truncated.wav");
  CHECK(skipped == std::set<std::string>{"class0/empty.wav", "class0/text.wav", "class1/readme.txt",
                                         "class2/nan.wav", "class2/header_only.wav"});
  CHECK(r["files"]["resampled"].get<int>() == 3);

  CHECK(fs::exists(d / "out/build_report.json"));
  CHECK_FALSE(fs::exists(d / "out/.partial"));
  std::set<std::string> written_paths;
  int64_t total = 0;
  for (const std::string split : {"train", "val", "test"}) {
    const auto s = read_split(d / "out" / (split + ".h5"));
    REQUIRE(s.dims.size() == 2);
    CHECK(s.dims[1] == 32);
    CHECK(s.classes == std::vector<std::string>{"class0", "class1", "class2"});
    for (std::size_t i = 0; i < s.path.size(); ++i) {
      written_paths.insert(s.path[i]);
      CHECK(s.path[i].substr(0, 6) == "class" + std::to_string(s.label[i]));
      const int64_t frames = mel::clip_frames(s.clips.num_samples[i], 256, 64, 128);
      CHECK(s.clip_frames(i) == frames);
      const bool tiny = s.path[i] == "class1/tiny.wav" || s.path[i] == "class2/one_sample.wav";
      CHECK(s.clips.clip_flags[i] == (tiny ? builder::kStoredPadded : 0));
      if (s.path[i] == "class2/one_sample.wav") CHECK(s.clips.num_samples[i] == 1);
    }
    total += static_cast<int64_t>(s.files());
  }
  CHECK(total == written);
  CHECK(written_paths.size() == static_cast<std::size_t>(written));
}

TEST_CASE("the stored frames of each clip equal compute_clips and the naive reference on the whole decoded clip",
          "[e2e]") {
  const auto dtype = GENERATE(mel::DType::float32, mel::DType::float16);
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  test::write_tone(d / "in/class1/short.wav", 500, 40, 8000);
  auto c = test::tone_build_config(d / "in", d / "out");
  c.build.dtype = dtype;
  c.build.split = "1,0,0";
  builder::run_build(c);
  const auto s = read_split(d / "out/train.h5");
  REQUIRE(s.files() == 9);

  mel::EngineConfig ec;
  ec.mel = c.mel;
  ec.segment_samples = 2000;
  ec.dtype = mel::DType::float32;
  auto engine = mel::make_cpu_engine(ec);
  const std::vector<double> fb = test::reference_filterbank(c.mel);
  for (std::size_t i = 0; i < s.files(); ++i) {
    CAPTURE(s.path[i]);
    audio::DecodeOptions dopt;
    dopt.sample_rate = 8000;
    const auto a = audio::decode(d / "in" / s.path[i], dopt);
    const auto n = static_cast<int64_t>(a.samples.size());
    REQUIRE(s.clips.num_samples[i] == n);
    const std::vector<int64_t> offsets = {0, n};
    const mel::ClipBatch batch = mel::plan_clips(c.mel, mel::DType::float32, offsets);
    REQUIRE(s.clip_frames(i) == batch.total_frames());
    CHECK(s.clips.clip_flags[i] == (batch.flags[0] != 0 ? builder::kStoredPadded : 0));
    std::vector<float> expect(static_cast<std::size_t>(batch.out_elems()));
    engine->compute_clips(a.samples.data(), batch, expect.data());
    const std::vector<float> got = s.clip(i);
    REQUIRE(got.size() == expect.size());
    for (std::size_t j = 0; j < expect.size(); ++j) {
      CAPTURE(j);
      const float want =
          dtype == mel::DType::float32 ? expect[j] : mel::half_bits_to_float(mel::float_to_half_bits(expect[j]));
      REQUIRE(got[j] == want);
    }
    if (dtype == mel::DType::float16) continue;
    const std::vector<double> ref = test::clip_reference(c.mel, a.samples.data(), n, batch.flags[0], fb);
    std::vector<float> mel_major(got.size());
    const int64_t frames = s.clip_frames(i);
    for (int64_t t = 0; t < frames; ++t)
      for (int64_t m = 0; m < 32; ++m)
        mel_major[static_cast<std::size_t>(m * frames + t)] = got[static_cast<std::size_t>(t * 32 + m)];
    CHECK(test::compare_log_mel(mel_major.data(), ref.data(), 32, static_cast<int>(frames), c.mel).failures == 0);
  }
}

/// Clips of 0.3 to 30 s (8 kHz) in two classes, and one of 80 samples (shorter than a frame's reflect padding).
void write_variable_corpus(const fs::path& in) {
  const double seconds[] = {0.3, 0.9, 2.5, 7.0, 12.0, 30.0};
  for (int c = 0; c < 2; ++c)
    for (std::size_t i = 0; i < std::size(seconds); ++i)
      test::write_tone(in / ("class" + std::to_string(c)) / ("clip" + std::to_string(i) + ".wav"), 300.0 + 200 * c,
                       static_cast<int64_t>(seconds[i] * 8000), 8000);
  test::write_tone(in / "class1/blip.wav", 900, 80, 8000);
}

TEST_CASE("clips of 0.3 to 30 s are stored whole by default: every sample, nothing skipped for being short",
          "[e2e][clips]") {
  TempDir d;
  write_variable_corpus(d / "in");
  const auto r = builder::run_build(test::tone_build_config(d / "in", d / "out")).report;
  INFO(r.dump());
  CHECK(r["files"]["written"] == 13);
  CHECK(r["skipped"].empty());
  const auto& clips = r["clips"];
  CHECK(clips["seconds_in"].get<double>() == Approx(2 * (0.3 + 0.9 + 2.5 + 7.0 + 12.0 + 30.0) + 80.0 / 8000));
  CHECK(clips["stored_fraction"].get<double>() >= 0.999);
  CHECK(clips["padded"] == 1);
  CHECK(clips["capped"] == 0);
  CHECK(clips["seconds_dropped"] == 0.0);
  int64_t frames = 0;
  for (const std::string split : {"train", "val", "test"}) {
    const auto s = read_split(d / "out" / (split + ".h5"));
    for (std::size_t i = 0; i < s.files(); ++i) {
      CAPTURE(s.path[i]);
      const auto info = audio::probe(d / "in" / s.path[i]);
      CHECK(s.clips.num_samples[i] == info.frames);
      CHECK(s.clip_frames(i) == 1 + s.clips.num_samples[i] / 64);
      CHECK(s.clips.clip_flags[i] == (s.path[i] == "class1/blip.wav" ? builder::kStoredPadded : 0));
    }
    frames += s.dims[0];
  }
  CHECK(clips["frames"] == frames);
  CHECK(clips["rows"] == 13);
}

TEST_CASE("a --max-seconds cap cuts longer clips with a warning and its figures, a padded clip is a warning too",
          "[e2e][clips][cli]") {
  TempDir d;
  write_variable_corpus(d / "in");
  const fs::path err = d / "stderr.txt";
  const std::string args = "--input " + (d / "in").string() + " --output " + (d / "out").string() +
                           " --sample-rate 8000 --n-fft 256 --hop-length 64 --n-mels 32 --device cpu --quiet";
  REQUIRE(run_cli_stderr(args + " --max-seconds 5", err) == 0);
  const std::string log = read_text(err);
  INFO(log);
  CHECK_THAT(log, Catch::Contains("melforge-build: warning: --max-seconds 5: 6 clips were cut, 68.0 s of 105.4 s of "
                                  "audio dropped (64.51%"));
  CHECK_THAT(log, Catch::Contains("melforge-build: warning: 1 clip was too short for one STFT frame (n_fft 256, "
                                  "center true) and zero-padded to one frame"));
  const auto report = nlohmann::json::parse(read_text(d / "out/build_report.json"));
  CHECK(report["clips"]["capped"] == 6);
  CHECK(report["files"]["capped"] == 6);
  CHECK(report["clips"]["seconds_dropped"].get<double>() == Approx(2 * (2.0 + 7.0 + 25.0)));
  CHECK(report["clips"]["seconds_stored"].get<double>() == Approx(2 * (0.3 + 0.9 + 2.5 + 3 * 5.0) + 0.01));
  CHECK(report["config"]["max_seconds"] == 5.0);
  const auto warnings = report["warnings"].dump();
  CHECK_THAT(warnings, Catch::Contains("--max-seconds 5: 6 clips were cut"));
  for (const std::string split : {"train", "val", "test"}) {
    const auto s = read_split(d / "out" / (split + ".h5"));
    auto f = h5::open_file(d / "out" / (split + ".h5"));
    CHECK(h5::read_attribute_double(f, "max_seconds") == 5.0);
    for (std::size_t i = 0; i < s.files(); ++i) {
      CAPTURE(s.path[i]);
      const int64_t whole = audio::probe(d / "in" / s.path[i]).frames;
      CHECK(s.clips.num_samples[i] == std::min<int64_t>(whole, 5 * 8000));
      CHECK(((s.clips.clip_flags[i] & builder::kStoredCapped) != 0) == (whole > 5 * 8000));
    }
  }
  REQUIRE(run_cli_stderr(args + " --overwrite", d / "plain.txt") == 0);
  CHECK_THAT(read_text(d / "plain.txt"), !Catch::Contains("--max-seconds"));
}

TEST_CASE("builds are identical across thread counts", "[e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 5);
  auto c1 = test::tone_build_config(d / "in", d / "out1");
  c1.build.threads = 1;
  auto c2 = test::tone_build_config(d / "in", d / "out2");
  c2.build.threads = 2;
  c2.build.max_ram = "64M";
  builder::run_build(c1);
  builder::run_build(c2);
  for (const std::string split : {"train", "val", "test"}) {
    const auto a = read_split(d / "out1" / (split + ".h5"));
    const auto b = read_split(d / "out2" / (split + ".h5"));
    CHECK(a.dims == b.dims);
    CHECK(a.path == b.path);
    CHECK(a.label == b.label);
    CHECK(a.clips.frame_offset == b.clips.frame_offset);
    CHECK(a.frames == b.frames);
  }
}

TEST_CASE("a corpus larger than --max-ram streams in several batches with the same result", "[e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 12);
  auto big = test::tone_build_config(d / "in", d / "big");
  auto small = test::tone_build_config(d / "in", d / "small");
  small.build.max_ram = "64M";
  // The budget left after the fixed reserve is tiny, so every file becomes its own batch.
  const auto rb = builder::run_build(big).report;
  const auto rs = builder::run_build(small).report;
  CHECK(rb["batches"].get<int>() == 3);
  CHECK(rs["batches"].get<int>() > 3);
  for (const std::string split : {"train", "val", "test"}) {
    CHECK(read_split(d / "big" / (split + ".h5")).frames == read_split(d / "small" / (split + ".h5")).frames);
  }
}

TEST_CASE("a pre-split layout and a manifest are respected", "[e2e]") {
  TempDir d;
  test::write_tone(d / "in/train/a/x.wav", 300, 9000, 8000);
  test::write_tone(d / "in/train/b/y.wav", 600, 9000, 8000);
  test::write_tone(d / "in/val/a/z.wav", 300, 9000, 8000);
  test::write_tone(d / "in/test/b/w.wav", 600, 9000, 8000);
  auto c = test::tone_build_config(d / "in", d / "out");
  const auto r = builder::run_build(c).report;
  CHECK(r["counts"]["train"]["a"].get<int>() == 1);
  CHECK(r["counts"]["train"]["b"].get<int>() == 1);
  CHECK(r["counts"]["val"]["a"].get<int>() == 1);
  CHECK(r["counts"]["test"]["b"].get<int>() == 1);

  test::write_text(d / "m.csv", "path,label,split\nin/train/a/x.wav,a,test\nin/train/b/y.wav,b,\n\"in/val/a/z.wav\",a,val\n");
  auto m = test::tone_build_config({}, d / "outm");
  m.build.manifest = d / "m.csv";
  m.build.split = "1,0,0";
  const auto rm = builder::run_build(m).report;
  CHECK(rm["counts"]["test"]["a"].get<int>() == 1);
  CHECK(rm["counts"]["train"]["b"].get<int>() == 1);
  CHECK(rm["counts"]["val"]["a"].get<int>() == 1);
  const auto t = read_split(d / "outm/test.h5");
  CHECK(t.path == std::vector<std::string>{"in/train/a/x.wav"});
}

TEST_CASE("the report records the engine choice, auto says why it used the CPU, cuda names the query error",
          "[e2e][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const mel::CudaDeviceQuery q = mel::query_cuda_devices();
  INFO("device query: " << q.describe());
  auto c = test::tone_build_config(d / "in", d / "out");
  c.build.device = mel::Device::auto_select;
  const auto r = builder::run_build(c).report;
  const auto& choice = r["engine_choice"];
  CHECK(choice["device"] == "auto");
  CHECK(choice["engine"] == r["engine"]);
  CHECK(choice["cuda_query"] == q.describe());
  const std::string cause = q.built_with_cuda ? q.error_name : "built without CUDA";
  if (q.usable()) {
    CHECK_THAT(r["engine"].get<std::string>(), Catch::StartsWith("cuda-cufft"));
    CHECK_FALSE(choice["cuda_devices"].empty());
  } else {
    CHECK(r["engine"] == "cpu-fftw");
    CHECK(choice["cuda_devices"].empty());
    REQUIRE(choice["fallback_reason"].is_string());
    CHECK(choice["fallback_reason"] == "no usable CUDA device: " + q.describe());
    CHECK_FALSE(cause.empty());
  }
  c.build.device = mel::Device::cpu;
  c.build.overwrite = true;
  const auto cpu = builder::run_build(c).report["engine_choice"];
  CHECK(cpu["device"] == "cpu");
  CHECK(cpu["fallback_reason"].is_null());
  CHECK(cpu["cuda_query"].is_null());

  const std::string io = "--input " + (d / "in").string() + " --sample-rate 8000 --n-fft 256 --hop-length 64 " +
                         "--n-mels 32 --short-seconds 0.25 --quiet --output ";
  const fs::path err = d / "stderr.txt";
  const int rc_cuda = run_cli_stderr(io + (d / "out_cuda").string() + " --device cuda", err);
  const int rc_auto = run_cli_stderr(io + (d / "out_auto").string() + " --device auto", d / "stderr_auto.txt");
  INFO("--device cuda: " << read_text(err) << "--device auto: " << read_text(d / "stderr_auto.txt"));
  CHECK(rc_auto == 0);
  if (q.usable()) {
    CHECK(rc_cuda == 0);
    return;
  }
  CHECK(rc_cuda == 1);
  CHECK_THAT(read_text(err), Catch::StartsWith("melforge-build: error: the CUDA engine was requested, but no CUDA "
                                               "device is usable: ") &&
                                 Catch::Contains(q.describe()) && Catch::Contains(cause));
  CHECK_FALSE(fs::exists(d / "out_cuda" / "build_report.json"));
  CHECK_THAT(read_text(d / "stderr_auto.txt"),
             Catch::Contains("melforge-build: --device auto: cpu-fftw engine: no usable CUDA device: " + q.describe()));
}

TEST_CASE("mel bands without an FFT bin are a warning in the log and the report, not a refusal", "[e2e][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  const fs::path err = d / "stderr.txt";
  const int rc = run_cli_stderr("--input " + (d / "in").string() + " --output " + (d / "out").string() +
                                    " --sample-rate 16000 --n-fft 400 --n-mels 128 " +
                                    "--short-seconds 0.5 --device cpu --quiet",
                                err);
  const std::string log = read_text(err);
  INFO(log);
  REQUIRE(rc == 0);
  mel::MelArgs a;
  a.n_fft = 400;
  a.n_mels = 128;
  const std::string warning = mel::empty_bands_warning(a);
  REQUIRE_FALSE(warning.empty());
  CHECK_THAT(log, Catch::Contains("melforge-build: warning: " + warning));
  const auto report = nlohmann::json::parse(read_text(d / "out" / "build_report.json"));
  const auto warnings = report.at("warnings").get<std::vector<std::string>>();
  CHECK(std::count(warnings.begin(), warnings.end(), warning) == 1);
  const auto s = read_split(d / "out" / "train.h5");
  REQUIRE(s.dims.size() == 2);
  const int64_t n_mels = s.dims[1];
  REQUIRE(n_mels == 128);
  REQUIRE(s.dims[0] > 0);
  const float silence = mel::silence_value(a);
  const int band = mel::build_filterbank(a).empty_bands().front();
  for (int64_t t = 0; t < s.dims[0]; ++t) REQUIRE(s.frames[static_cast<std::size_t>(t * n_mels + band)] == silence);
}

TEST_CASE("invalid parameters fail before any work", "[e2e][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  const std::string io = "--input " + (d / "in").string() + " --output " + (d / "out").string() + " --quiet";
  const std::string bad = GENERATE(std::string("--hop-length 0"), std::string("--n-mels 200 --n-fft 64"),
                                   std::string("--f-max 9000 --sample-rate 16000"),
                                   std::string("--short-seconds 0"), std::string("--split 0.5,0.6"),
                                   std::string("--window triangle"), std::string("--max-ram lots"),
                                   std::string("--max-seconds -1"), std::string("--compression-level 12"),
                                   std::string("--no-such-flag 1"), std::string("--num-long 3"),
                                   std::string("--long-seconds 1"), std::string("--short-files pad"),
                                   std::string("--files-per-chunk 2"));
  CAPTURE(bad);
  CHECK(run_cli(io + " " + bad) == 2);
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("the CLI: help, config file, refusal of an existing output, strict", "[e2e][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  CHECK(run_cli("--help") == 0);
  test::write_text(d / "cfg.ini", "sample-rate = 8000\nn-fft = 256\nn-mels = 32\nshort-seconds = 0.5\n"
                                  "hop-length = 100\n");
  const std::string io = "--input " + (d / "in").string() + " --output " + (d / "out").string() + " --quiet";
  // The command line's --hop-length must win over the config file's.
  CHECK(run_cli(io + " --config " + (d / "cfg.ini").string() + " --hop-length 64 --device cpu") == 0);
  std::ifstream rf(d / "out/build_report.json");
  const auto r = nlohmann::json::parse(rf);
  CHECK(r["config"]["hop_length"].get<int>() == 64);
  CHECK(r["config"]["n_fft"].get<int>() == 256);
  CHECK(r["config"]["short_samples"].get<int>() == 4000);
  CHECK(run_cli(io + " --config " + (d / "cfg.ini").string() + " --hop-length 64") == 2);
  CHECK(run_cli(io + " --config " + (d / "cfg.ini").string() + " --hop-length 64 --overwrite") == 0);
  CHECK(run_cli(io + " --config " + (d / "missing.ini").string() + " --overwrite") == 2);

  test::write_text(d / "in/class0/broken.wav", "RIFF....WAVEfmt ");
  CHECK(run_cli(io + " --config " + (d / "cfg.ini").string() + " --hop-length 64 --overwrite --strict") == 3);
  CHECK(run_cli(io + " --config " + (d / "cfg.ini").string() + " --hop-length 64 --overwrite") == 0);
}

TEST_CASE("the demo configuration builds the small spoken-digit corpus plus hostile files", "[e2e][cli][demo]") {
  if (std::system("command -v espeak-ng >/dev/null 2>&1 && /usr/bin/python3 -c 'import numpy, h5py' 2>/dev/null") != 0) {
    MELFORGE_SKIP("espeak-ng or Debian's python3-numpy/python3-h5py missing (tools/setup.sh installs them)");
  }
  TempDir d;
  const std::string tools = MELFORGE_TOOLS_DIR;
  const std::string corpus = (d / "corpus").string();
  REQUIRE(std::system(("/usr/bin/python3 " + tools + "/make_digits_corpus.py --out " + corpus +
                       " --size small --seed 3 >/dev/null 2>&1").c_str()) == 0);
  REQUIRE(std::system(("/usr/bin/python3 " + tools + "/make_bad_inputs.py --out " + corpus +
                       " --class zero >/dev/null 2>&1").c_str()) == 0);
  const std::string out = (d / "out").string();
  REQUIRE(run_cli("--config " + tools + "/demo_build.ini --input " + corpus + " --output " + out + " --quiet") == 0);

  std::ifstream rf(d / "out/build_report.json");
  const auto r = nlohmann::json::parse(rf);
  CHECK(r["files"]["written"].get<int>() == 102);
  CHECK(r["clips"]["stored_fraction"].get<double>() >= 0.999);
  CHECK(r["files"]["resampled"].get<int>() == 1);
  CHECK(r["files"]["scanned"].get<int>() == r["files"]["written"].get<int>() + r["files"]["skipped"].get<int>());
  std::map<std::string, std::string> skipped;
  for (const auto& s : r["skipped"]) skipped[s["path"].get<std::string>()] = s["reason"].get<std::string>();
  CHECK(r["hidden"]["paths"] == nlohmann::json{".melforge_corpus.json"});
  const std::map<std::string, std::string> expected = {
      {"zero/bad_dir.wav", "is a directory"},
      {"zero/bad_empty.wav", "empty file"},
      {"zero/bad_nan.wav", "NaN sample at frame 1234"},
      {"zero/bad_text.wav", "not an audio file"},
      {"zero/bad_truncated_header.wav", "not an audio file"},
  };
  REQUIRE(skipped.size() == expected.size());
  for (const auto& [path, reason] : expected) {
    CAPTURE(path);
    REQUIRE(skipped.count(path) == 1);
    CHECK_THAT(skipped[path], Catch::Contains(reason));
  }
  const std::string check = "/usr/bin/python3 -c \"import h5py,sys\n"
                            "n=0\n"
                            "for s in ('train','val','test'):\n"
                            "  f=h5py.File(sys.argv[1]+'/'+s+'.h5','r')\n"
                            "  m=f['frames']\n"
                            "  o=f['frame_offset'][:]\n"
                            "  assert m.dtype=='float16' and m.shape[1]==64 and o[-1]==m.shape[0], m.shape\n"
                            "  assert len(f['class_names'])==10 and f.attrs['split']==s\n"
                            "  n+=len(o)-1\n"
                            "assert n==102, n\n\" " + out;
  CHECK(std::system(check.c_str()) == 0);
}

}  // namespace melforge_test_build_e2e
