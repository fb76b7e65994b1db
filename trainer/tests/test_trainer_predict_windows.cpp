// predict over whole files: a model trained on tone against noise reads a file of tone then noise window by window
// (the acceptance test), the file-level vote sees both parts, --windows writes every window, exit codes and
// --strict, and a 1-hour file runs in the memory of a short one (streamed decode, fixed-size batches).
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include "melforge_test_paths.h"

#include "catch_torch.h"

#include <sndfile.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "melforge/common/errors.h"
#include "predict/predict.h"
#include "reliability/child_process.h"
#include "test_util.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_predict_windows {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
using melforge::test::read_json;
namespace fs = std::filesystem;

namespace {

constexpr int kRate = 8000;

/// Appends `seconds` of a 0.5-amplitude sine of `hz` (hz > 0) or of uniform white noise (hz == 0, seeded by `seed`).
void append_signal(std::vector<float>& out, double seconds, double hz, uint32_t seed, int rate = kRate) {
  const auto n = static_cast<int64_t>(std::llround(seconds * rate));
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float noise = static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
    out.push_back(hz > 0 ? 0.5f * static_cast<float>(std::sin(2.0 * M_PI * hz * static_cast<double>(i) / rate))
                         : noise);
  }
}

/// Writes mono 16-bit `samples` at `rate` to `path`.
void write_wav(const fs::path& path, const std::vector<float>& samples, int rate = kRate) {
  test::write_samples(path, samples, rate, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
}

/// Builds a corpus of two classes, "noise" and "tone" (8 files of 2 s each), into d/data and trains the tiny
/// model on it for `epochs` epochs. Returns the best checkpoint.
fs::path train_tone_noise(const TempDir& d, int64_t epochs) {
  for (int i = 0; i < 8; ++i) {
    std::vector<float> tone, noise;
    append_signal(tone, 2.0, 350.0 + 60 * i, 0);
    append_signal(noise, 2.0, 0, 1000u + static_cast<uint32_t>(i));
    write_wav(d / "in/tone" / ("t" + std::to_string(i) + ".wav"), tone);
    write_wav(d / "in/noise" / ("n" + std::to_string(i) + ".wav"), noise);
  }
  builder::run_build(test::tiny_build_config(d / "in", d / "data"));
  std::ostringstream log;
  trainer::train(test::tiny_config(d / "data", d / "run", epochs), log);
  return d / "run/checkpoints/best.pt";
}

/// run_predict with `opts` on CPU with 2 threads: the rows (JSON).
nlohmann::json predict_json(PredictOptions opts) {
  opts.format = "json";
  opts.device = "cpu";
  opts.threads = 2;
  std::ostringstream out, log;
  run_predict(opts, out, log);
  return nlohmann::json::parse(out.str());
}

}  // namespace

