// predict over whole files: a model trained on tone against noise reads a file of tone then noise tile by tile over
// every frame, the file-level vote sees both parts, --windows writes every tile, exit codes and --strict, and a
// 1-hour file holds its decoded samples and frames and nothing that grows with it besides.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>
#include "melforge_test_paths.h"

#include "catch_torch.h"

#include <sndfile.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "melforge/common/errors.h"
#include "mel/mel_math.h"
#include "predict/predict.h"
#include "train/checkpoint.h"
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

/// The tiles predict cuts a file of `samples` samples into with the checkpoint `ck`: (frames, tile, count) for a hop
/// of `hop` frames (0: the tile).
struct Tiling {
  int64_t frames = 0, tile = 0, hop = 0, count = 0;
  double seconds(int64_t frame) const { return static_cast<double>(frame * 64) / kRate; }
};
Tiling tiling(const fs::path& ck, int64_t samples, int64_t hop = 0) {
  Tiling t;
  t.frames = mel::clip_frames(samples, 256, 64, 128);
  t.tile = load_checkpoint(ck).model_config.at("n_frames").get<int64_t>();
  t.hop = hop > 0 ? hop : t.tile;
  for (int64_t start = 0;; start += t.hop) {
    ++t.count;
    if (start + t.tile >= t.frames) break;
  }
  return t;
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

TEST_CASE("predict reads a file of tone then noise tile by tile, and the vote sees both parts",
          "[trainer][predict][windows]") {
  TempDir d;
  const fs::path ck = train_tone_noise(d, 4);
  std::vector<float> mixed;
  append_signal(mixed, 4.0, 440.0, 0);
  append_signal(mixed, 5.0, 0, 77u);
  write_wav(d / "mixed.wav", mixed);
  const Tiling t = tiling(ck, 9 * kRate);

  PredictOptions opts;
  opts.checkpoint = ck;
  opts.inputs = {d / "mixed.wav"};
  opts.windows = d / "w.json";
  const auto rows = predict_json(opts);
  REQUIRE(rows.size() == 1);
  REQUIRE_FALSE(rows[0].contains("error"));
  CHECK(rows[0]["num_windows"] == t.count);
  const auto w = read_json(d / "w.json");
  REQUIRE(static_cast<int64_t>(w.size()) == t.count);
  double mean_tone = 0, first_two_tone = 0, tone_tiles = 0, first_two = 0;
  for (int64_t k = 0; k < t.count; ++k) {
    CAPTURE(k, w[k].dump());
    const double start = t.seconds(k * t.tile), end = std::min(t.seconds(k * t.tile + t.tile), 9.0);
    CHECK(w[k]["path"] == (d / "mixed.wav").string());
    CHECK(w[k]["window"] == k);
    CHECK(w[k]["start"].get<double>() == Approx(start).margin(1e-9));
    CHECK(w[k]["end"].get<double>() == Approx(end).margin(1e-9));
    if (end < 3.95) CHECK(w[k]["predicted"] == "tone");
    if (start > 4.05) CHECK(w[k]["predicted"] == "noise");
    const double p = w[k]["probabilities"]["tone"].get<double>();
    CHECK(p + w[k]["probabilities"]["noise"].get<double>() == Approx(1).margin(1e-5));
    mean_tone += p / static_cast<double>(t.count);
    tone_tiles += w[k]["predicted"] == "tone";
    if (end <= 2.0) {
      first_two_tone += p;
      first_two += 1;
    }
  }
  CHECK(w[t.count - 1]["end"].get<double>() == Approx(9.0));  // every frame is in a tile
  const double file_tone = rows[0]["probabilities"]["tone"].get<double>();
  CHECK(file_tone == Approx(mean_tone).margin(1e-5));
  // The first 2 s alone (what predict scored before whole-file windows) say tone; the mean over the whole file
  // weighs both parts: 4 s of tone, 5 s of noise.
  CHECK(first_two_tone / first_two > 0.9);
  CHECK(file_tone > 0.3);
  CHECK(file_tone < 0.75);

  opts.vote = "majority";
  opts.windows.clear();
  const auto majority = predict_json(opts);
  CHECK(majority[0]["predicted"] == "noise");
  CHECK(majority[0]["probabilities"]["tone"].get<double>() == Approx(tone_tiles / double(t.count)).margin(1e-6));

  opts.vote = "mean";
  opts.hop = 0.128;  // 16 frames: tiles overlapping by about half
  opts.windows = d / "w.csv";
  const Tiling half = tiling(ck, 9 * kRate, 16);
  CHECK(predict_json(opts)[0]["num_windows"] == half.count);
  std::ifstream csv(d / "w.csv");
  std::string line;
  std::getline(csv, line);
  CHECK(line == "path,window,start,end,predicted,detection_score,detected,p_noise,p_tone");
  int64_t k = 0;
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
    CHECK(start == Approx(half.seconds(k * 16)));
    CHECK(end == Approx(std::min(half.seconds(k * 16 + half.tile), 9.0)));
    if (end < 3.95) CHECK(predicted == "tone");
    if (start > 4.05) CHECK(predicted == "noise");
  }
  CHECK(k == half.count);
}

TEST_CASE("predict pads the last tile of a file and scores a file shorter than one tile", "[trainer][predict][windows]") {
  TempDir d;
  const fs::path ck = train_tone_noise(d, 1);
  std::vector<float> s;
  append_signal(s, 4.5, 440.0, 0);
  write_wav(d / "a.wav", s);
  s.clear();
  append_signal(s, 0.1, 440.0, 0);  // 0.1 s: less than one tile, scored from its real frames
  write_wav(d / "b.wav", s);
  PredictOptions opts;
  opts.checkpoint = ck;
  opts.inputs = {d / "a.wav", d / "b.wav"};
  opts.windows = d / "w.json";
  const auto rows = predict_json(opts);
  const Tiling a = tiling(ck, 36000);
  CHECK(rows[0]["num_windows"] == a.count);
  CHECK(rows[1]["num_windows"] == 1);
  const auto w = read_json(d / "w.json");
  REQUIRE(static_cast<int64_t>(w.size()) == a.count + 1);
  CHECK(w[a.count - 1]["end"].get<double>() == Approx(4.5));
  CHECK(w[a.count]["start"].get<double>() == 0.0);
  CHECK(w[a.count]["end"].get<double>() == Approx(0.1));
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

TEST_CASE("predict on a 1-hour file holds its samples and frames, nothing more grows with it",
          "[trainer][predict][windows][memory]") {
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
  // A file is decoded whole and its frames computed over the whole clip (as melforge-build stores it): the hour's
  // samples at the model's 8 kHz (110 MiB), its 450,001 frames of 32 bands as float32 (55 MiB) and their float16
  // bytes (27 MiB) are held at once; the tiles go through the model kPredictBatchSegments at a time, so besides those
  // only the scores (48 bytes a tile) and the allocator's settling grow with the file.
  const int64_t frames_bytes = int64_t{450001} * 32 * 6;
  CHECK(hour.peak_rss_bytes < five_min.peak_rss_bytes + whole_file_bytes + frames_bytes + (int64_t{48} << 20));
  std::ifstream w(d / "hour.windows.csv");
  int64_t lines = 0;
  for (std::string line; std::getline(w, line);) ++lines;
  CHECK(lines == 1 + tiling(ck, int64_t{3600} * kRate).count);
}

}  // namespace melforge_test_trainer_predict_windows
