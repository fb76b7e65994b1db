// Sharded builds (--shard K/N) and melforge-build merge: the merged dataset equals an unsharded build, the shard
// assignment is disjoint and complete, and merge refuses shards that do not belong together.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "build_fixture.h"
#include "build_options.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "merge.h"
#include "reader/split_info.h"
#include "reliability/child_process.h"
#include "test_util.h"
#include "test_skip.h"

namespace melforge_test_shard_merge {

using namespace melforge;
using melforge::test::read_split;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

/// A tone corpus with entries that are skipped at scan, probe and segment time, so that every stage's skips are
/// dealt to the shards.
void write_corpus_with_bad_files(const fs::path& in) {
  test::write_tone_corpus(in, 3, 7);
  test::write_text(in / "class0/empty.wav", "");
  test::write_text(in / "class0/text.wav", "this is not audio at all\n");
  test::write_text(in / "class1/readme.txt", "notes");
  test::write_text(in / "stray.txt", "outside any class folder");
  test::write_tone(in / "class1/tiny.wav", 440, 100, 8000);
  test::write_tone(in / "class2/nan.wav", 440, 9000, 8000, 1, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 4000);
}

/// Checks that `got` holds the same clips, in the same order, with the same frames, clip layout, labels, paths and
/// class names as `want`.
void require_same_split(const fs::path& got, const fs::path& want) {
  INFO(got.string() << " vs " << want.string());
  const auto a = read_split(got);
  const auto b = read_split(want);
  REQUIRE(a.dims == b.dims);
  CHECK(a.path == b.path);
  CHECK(a.label == b.label);
  CHECK(a.clips.frame_offset == b.clips.frame_offset);
  CHECK(a.clips.num_samples == b.clips.num_samples);
  CHECK(a.clips.clip_flags == b.clips.clip_flags);
  CHECK(a.classes == b.classes);
  REQUIRE(a.frames.size() == b.frames.size());
  if (!a.frames.empty()) CHECK(std::memcmp(a.frames.data(), b.frames.data(), a.frames.size() * sizeof(float)) == 0);
}

/// Root attributes of a split file.
std::map<std::string, h5::AttributeValue> attributes(const fs::path& file) {
  const auto f = h5::open_file(file);
  return h5::read_attributes(f);
}

std::string run_merge_error(const std::vector<fs::path>& dirs, const fs::path& out) {
  try {
    test::merge_shards(dirs, out, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("shard_range deals 0..n-1 into N contiguous, ordered ranges that cover it once", "[shard]") {
  const int64_t n = GENERATE(0, 1, 2, 5, 17, 100);
  const int count = GENERATE(1, 2, 3, 7);
  CAPTURE(n, count);
  int64_t next = 0;
  for (int k = 1; k <= count; ++k) {
    const auto [first, last] = builder::shard_range(n, builder::ShardSpec{k, count});
    CHECK(first == next);
    CHECK(last >= first);
    CHECK(last - first <= n / count + 1);
    CHECK(last - first >= n / count);
    next = last;
  }
  CHECK(next == n);
  CHECK(builder::shard_range(n, builder::ShardSpec{}) == std::pair<int64_t, int64_t>{0, n});
}

TEST_CASE("parse_shard accepts K/N with 1 <= K <= N and rejects everything else", "[shard]") {
  CHECK(builder::parse_shard("1/3").index == 1);
  CHECK(builder::parse_shard("3/3").count == 3);
  CHECK(builder::parse_shard("1/1").sharded());
  CHECK_FALSE(builder::parse_shard("").sharded());
  CHECK(builder::parse_shard("2/5").text() == "2/5");
  const std::string bad = GENERATE(std::string("0/3"), std::string("4/3"), std::string("x"), std::string("1/0"),
                                   std::string("3"), std::string("-1/3"), std::string("1/3/3"), std::string("1/ 3"),
                                   std::string("+1/3"), std::string("1/999999"), std::string("/3"));
  CAPTURE(bad);
  CHECK_THROWS_AS(builder::parse_shard(bad), InvalidArgument);
}

TEST_CASE("a sharded build plus merge holds the same data, in the same order, as a single build", "[shard][e2e]") {
  TempDir d;
  write_corpus_with_bad_files(d / "in");
  const int shards = GENERATE(1, 2, 3);
  const int64_t frames_per_chunk = GENERATE(0, 7);
  const double max_seconds = GENERATE(0.0, 1.5);
  CAPTURE(shards, frames_per_chunk, max_seconds);
  auto config = test::tone_build_config(d / "in", d / "single");
  config.build.frames_per_chunk = frames_per_chunk;
  config.clips.max_seconds = max_seconds;
  const auto single = builder::run_build(config).report;
  const auto dirs = test::build_shards(config, d / "run", shards);

  std::set<std::string> entries;
  int64_t entry_count = 0;
  for (int k = 1; k <= shards; ++k) {
    const auto r = read_json(dirs[static_cast<size_t>(k - 1)] / "build_report.json");
    CHECK(r["shard"]["index"].get<int>() == k);
    CHECK(r["shard"]["count"].get<int>() == shards);
    CHECK(r["files"]["scanned"].get<int64_t>() ==
          r["files"]["written"].get<int64_t>() + r["files"]["skipped"].get<int64_t>());
    for (const std::string split : {"train", "val", "test"}) {
      const auto file = dirs[static_cast<size_t>(k - 1)] / (split + ".h5");
      const auto a = attributes(file);
      CHECK(a.at("shard_index") == h5::AttributeValue{int64_t{k}});
      CHECK(a.at("shard_count") == h5::AttributeValue{int64_t{shards}});
      for (const auto& p : read_split(file).path) {
        entries.insert(p);
        ++entry_count;
      }
    }
    for (const auto& s : r["skipped"]) {
      entries.insert(s["path"].get<std::string>());
      ++entry_count;
    }
  }
  CHECK(entry_count == single["files"]["scanned"].get<int64_t>());
  CHECK(static_cast<int64_t>(entries.size()) == entry_count);

  const bool copy = GENERATE(false, true);
  CAPTURE(copy);
  const auto merged = test::merge_shards(dirs, d / "run/merged", copy);
  const std::string single_id = single["build_id"].get<std::string>();
  const std::string merged_id = merged["build_id"].get<std::string>();
  CHECK(single_id.size() == 32);
  CHECK(merged_id.size() == 32);
  CHECK(merged_id != single_id);
  for (const std::string split : {"train", "val", "test"}) {
    const fs::path file = d / "run/merged" / (split + ".h5");
    require_same_split(file, d / "single" / (split + ".h5"));
    auto a = attributes(file);
    CHECK(a.at("merged_shards") == h5::AttributeValue{int64_t{shards}});
    CHECK(a.at("build_id") == h5::AttributeValue{merged_id});
    a.erase("merged_shards");
    a.erase("build_id");
    auto single_attributes = attributes(d / "single" / (split + ".h5"));
    CHECK(single_attributes.at("build_id") == h5::AttributeValue{single_id});
    single_attributes.erase("build_id");
    CHECK(a == single_attributes);
    const auto f = h5::open_file(file);
    const auto mel = h5::open_dataset(f, "frames");
    const auto f1 = h5::open_file(d / "single" / (split + ".h5"));
    const auto mel1 = h5::open_dataset(f1, "frames");
    CHECK(h5::chunk_dims(mel) == h5::chunk_dims(mel1));
    CHECK(h5::is_virtual(mel) == (!copy && h5::dims(mel)[0] > 0));
    if (copy) {
      CHECK(h5::filters(mel).deflate_level == h5::filters(mel1).deflate_level);
      CHECK(h5::filters(mel).shuffle == h5::filters(mel1).shuffle);
    }
  }
  for (const char* key : {"scanned", "written", "skipped", "resampled", "padded", "capped"})
    CHECK(merged["files"][key] == single["files"][key]);
  CHECK(merged["files"]["per_split"] == single["files"]["per_split"]);
  CHECK(merged["counts"] == single["counts"]);
  for (const char* key : {"rows", "frames", "padded", "capped"}) CHECK(merged["clips"][key] == single["clips"][key]);
  for (const char* key : {"seconds_in", "seconds_stored", "seconds_dropped", "stored_fraction"})
    CHECK(merged["clips"][key].get<double>() == Approx(single["clips"][key].get<double>()));
  CHECK(single["clips"]["padded"] == 1);
  CHECK((single["clips"]["capped"].get<int>() > 0) == (max_seconds > 0));
  CHECK(merged["merge"]["mode"] == (copy ? "copy" : "virtual"));
  CHECK(read_json(d / "run/merged/build_report.json") == merged);
  CHECK_FALSE(fs::exists(d / "run/merged/.partial"));
  CHECK_FALSE(fs::exists(d / "run/merged/.melforge-build.lock"));
}

TEST_CASE("shards and splits without files merge like an unsharded build", "[shard][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 1, 1);
  auto config = test::tone_build_config(d / "in", d / "single");
  config.build.split = "1,0,0";
  builder::run_build(config);
  const auto dirs = test::build_shards(config, d / "run", 3);
  CHECK(read_split(dirs[0] / "train.h5").dims[0] == 0);
  const bool copy = GENERATE(false, true);
  test::merge_shards(dirs, d / "run/merged", copy);
  for (const std::string split : {"train", "val", "test"})
    require_same_split(d / "run/merged" / (split + ".h5"), d / "single" / (split + ".h5"));
  const auto f = h5::open_file(d / "run/merged/train.h5");
  const auto mel = h5::open_dataset(f, "frames");
  CHECK(h5::virtual_sources(mel).size() == (copy ? 0u : 2u));
  const auto v = h5::open_file(d / "run/merged/val.h5");
  CHECK_FALSE(h5::is_virtual(h5::open_dataset(v, "frames")));
}

TEST_CASE("a merged report names every engine its shards ran on", "[shard][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  const auto dirs = test::build_shards(test::tone_build_config(d / "in", d / "unused"), d / "run", 3);
  CHECK(test::merge_shards(dirs, d / "same", false)["engine"] == "cpu-fftw");
  const fs::path report = dirs[1] / "build_report.json";
  auto r = read_json(report);
  r["engine"] = "cuda-cufft";
  std::ofstream(report) << r.dump();
  const auto merged = test::merge_shards(dirs, d / "mixed", false);
  CHECK(merged["engine"] == "cpu-fftw + cuda-cufft");
  CHECK(merged["merge"]["shards"][1]["engine"] == "cuda-cufft");
}

TEST_CASE("a merged folder holds its sources: moved alone it reads, a missing source is an error", "[shard][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 6);
  const auto config = test::tone_build_config(d / "in", d / "single");
  builder::run_build(config);
  test::merge_shards(test::build_shards(config, d / "run/shards", 3), d / "run/merged", false);
  fs::rename(d / "run/merged", d / "moved");
  fs::remove_all(d / "run");
  for (const std::string split : {"train", "val", "test"})
    require_same_split(d / "moved" / (split + ".h5"), d / "single" / (split + ".h5"));
  {
    const auto f = h5::open_file(d / "moved/train.h5");
    const auto mel = h5::open_dataset(f, "frames");
    const auto sources = h5::virtual_sources(mel);
    REQUIRE(sources.size() == 3);
    CHECK(sources[0].stored_file == "sources/train-1of3.h5");
    CHECK(sources[2].stored_file == "sources/train-3of3.h5");
    CHECK_NOTHROW(h5::check_virtual_sources(mel));
    CHECK(h5::chunk_dims(mel).size() == 2);
  }
  fs::rename(d / "moved/sources/train-2of3.h5", d / "elsewhere.h5");
  const auto f = h5::open_file(d / "moved/train.h5");
  CHECK_THROWS_AS(h5::open_dataset(f, "frames"), IoError);
  CHECK_THROWS_WITH(h5::open_dataset(f, "frames"), Catch::Contains("moved/train.h5:/frames") &&
                                                       Catch::Contains("sources/train-2of3.h5") &&
                                                       Catch::Contains("missing"));
}

TEST_CASE("a merge over a merged folder removes the sources it no longer uses", "[shard][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  const auto dirs = test::build_shards(test::tone_build_config(d / "in", d / "unused"), d / "run", 2);
  test::merge_shards(dirs, d / "merged", false);
  CHECK(fs::exists(d / "merged/sources/train-1of2.h5"));
  CHECK(fs::hard_link_count(d / "merged/sources/train-1of2.h5") == 2);
  builder::MergeOptions again;
  again.shards = dirs;
  again.output = d / "merged";
  again.copy = true;
  again.overwrite = true;
  const auto report = builder::run_merge(again);
  CHECK_FALSE(fs::exists(d / "merged/sources"));
  CHECK(data::read_build_id(d / "merged/val.h5") == report["build_id"].get<std::string>());
}

TEST_CASE("merge refuses shards that do not form one complete series, naming the file", "[shard][e2e]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  const auto config = test::tone_build_config(d / "in", d / "single");
  const auto three = test::build_shards(config, d / "three", 3);
  const auto two = test::build_shards(config, d / "two", 2);
  const fs::path out = d / "merged";

  CHECK_THAT(run_merge_error({three[0], three[2]}, out), Catch::Contains("shard 2/3 missing"));
  CHECK_THAT(run_merge_error({three[0], three[1], two[1]}, out),
             Catch::Contains("shard-2/build_report.json: shard 2/2") && Catch::Contains("same N"));
  fs::copy(three[1], d / "copy-of-2", fs::copy_options::recursive);
  CHECK_THAT(run_merge_error({three[0], three[1], d / "copy-of-2", three[2]}, out),
             Catch::Contains("copy-of-2/build_report.json: shard 2/3 is given twice"));
  CHECK_THAT(run_merge_error({three[0], three[0], three[2]}, out), Catch::Contains("is given twice"));

  const auto other_shard_2 = [&](const std::string& name, const std::function<void(builder::BuildConfig&)>& change) {
    auto c = config;
    change(c);
    c.build.shard = "2/3";
    c.build.output = d / name;
    builder::run_build(c);
    return std::vector<fs::path>{three[0], d / name, three[2]};
  };
  CHECK_THAT(run_merge_error(other_shard_2("mels24", [](auto& c) { c.mel.n_mels = 24; }), out),
             Catch::Contains("mels24/train.h5: attribute 'n_mels' is 24 but 32 in"));
  CHECK_THAT(run_merge_error(other_shard_2("seed7", [](auto& c) { c.build.seed = 7; }), out),
             Catch::Contains("seed7/build_report.json: built from a different corpus, seed or split"));
  CHECK_THAT(run_merge_error(other_shard_2("ratios", [](auto& c) { c.build.split = "0.5,0.3,0.2"; }), out),
             Catch::Contains("ratios/build_report.json: built from a different corpus, seed or split"));

  auto unsharded = config;
  unsharded.build.output = d / "unsharded";
  builder::run_build(unsharded);
  CHECK_THAT(run_merge_error({d / "unsharded"}, out), Catch::Contains("unsharded/build_report.json: no \"shard\""));
  CHECK_THAT(run_merge_error({d / "single-missing"}, out), Catch::Contains("single-missing' is not a folder"));

  {
    auto f = h5::open_file(three[1] / "test.h5", true);
    REQUIRE(H5Adelete(f.id(), "schema_version") >= 0);
    h5::write_attribute_int64(f, "schema_version", 2);
  }
  CHECK_THAT(run_merge_error(three, out), Catch::Contains("shard-2/test.h5: schema_version 2") &&
                                              Catch::Contains("schema 3 (whole clips) only"));
  fs::remove(three[2] / "val.h5");
  CHECK_THAT(run_merge_error(three, out), Catch::Contains("shard-3/val.h5: missing"));
  CHECK_FALSE(fs::exists(out));

  test::merge_shards(two, out, false);
  CHECK_THAT(run_merge_error({out}, d / "merged-again"), Catch::Contains("no \"shard\""));
  CHECK_THAT(run_merge_error(two, out), Catch::Contains("exists and is not empty"));
}

TEST_CASE("the CLI: --shard validation, shard builds and merge", "[shard][e2e][cli]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 4);
  const std::string exe = MELFORGE_BUILD_EXE;
  const std::vector<std::string> common = {"--input",  (d / "in").string(), "--quiet", "--device", "cpu",
                                           "--sample-rate", "8000", "--n-fft", "256", "--hop-length", "64",
                                           "--n-mels", "32", "--short-seconds", "0.25"};
  const auto build = [&](const std::string& shard, const fs::path& out) {
    std::vector<std::string> argv = {exe};
    argv.insert(argv.end(), common.begin(), common.end());
    argv.insert(argv.end(), {"--output", out.string()});
    if (!shard.empty()) argv.insert(argv.end(), {"--shard", shard});
    return test::run_child(argv, d / "log.txt");
  };

  const std::string bad = GENERATE(std::string("0/3"), std::string("4/3"), std::string("x"), std::string("2/"));
  CAPTURE(bad);
  const auto refused = build(bad, d / "bad");
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("--shard: '" + bad + "' must be K/N"));
  CHECK_FALSE(fs::exists(d / "bad"));

  for (int k = 1; k <= 2; ++k) {
    const auto r = build(std::to_string(k) + "/2", d / ("s" + std::to_string(k)));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("shard " + std::to_string(k) + "/2"));
  }
  const auto incomplete = test::run_child({exe, "merge", "--output", (d / "m").string(), (d / "s1").string()},
                                          d / "log.txt");
  CHECK(incomplete.exit_code == 1);
  CHECK_THAT(incomplete.output, Catch::Contains("shard 2/2 missing"));
  CHECK_FALSE(fs::exists(d / "m"));
  const auto no_shards = test::run_child({exe, "merge", "--output", (d / "m").string()}, d / "log.txt");
  CHECK(no_shards.exit_code == 2);
  CHECK_THAT(no_shards.output, Catch::Contains("give the shard folders"));

  const auto merged = test::run_child(
      {exe, "merge", "--output", (d / "m").string(), "--copy", (d / "s2").string(), (d / "s1").string()},
      d / "log.txt");
  INFO(merged.output);
  REQUIRE(merged.exit_code == 0);
  CHECK_THAT(merged.output, Catch::Contains("2 shards") && Catch::Contains("(copy)"));
  const auto full = build("", d / "full");
  REQUIRE(full.exit_code == 0);
  for (const std::string split : {"train", "val", "test"})
    require_same_split(d / "m" / (split + ".h5"), d / "full" / (split + ".h5"));
}

TEST_CASE("h5py reads a merged dataset (virtual and --copy) exactly as the unsharded one", "[shard][e2e][h5py]") {
  if (std::system("/usr/bin/python3 -c 'import h5py, numpy' >/dev/null 2>&1") != 0) {
    MELFORGE_SKIP("Debian's python3-h5py/python3-numpy missing (tools/setup.sh installs them)");
  }
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 5);
  const auto config = test::tone_build_config(d / "in", d / "single");
  builder::run_build(config);
  const auto dirs = test::build_shards(config, d / "shards", 3);
  test::merge_shards(dirs, d / "vds", false);
  test::merge_shards(dirs, d / "copy", true);
  const std::string script =
      "import h5py, numpy as np, sys\n"
      "for merged in sys.argv[2:]:\n"
      "  for s in ('train', 'val', 'test'):\n"
      "    with h5py.File(sys.argv[1] + '/' + s + '.h5', 'r') as a, h5py.File(merged + '/' + s + '.h5', 'r') as b:\n"
      "      assert b['frames'].dtype == a['frames'].dtype and b['frames'].shape == a['frames'].shape, (merged, s)\n"
      "      assert np.array_equal(b['frames'][...], a['frames'][...]), (merged, s, 'frames')\n"
      "      assert not np.isnan(b['frames'][...]).any(), (merged, s, 'nan')\n"
      "      o = b['frame_offset'][...]\n"
      "      for c in range(len(o) - 1):\n"
      "        assert np.array_equal(b['frames'][o[c]:o[c + 1]], a['frames'][o[c]:o[c + 1]]), (merged, s, c)\n"
      "      if a['frames'].shape[0] > 2:\n"
      "        assert np.array_equal(b['frames'][[0, 2]], a['frames'][[0, 2]]), (merged, s, 'fancy')\n"
      "      for n in ('label', 'frame_offset', 'num_samples', 'clip_flags', 'path', 'class_names'):\n"
      "        assert b[n].dtype == a[n].dtype and list(b[n][...]) == list(a[n][...]), (merged, s, n)\n"
      "      for k, v in a.attrs.items():\n"
      "        assert k == 'build_id' or b.attrs[k] == v, (merged, s, k)\n"
      "      assert b.attrs['merged_shards'] == 3\n"
      "print('OK')\n";
  test::write_text(d / "check.py", script);
  const std::string cmd = "cd / && /usr/bin/python3 '" + (d / "check.py").string() + "' '" + (d / "single").string() +
                          "' '" + (d / "vds").string() + "' '" + (d / "copy").string() + "'";
  CHECK(std::system(cmd.c_str()) == 0);
}

}  // namespace melforge_test_shard_merge