TEST_CASE("predict reads a file of tone then noise window by window, and the vote sees both parts",
          "[trainer][predict][windows]") {
  TempDir d;
  const fs::path ck = train_tone_noise(d, 4);
  std::vector<float> mixed;
  append_signal(mixed, 4.0, 440.0, 0);
  append_signal(mixed, 5.0, 0, 77u);
  write_wav(d / "mixed.wav", mixed);

  PredictOptions opts;
  opts.checkpoint = ck;
  opts.inputs = {d / "mixed.wav"};
  opts.windows = d / "w.json";
  const auto rows = predict_json(opts);
  REQUIRE(rows.size() == 1);
  REQUIRE_FALSE(rows[0].contains("error"));
  CHECK(rows[0]["num_windows"] == 9);
  const auto w = read_json(d / "w.json");
  REQUIRE(w.size() == 9);
  double mean_tone = 0, first_two_tone = 0;
  for (int k = 0; k < 9; ++k) {
    CAPTURE(k, w[k].dump());
    CHECK(w[k]["path"] == (d / "mixed.wav").string());
    CHECK(w[k]["window"] == k);
    CHECK(w[k]["start"].get<double>() == Approx(k).margin(1e-9));
    CHECK(w[k]["end"].get<double>() == Approx(k + 1).margin(1e-9));
    CHECK(w[k]["predicted"] == (k < 4 ? "tone" : "noise"));
    const double p = w[k]["probabilities"]["tone"].get<double>();
    CHECK(p + w[k]["probabilities"]["noise"].get<double>() == Approx(1).margin(1e-5));
    mean_tone += p / 9;
    if (k < 2) first_two_tone += p / 2;
  }
  const double file_tone = rows[0]["probabilities"]["tone"].get<double>();
  CHECK(file_tone == Approx(mean_tone).margin(1e-5));
  // What predict scored before whole-file windows: the dataset's num_long = 2 first seconds, all tone.
  CHECK(first_two_tone > 0.9);
  // The mean over the whole file weighs both parts: 4 windows of tone, 5 of noise.
  CHECK(file_tone > 0.3);
  CHECK(file_tone < 0.75);
  CHECK(file_tone < first_two_tone - 0.2);

  opts.vote = "majority";
  opts.windows.clear();
  const auto majority = predict_json(opts);
  CHECK(majority[0]["predicted"] == "noise");
  CHECK(majority[0]["probabilities"]["tone"].get<double>() == Approx(4.0 / 9).margin(1e-6));
  CHECK(majority[0]["probabilities"]["noise"].get<double>() == Approx(5.0 / 9).margin(1e-6));

  opts.vote = "mean";
  opts.hop = 0.5;
  opts.windows = d / "w.csv";
  CHECK(predict_json(opts)[0]["num_windows"] == 17);
  std::ifstream csv(d / "w.csv");
  std::string line;
  std::getline(csv, line);
  CHECK(line == "path,window,start,end,predicted,detection_score,detected,p_noise,p_tone");
  int k = 0;
  for (; std::getline(csv, line); ++k) {
    CAPTURE(k, line);
    const std::string prefix = (d / "mixed.wav").string() + "," + std::to_string(k) + ",";
    REQUIRE(line.rfind(prefix, 0) == 0);
    std::istringstream fields(line.substr(prefix.size()));
    double start = 0, end = 0;
    char comma = 0;
    std::string predicted;
    fields >> start >> comma >> end >> comma;
    std::getline(fields, predicted, ',');
    CHECK(start == Approx(0.5 * k));
    CHECK(end == Approx(0.5 * k + 1));
    if (end <= 4.0) CHECK(predicted == "tone");
    if (start >= 4.0) CHECK(predicted == "noise");
  }
  CHECK(k == 17);
}

TEST_CASE("predict pads a last partial window as the builder pads a short file", "[trainer][predict][windows]") {
  TempDir d;
  const fs::path ck = train_tone_noise(d, 1);
  std::vector<float> s;
  append_signal(s, 4.5, 440.0, 0);
  write_wav(d / "a.wav", s);
  s.clear();
  append_signal(s, 4.1, 440.0, 0);  // 0.1 s past the 4th window: less than one short segment, not scored
  write_wav(d / "b.wav", s);
  PredictOptions opts;
  opts.checkpoint = ck;
  opts.inputs = {d / "a.wav", d / "b.wav"};
  opts.windows = d / "w.json";
  const auto rows = predict_json(opts);
  CHECK(rows[0]["num_windows"] == 5);
  CHECK(rows[1]["num_windows"] == 4);
  const auto w = read_json(d / "w.json");
  REQUIRE(w.size() == 9);
  CHECK(w[4]["start"].get<double>() == Approx(4.0));
  CHECK(w[4]["end"].get<double>() == Approx(4.5));
  CHECK(w[8]["end"].get<double>() == Approx(4.0));
}

