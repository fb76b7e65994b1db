// Waveform augmentation in melforge-build (issue 18): the copies of each split, their recipes in the HDF5, the
// stages, the --max-ram accounting of the banks, the report, the bench and merge.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "audio_stage.h"
#include "augment/augment.h"
#include "bench.h"
#include "augment_build_fixture.h"
#include "build_fixture.h"
#include "build_state.h"
#include "h5_writer.h"
#include "mel/mel_math.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "pipeline.h"
#include "reader/split_info.h"
#include "test_util.h"

namespace melforge_test_augment_build {

using namespace melforge;
using melforge::test::read_split;
using melforge::test::TempDir;
using namespace melforge::test::augment_fixture;
namespace fs = std::filesystem;

namespace {

/// A stage that counts the files it sees (to show that nothing was decoded).
class CountStage : public builder::AudioStage {
 public:
  std::string name() const override { return "count"; }
  void run(builder::BatchFile&) const override { calls++; }
  mutable std::atomic<int64_t> calls{0};
};

}  // namespace

TEST_CASE("augmented copies follow their clean file only in the splits asked for, with draw_recipe's recipes",
          "[augment][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 5);
  write_banks(d / "banks");
  const std::string splits = GENERATE(std::string("train"), std::string("train,val"));
  auto c = augment_config(d / "in", d / "banks", d / "out");
  c.augment.splits = splits;
  const auto r = builder::run_build(c).report;
  const auto mask = c.augment.split_mask();
  const std::vector<std::string> ext = c.build.extension_list();
  const auto noise = augment::load_bank(c.augment.noise, 8000, ext, 1, "--noise");
  const auto rir = augment::load_bank(c.augment.rir, 8000, ext, 1, "--rir");
  const Built b = read_build(d / "out");
  std::map<std::string, std::string> split_of;
  int64_t rows = 0, augmented_rows = 0;
  for (std::size_t s = 0; s < 3; ++s) {
    const std::string split = builder::kSplitNames[s];
    const auto& data = b.splits.at(split);
    const auto& rec = b.recipes.at(split);
    const int k = mask[s] ? c.augment.copies : 0;
    INFO(split);
    REQUIRE(data.path.size() % static_cast<std::size_t>(1 + k) == 0);
    const std::size_t files = data.path.size() / static_cast<std::size_t>(1 + k);
    CHECK(r["augmentation"]["copies"][split]["clean"].get<std::size_t>() == files);
    CHECK(r["augmentation"]["copies"][split]["augmented"].get<std::size_t>() == files * static_cast<std::size_t>(k));
    CHECK(r["files"]["per_split"][split].get<std::size_t>() == data.path.size());
    for (std::size_t i = 0; i < data.path.size(); ++i) {
      const std::size_t first = i - i % static_cast<std::size_t>(1 + k);
      CHECK(data.path[i] == data.path[first]);
      CHECK(data.label[i] == data.label[first]);
      REQUIRE(rec.copy[i] == static_cast<int32_t>(i - first));
      const augment::Recipe want = augment::draw_recipe(c.augment, noise, rir, c.build.seed, data.path[i], rec.copy[i]);
      const int64_t clean = data.clips.num_samples[first];
      const auto whole = static_cast<double>(clean) / want.speed;
      CHECK(std::abs(static_cast<double>(data.clips.num_samples[i]) - whole) <= 2.0);
      CHECK(data.clip_frames(i) == mel::clip_frames(data.clips.num_samples[i], 256, 64, 128));
      CHECK(rec.speed[i] == static_cast<float>(want.speed));
      CHECK(rec.gain_db[i] == static_cast<float>(want.gain_db));
      CHECK(rec.rir[i] == (want.rir < 0 ? "" : rir.clips[static_cast<std::size_t>(want.rir)].path));
      CHECK(rec.noise[i] == (want.noise < 0 ? "" : noise.clips[static_cast<std::size_t>(want.noise)].path));
      CHECK(same(rec.snr_db[i], want.noise < 0 ? NAN : static_cast<float>(want.snr_db)));
      augmented_rows += rec.copy[i] > 0;
      const auto [it, fresh] = split_of.emplace(data.path[i], split);
      CHECK(it->second == split);
    }
    rows += static_cast<int64_t>(data.path.size());
  }
  CHECK(augmented_rows > 0);
  CHECK(r["files"]["written"].get<int64_t>() == rows);
  CHECK(split_of.size() == 18);
  CHECK(r["files"]["skipped"].get<int>() == 0);
  CHECK(r["times_s"].contains("augment"));
  CHECK(r["times_s"].contains("augment_init"));
  CHECK(r["augmentation"]["augmenter"] == "cpu-fftw");
  CHECK(r["augmentation"]["banks"]["noise"]["clips"] == 3);
  CHECK(r["augmentation"]["banks"]["rir"]["clips"] == 2);
  CHECK(r["augmentation"]["banks"]["noise"]["bytes"].get<int64_t>() == noise.bytes());
  for (const std::string split : {"train", "val", "test"}) {
    const data::SplitInfo info = data::read_split_info(d / "out" / (split + ".h5"), split);
    CHECK(info.paths == b.splits.at(split).path);
    CHECK(info.labels.size() == b.splits.at(split).files());
  }
  auto f = h5::open_file(d / "out/train.h5");
  CHECK(h5::read_attribute_int64(f, "augment_copies") == 2);
  CHECK(h5::read_attribute_string(f, "augment_splits") == splits);
}

TEST_CASE("the clean copies of an augmented build equal a build without augmentation", "[augment][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  write_banks(d / "banks");
  auto plain = augment_config(d / "in", d / "banks", d / "plain", 0);
  plain.augment = {};
  builder::run_build(plain);
  builder::run_build(augment_config(d / "in", d / "banks", d / "aug", 1));
  const Built p = read_build(d / "plain", false);
  const Built a = read_build(d / "aug");
  for (const std::string split : {"train", "val", "test"}) {
    const auto& ps = p.splits.at(split);
    const auto& as = a.splits.at(split);
    const auto& rec = a.recipes.at(split);
    std::vector<float> clean;
    std::vector<std::string> paths;
    bool changed = false;
    for (std::size_t i = 0; i < rec.size(); ++i) {
      const std::vector<float> row = as.clip(i);
      if (rec.copy[i] == 0) {
        clean.insert(clean.end(), row.begin(), row.end());
        paths.push_back(as.path[i]);
      } else {
        changed = changed || row != as.clip(i - 1);
      }
    }
    INFO(split);
    CHECK(paths == ps.path);
    CHECK(clean == ps.frames);
    CHECK(changed == (split == "train"));
  }
  auto f = h5::open_file(d / "plain/train.h5");
  CHECK_FALSE(h5::exists(f, "aug_copy"));
  CHECK_FALSE(h5::has_attribute(f, "augment_copies"));
}

TEST_CASE("an augmented build is the same across --threads and --max-ram batch sizes", "[augment][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 5);
  write_banks(d / "banks");
  auto one = augment_config(d / "in", d / "banks", d / "one");
  one.build.threads = 1;
  auto two = augment_config(d / "in", d / "banks", d / "two");
  two.build.threads = 2;
  two.build.max_ram = "64.2M";
  const auto r1 = builder::run_build(one).report;
  const auto r2 = builder::run_build(two).report;
  CHECK(r1["batches"].get<int>() < r2["batches"].get<int>());
  const Built a = read_build(d / "one");
  const Built b = read_build(d / "two");
  for (const std::string split : {"train", "val", "test"}) {
    INFO(split);
    CHECK(a.splits.at(split).frames == b.splits.at(split).frames);
    CHECK(a.splits.at(split).clips.frame_offset == b.splits.at(split).clips.frame_offset);
    CHECK(a.splits.at(split).path == b.splits.at(split).path);
    CHECK(same_recipes(a.recipes.at(split), b.recipes.at(split)));
  }
}

TEST_CASE("bad augmentation flags fail before any work", "[augment]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  write_banks(d / "banks");
  auto c = augment_config(d / "in", d / "banks", d / "out");
  const std::string which = GENERATE(std::string("copies"), std::string("snr"), std::string("speed"),
                                     std::string("noise"), std::string("splits"), std::string("off"),
                                     std::string("prob"));
  std::string flag;
  if (which == "copies") c.augment.copies = 65, flag = "--augment-copies";
  if (which == "snr") c.augment.snr_db = "20,5", flag = "--snr-db";
  if (which == "speed") c.augment.speed = "0.9,3", flag = "--speed";
  if (which == "noise") c.augment.noise = d / "missing", flag = "--noise";
  if (which == "splits") c.augment.splits = "train,bogus", flag = "--augment-splits";
  if (which == "off") c.augment.copies = 0, flag = "--augment-copies";
  if (which == "prob") c.augment.rir_prob = 1.5, flag = "--rir-prob";
  INFO(which);
  CHECK_THROWS_WITH(builder::run_build(c), Catch::Contains(flag));
  CHECK_THROWS_AS(builder::run_build(c), InvalidArgument);
  CHECK_FALSE(fs::exists(d / "out"));
}

TEST_CASE("a split named by --augment-splits that gets no file is refused before any decode", "[augment]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  write_banks(d / "banks");
  auto c = augment_config(d / "in", d / "banks", d / "out");
  c.build.split = "1,0,0";
  c.augment.splits = "train,val";
  const auto count = std::make_shared<CountStage>();
  CHECK_THROWS_WITH(builder::run_build(c, {count}), Catch::Contains("--augment-splits") && Catch::Contains("val"));
  CHECK(count->calls == 0);
  CHECK_FALSE(fs::exists(d / "out/build_report.json"));
}

TEST_CASE("a corrupt noise file fails the build before any input is decoded, naming the file", "[augment]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  write_banks(d / "banks");
  test::write_text(d / "banks/noise/music/broken.wav", "RIFF this is not a wav file at all, only some text");
  const auto count = std::make_shared<CountStage>();
  const auto c = augment_config(d / "in", d / "banks", d / "out");
  CHECK_THROWS_WITH(builder::run_build(c, {count}), Catch::Contains("broken.wav") && Catch::Contains("--noise"));
  CHECK(count->calls == 0);
  CHECK_FALSE(fs::exists(d / "out/build_report.json"));
}

TEST_CASE("a --max-ram too small for the banks is refused, naming the bytes and the flags", "[augment]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  write_banks(d / "banks");
  test::write_tone(d / "banks/noise/long.wav", 300, 8000 * 60, 8000);
  auto c = augment_config(d / "in", d / "banks", d / "out");
  c.build.max_ram = "65M";
  const auto count = std::make_shared<CountStage>();
  CHECK_THROWS_AS(builder::run_build(c, {count}), InvalidArgument);
  CHECK_THROWS_WITH(builder::run_build(c, {count}), Catch::Contains("--max-ram 65M") && Catch::Contains("--noise") &&
                                                        Catch::Contains("MiB"));
  CHECK(count->calls == 0);
  c.build.max_ram = "80M";
  CHECK_NOTHROW(builder::run_build(c));
}

TEST_CASE("a copy sped up by a factor is a whole clip of frames / speed samples", "[augment]") {
  TempDir d;
  const double speed = GENERATE(0.8, 1.25, 2.0);
  test::write_tone(d / "a.wav", 500, 12000, 8000);
  builder::InputFile in;
  in.path = d / "a.wav";
  in.rel_path = "a.wav";
  builder::PlannedFile f;
  f.input = &in;
  f.info = audio::probe(in.path);
  f.frames = audio::output_frames(f.info, 8000);
  builder::BuildConfig config = test::tone_build_config(d.path(), d / "out");
  config.augment.copies = 1;
  config.augment.speed = std::to_string(speed);
  const builder::BuildState state(config);
  f.plan = builder::plan_clip(f.frames, 0, config.mel);
  builder::PlannedCopy row{&f, {}, {}};
  row.recipe.copy = 1;
  row.recipe.speed = speed;
  row.plan = state.row_plan(f, speed);
  const double want = std::round(12000 / speed);
  CHECK(std::abs(static_cast<double>(row.plan.samples) - want) <= 1);
  CHECK(row.plan.frames == mel::clip_frames(row.plan.samples, 256, 64, 128));
  audio::DecodeOptions decode;
  decode.sample_rate = 8000;
  const builder::DecodeStage stage(decode);
  std::vector<float> arena(static_cast<std::size_t>(row.plan.samples), 7.0f);
  builder::BatchFile b;
  b.file = &f;
  b.recipe = row.recipe;
  b.plan = row.plan;
  b.samples = arena;
  stage.run(b);
  CHECK(b.decoded_frames == row.plan.samples);
  CHECK(std::none_of(arena.begin(), arena.end(), [](float v) { return v == 7.0f; }));
  CHECK(std::abs(arena.back()) > 0.0f);
  builder::PlannedCopy clean{&f, {}, f.plan};
  CHECK(stage.batch_bytes(row) == 4 * row.plan.samples);
  CHECK(stage.worker_bytes(row) > 0);
  CHECK(stage.batch_bytes(clean) == 4 * 12000);
}

TEST_CASE("the bench lists the augmentation stage beside decode", "[augment][bench]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 3);
  write_banks(d / "banks");
  fs::create_directories(d / "scratch");
  builder::BenchOptions o;
  o.repeats = 1;
  o.scratch = d / "scratch";
  std::ostringstream table;
  auto c = augment_config(d / "in", d / "banks", {}, 1);
  const auto b = builder::run_bench(c, o, table, table);
  REQUIRE(b["stages"].contains("augment"));
  REQUIRE(b["stages"].contains("decode"));
  CHECK(b["stages"]["augment"]["per_s"].contains("copies"));
  CHECK_THAT(table.str(), Catch::Contains("\naugment "));
  CHECK(b["checks"]["written_equal_build"].get<bool>());
  CHECK(b["files"]["written"].get<int64_t>() > 8);
}

TEST_CASE("merge carries the recipe datasets of augmented shards and refuses mixing them with plain ones",
          "[augment][shard][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  write_banks(d / "banks");
  const auto c = augment_config(d / "in", d / "banks", d / "single");
  const auto single = builder::run_build(c).report;
  const auto dirs = test::build_shards(c, d / "shards", 2);
  const bool copy = GENERATE(false, true);
  const auto m = test::merge_shards(dirs, d / "merged", copy);
  const Built a = read_build(d / "single");
  const Built b = read_build(d / "merged");
  for (const std::string split : {"train", "val", "test"}) {
    INFO(split);
    CHECK(a.splits.at(split).frames == b.splits.at(split).frames);
    CHECK(a.splits.at(split).clips.frame_offset == b.splits.at(split).clips.frame_offset);
    CHECK(a.splits.at(split).clips.num_samples == b.splits.at(split).clips.num_samples);
    CHECK(same_recipes(a.recipes.at(split), b.recipes.at(split)));
  }
  CHECK(m["augmentation"]["copies"] == single["augmentation"]["copies"]);

  auto plain = c;
  plain.augment = {};
  const auto plain_dirs = test::build_shards(plain, d / "plain", 2);
  CHECK_THROWS_WITH(test::merge_shards({dirs[0], plain_dirs[1]}, d / "mixed", copy),
                    Catch::Contains("--augment-copies"));
}

}  // namespace melforge_test_augment_build