TEST_CASE("predict's exit codes: 3 when some files fail, --strict stops at the first, 2 for bad flags",
          "[trainer][predict][windows]") {
  TempDir d;
  const fs::path ck = train_tone_noise(d, 1);
  test::write_text(d / "q/b_broken.wav", "not audio");
  fs::copy_file(d / "in/tone/t0.wav", d / "q/a_good.wav");
  fs::copy_file(d / "in/noise/n0.wav", d / "q/c_good.wav");
  const std::vector<std::string> base = {"melforge-train", "predict", "--checkpoint", ck.string(), "--device", "cpu"};

  int code = 0;
  std::string text;
  std::tie(code, text) = test::run_in_process(test::with(base, {(d / "q").string()}));
  INFO(text);
  CHECK(code == kExitSomeFailed);
  CHECK(code == 3);
  const auto scored_row = [&](const std::string& name) {
    const std::string p = (d / "q" / name).string();
    return text.find(p + ",tone,") != std::string::npos || text.find(p + ",noise,") != std::string::npos;
  };
  CHECK(scored_row("a_good.wav"));
  CHECK(scored_row("c_good.wav"));
  CHECK_THAT(text, Catch::Contains((d / "q/b_broken.wav").string() + ",,,") &&
                       Catch::Contains("2 file(s) scored, 1 unreadable"));

  std::tie(code, text) = test::run_in_process(test::with(base, {"--strict", (d / "q").string()}));
  INFO(text);
  CHECK(code == kExitError);
  CHECK_THAT(text, Catch::Contains("--strict") && Catch::Contains((d / "q/b_broken.wav").string()) &&
                       Catch::Contains("not an audio file"));
  CHECK(scored_row("a_good.wav"));
  CHECK_THAT(text, !Catch::Contains("c_good.wav"));

  std::tie(code, text) = test::run_in_process(test::with(base, {(d / "q/a_good.wav").string()}));
  CHECK(code == kExitOk);
  std::tie(code, text) = test::run_in_process(test::with(base, {(d / "q/b_broken.wav").string()}));
  CHECK(code == kExitError);
  CHECK_THAT(text, Catch::Contains("no input file could be scored"));
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--hop", "-1"}, {"--hop", "1.5"}, {"--windows", (d / "w.txt").string()},
        {"--windows-format", "csv"}, {"--windows", (d / "w.csv").string(), "--windows-format", "xml"}}) {
    std::tie(code, text) = test::run_in_process(test::with(test::with(base, bad), {(d / "q").string()}));
    CAPTURE(bad, text);
    CHECK(code == kExitUsage);
    CHECK_THAT(text, Catch::Contains("--hop") || Catch::Contains("--windows"));
  }
}

TEST_CASE("predict on a 1-hour file runs in the memory of a short one", "[trainer][predict][windows][memory]") {
  TempDir d;
  const fs::path ck = train_tone_noise(d, 1);
  constexpr int kLongRate = 16000;
  {
    SF_INFO info{};
    info.samplerate = kLongRate;
    info.channels = 1;
    info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
    SNDFILE* f = sf_open((d / "hour.wav").c_str(), SFM_WRITE, &info);
    REQUIRE(f != nullptr);
    for (int minute = 0; minute < 60; ++minute) {
      std::vector<float> chunk;
      append_signal(chunk, 60.0, minute % 2 ? 0 : 440.0, static_cast<uint32_t>(minute), kLongRate);
      sf_writef_float(f, chunk.data(), static_cast<sf_count_t>(chunk.size()));
    }
    sf_close(f);
  }
  for (const int seconds : {10, 300}) {
    std::vector<float> s;
    append_signal(s, seconds, 440.0, 0, kLongRate);
    write_wav(d / (std::to_string(seconds) + "s.wav"), s, kLongRate);
  }
  const auto run = [&](const std::string& name) {
    const test::ChildResult r = test::run_child(
        {MELFORGE_TRAIN_EXE, "predict", "--checkpoint", ck.string(), "--device", "cpu", "--threads", "2", "--format",
         "json", "--windows", (d / (name + ".windows.csv")).string(), (d / (name + ".wav")).string()},
        d / (name + ".log"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  const test::ChildResult hour = run("hour"), five_min = run("300s"), brief = run("10s");
  const auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  // Holding the hour's decoded samples alone (3600 s x 8 kHz float32) would take 110 MiB.
  const int64_t whole_file_bytes = int64_t{3600} * 8000 * 4;
  WARN("peak RSS: 1-hour file " << mib(hour.peak_rss_bytes) << " MiB in " << hour.wall_s << " s; 5-minute file "
                                << mib(five_min.peak_rss_bytes) << " MiB; 10 s file " << mib(brief.peak_rss_bytes)
                                << " MiB; the hour's decoded samples alone: " << mib(whole_file_bytes) << " MiB");
  CHECK(hour.peak_rss_bytes > 0);
  // 300 windows of 4 short segments fill a whole batch of kPredictBatchSegments (the 10 s file does not: its
  // forward passes are smaller); past one batch nothing grows with the file but the scores, 48 bytes a window, and
  // the allocator's settling (measured: +8 to +12 MiB from 5 min to 1 h, +0.5 MiB from 1 h to 2 h). Decoding the
  // whole hour first, as featurize_file does for a dataset row, would add 110 MiB of samples and 56 MiB of
  // spectrograms.
  CHECK(hour.peak_rss_bytes < five_min.peak_rss_bytes + (int64_t{48} << 20));
  std::ifstream w(d / "hour.windows.csv");
  int64_t lines = 0;
  for (std::string line; std::getline(w, line);) ++lines;
  CHECK(lines == 1 + 3600);
}

}  // namespace melforge_test_trainer_predict_windows
