// predict: featurize_clip gives exactly the frames melforge-build stored for the same files (float16 and float32
// builds), and run_predict scores files and folders exactly as evaluate() scores the dataset's clips (the same tiles
// over every frame, the same vote), listing unreadable files with their reason.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ATen.h>

#include "catch_torch.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "data/dataset.h"
#include "eval/evaluate.h"
#include "melforge/common/errors.h"
#include "mel/mel_math.h"
#include "melforge/common/h5.h"
#include "models/cnn.h"
#include "predict/predict.h"
#include "reliability/child_process.h"
#include "test_skip.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "trainer_fixture.h"
#include "venv_python.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_predict {

using namespace melforge;
using namespace melforge::trainer;
using melforge::test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("featurize_clip equals the builder's stored frames bit for bit", "[trainer][predict]") {
  const mel::DType dtype = GENERATE(mel::DType::float16, mel::DType::float32);
  const std::string log = GENERATE("db", "ln");
  CAPTURE(mel::to_string(dtype), log);
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 5);
  auto c = test::tiny_build_config(d / "in", d / "out");
  c.build.dtype = dtype;
  c.mel.log = mel::parse_log_mode(log);
  builder::run_build(c);
  const Dataset ds = load_dataset(d / "out");

  int64_t files = 0;
  for (const Split* split : {&ds.train, &ds.val, &ds.test}) {
    for (int64_t f = 0; f < split->files(); ++f) {
      CAPTURE(split->name, split->paths[f]);
      const at::Tensor got = featurize_clip(d / "in" / split->paths[f], ds.info, 2);
      const at::Tensor want = split->read_clips(f, 1);
      REQUIRE(got.sizes() == want.sizes());
      CHECK(got.scalar_type() == at::kFloat);
      CHECK(at::equal(got, want));
      ++files;
    }
  }
  CHECK(files == 18);
}

TEST_CASE("featurize_clip refuses unreadable files and gives a very short one its one frame", "[trainer][predict]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 2);
  auto c = test::tiny_build_config(d / "in", d / "out");
  builder::run_build(c);
  const Dataset ds = load_dataset(d / "out", false);
  test::write_text(d / "bad.wav", "not audio");
  test::write_tone(d / "short.wav", 440, 100, 8000);  // 12.5 ms: less than one STFT window of 256 samples
  CHECK_THROWS_AS(featurize_clip(d / "bad.wav", ds.info), AudioError);
  CHECK(featurize_clip(d / "short.wav", ds.info).sizes() == at::IntArrayRef({mel::clip_frames(100, 256, 64, 128),
                                                                            ds.info.n_mels}));
  CHECK_THROWS_AS(featurize_clip(d / "missing.wav", ds.info), AudioError);
}

namespace {

/// Saves a checkpoint of a seeded CNN for `ds` and returns the model.
std::shared_ptr<CnnNetImpl> write_checkpoint(const Dataset& ds, const fs::path& path, int64_t positive) {
  at::manual_seed(5);
  CnnConfig cc = CnnConfig::from_info(ds.info, ds.num_classes());
  cc.hidden = 32;
  auto model = std::make_shared<CnnNetImpl>(cc);
  model->set_input_normalization(ds.train.frames.mean().item<double>(), ds.train.frames.std().item<double>());
  Checkpoint ck;
  ck.version = kCheckpointVersion;
  ck.model_config = model->config_json();
  ck.mel = ds.info.to_json();
  ck.class_names = ds.class_names;
  ck.positive_index = positive;
  ck.positive_class = ds.class_names[positive];
  ck.epoch = 3;
  ck.model = state_dict(*model);
  save_checkpoint(ck, path);
  return model;
}

/// Builds two tone classes of d/in into d/out and saves a checkpoint d/ck.pt for it (positive class 0).
Dataset tone_dataset_with_checkpoint(const TempDir& d) {
  test::write_tone_corpus(d / "in", 2, 2);
  builder::run_build(test::tiny_build_config(d / "in", d / "out"));
  Dataset ds = load_dataset(d / "out");
  write_checkpoint(ds, d / "ck.pt", 0);
  return ds;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("run_predict scores files exactly as evaluate() scores the dataset's clips", "[trainer][predict]") {
  const std::string vote = GENERATE("mean", "majority");
  CAPTURE(vote);
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 5);
  builder::run_build(test::tiny_build_config(d / "in", d / "out"));
  const Dataset ds = load_dataset(d / "out");
  auto model = write_checkpoint(ds, d / "ck.pt", 2);
  test::write_text(d / "in/class1/broken.wav", "RIFF....garbage");
  test::write_text(d / "in/notes.txt", "ignored: not an audio extension");

  PredictOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.inputs = {d / "in", d / "missing.wav"};
  opts.format = "json";
  opts.vote = vote;
  opts.threshold = 0.4;
  opts.threads = 2;
  opts.device = "cpu";
  std::ostringstream out, log;
  run_predict(opts, out, log);
  const auto j = nlohmann::json::parse(out.str());
  REQUIRE(j.is_array());
  CHECK(j.size() == 18 + 2);
  CHECK_THAT(log.str(), Catch::Contains("18 file(s) scored, 2 unreadable"));

  std::map<std::string, nlohmann::json> by_path;
  for (const auto& row : j) by_path[row["path"].get<std::string>()] = row;
  CHECK(by_path.count((d / "in/class1/broken.wav").string()));
  CHECK(by_path[(d / "in/class1/broken.wav").string()].contains("error"));
  CHECK_THAT(by_path[(d / "missing.wav").string()]["error"].get<std::string>(), Catch::Contains("missing.wav"));
  CHECK_FALSE(by_path.count((d / "in/notes.txt").string()));

  EvalOptions eo;
  eo.vote = vote;
  eo.threshold = 0.4;
  int64_t compared = 0;
  for (const Split* split : {&ds.train, &ds.val, &ds.test}) {
    eo.view = resolve_view_options(data::views::ViewOptions{}, *split, "cnn");
    const int64_t tile = example_frames(eo.view, *split);
    const EvalResult r = evaluate(*model, *split, 2, 1.0, eo, at::kCPU);
    for (int64_t f = 0; f < split->files(); ++f) {
      const std::string path = (d / "in" / split->paths[f]).string();
      CAPTURE(path);
      REQUIRE(by_path.count(path));
      const auto& row = by_path[path];
      REQUIRE_FALSE(row.contains("error"));
      CHECK(row["num_windows"].get<int64_t>() == (split->clip_frames(f) + tile - 1) / tile);
      CHECK(row["predicted"] == ds.class_names[r.files.predicted[f].item<int64_t>()]);
      CHECK(row["detection_score"].get<double>() == Approx(r.files.detection_score[f].item<double>()).margin(1e-6));
      CHECK(row["detected"].get<bool>() == r.files.detected[f].item<bool>());
      for (int64_t c = 0; c < ds.num_classes(); ++c)
        CHECK(row["probabilities"][ds.class_names[c]].get<double>() ==
              Approx(r.files.class_probs[f][c].item<double>()).margin(1e-6));
      ++compared;
    }
  }
  CHECK(compared == 18);

  opts.format = "csv";
  opts.inputs = {d / "in/class0", d / "in/class1/broken.wav"};
  std::ostringstream csv, log2;
  run_predict(opts, csv, log2);
  const auto lines = split_lines(csv.str());
  REQUIRE(lines.size() == 1 + 6 + 1);
  CHECK(lines[0] == "path,predicted,detection_score,detected,p_class0,p_class1,p_class2,error");
  CHECK_THAT(lines.back(), Catch::StartsWith((d / "in/class1/broken.wav").string() + ",,,,,,,"));
  CHECK(std::count(lines[1].begin(), lines[1].end(), ',') == 7);
  CHECK_THAT(lines[1], Catch::EndsWith(","));
}

TEST_CASE("run_predict fails when nothing can be scored, and checks its options", "[trainer][predict]") {
  TempDir d;
  tone_dataset_with_checkpoint(d);
  test::write_text(d / "junk/a.wav", "x");
  PredictOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.inputs = {d / "junk"};
  std::ostringstream out, log;
  CHECK_THROWS_AS(run_predict(opts, out, log), AudioError);
  CHECK_THAT(out.str(), Catch::Contains("a.wav"));
  opts.inputs = {d / "empty"};
  fs::create_directories(d / "empty");
  CHECK_THROWS_AS(run_predict(opts, out, log), InvalidArgument);

  PredictOptions bad = opts;
  bad.format = "xml";
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = opts;
  bad.inputs.clear();
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = opts;
  bad.checkpoint.clear();
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = opts;
  bad.threshold = 0;
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = opts;
  bad.device = "tpu";
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  opts.inputs = {d / "in"};
  opts.checkpoint = d / "nope.pt";
  CHECK_THROWS_AS(run_predict(opts, out, log), IoError);
}

TEST_CASE("predict's folder walk: hidden entries ignored, broken links and link loops reported", "[trainer][predict]") {
  TempDir d;
  const Dataset ds = tone_dataset_with_checkpoint(d);
  fs::create_directories(d / "q/.git");
  fs::copy_file(d / "in" / ds.train.paths.at(0), d / "q/good.wav");
  test::write_text(d / "q/._good.wav", "Mac OS X AppleDouble resource fork");
  test::write_text(d / "q/.git/x.wav", "not audio");
  fs::create_symlink(d / "q/missing.wav", d / "q/dangling.wav");
  fs::create_symlink(".", d / "q/loop");
  PredictOptions opts;
  opts.checkpoint = d / "ck.pt";
  opts.inputs = {d / "q"};
  std::ostringstream out, log;
  run_predict(opts, out, log);
  const auto lines = split_lines(out.str());
  INFO(out.str());
  REQUIRE(lines.size() == 4);
  CHECK_THAT(lines[1], Catch::StartsWith((d / "q/dangling.wav").string() + ",") &&
                           Catch::Contains("broken symbolic link"));
  CHECK_THAT(lines[2], Catch::StartsWith((d / "q/good.wav").string() + ",c"));
  CHECK_THAT(lines[3], Catch::StartsWith((d / "q/loop").string() + ",") && Catch::Contains("symbolic link loop"));

  opts.include_hidden = true;
  std::ostringstream all;
  run_predict(opts, all, log);
  CHECK_THAT(all.str(), Catch::Contains((d / "q/._good.wav").string()) &&
                            Catch::Contains((d / "q/.git/x.wav").string()));
}

TEST_CASE("predict's folder walk reports a folder it cannot read, never drops it", "[trainer][predict]") {
  TempDir d;
  fs::permissions(d.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  test::write_text(d / "q/a.wav", "x");
  test::write_text(d / "q/locked/b.wav", "x");
  fs::permissions(d / "q/locked", fs::perms::none);
  test::ChildOptions as;
  if (::geteuid() == 0) as.uid = 65534;
  const auto text = test::run_in_child([&] {
    std::string s;
    for (const auto& in : collect_inputs({d / "q"})) s += in.path.string() + "|" + in.error + "\n";
    return s;
  }, as);
  fs::permissions(d / "q/locked", fs::perms::owner_all);
  if (!text) MELFORGE_SKIP("running as root, whose reads bypass chmod 000, and a child cannot switch to uid 65534");
  CHECK(*text == (d / "q/a.wav").string() + "|\n" + (d / "q/locked").string() + "|" + (d / "q/locked").string() +
                     ": cannot read folder: Permission denied\n");
}

namespace {

/// Replaces the class_names dataset of the three split files of `data` by `names` (raw bytes, as a dataset written
/// by another tool may hold them).
void rewrite_class_names(const fs::path& data, const std::vector<std::string>& names) {
  for (const char* split : {"train.h5", "val.h5", "test.h5"}) {
    h5::File file = h5::open_file(data / split, true);
    REQUIRE(H5Ldelete(file.id(), "class_names", H5P_DEFAULT) >= 0);
    h5::write_strings(file, "class_names", names);
  }
}

}  // namespace

TEST_CASE("names that are not UTF-8 go through build, train and predict, and Python reads every output",
          "[trainer][predict][utf8]") {
  if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0)
    MELFORGE_SKIP("/usr/bin/python3 with h5py is not available (tools/setup.sh installs it)");
  const bool raw_in_dataset = GENERATE(false, true);
  CAPTURE(raw_in_dataset);
  TempDir d;
  test::write_tone_corpus(d / "in", 2, 6);
  fs::rename(d / "in" / "class1", d / "in" / "c\xff");
  test::write_tone(d / "in" / "c\xff" / "f\xff.wav", 600, 12000, 8000);
  test::write_text(d / "in" / "class0" / "bad\xfe.wav", "not audio");
  builder::run_build(test::tiny_build_config(d / "in", d / "data"));
  if (raw_in_dataset) rewrite_class_names(d / "data", {"class0", "c\xff"});

  std::ostringstream log;
  const auto result = trainer::train(test::tiny_config(d / "data", d / "run", 1), log);
  INFO(log.str());
  REQUIRE(result.test.has_value());

  PredictOptions opts;
  opts.checkpoint = d / "run" / "checkpoints" / "best.pt";
  opts.inputs = {d / "in"};
  opts.threads = 2;
  opts.device = "cpu";
  for (const std::string format : {"json", "csv"}) {
    opts.format = format;
    std::ostringstream out, plog;
    run_predict(opts, out, plog);
    std::ofstream(d / ("predict." + format), std::ios::binary) << out.str();
  }
  test::write_text(d / "check.py",
                   "import csv, json, os, sys, h5py\n"
                   "d = sys.argv[1]\n"
                   "classes = ['class0', 'c\\\\xff']\n"
                   "for split in ('train', 'val', 'test'):\n"
                   "    with h5py.File(os.path.join(d, 'data', split + '.h5'), 'r') as h:\n"
                   "        h['class_names'][:]; h['path'].asstr()[:]\n"
                   "assert json.load(open(os.path.join(d, 'data', 'build_report.json')))['classes'] == classes\n"
                   "for line in open(os.path.join(d, 'run', 'metrics.jsonl'), encoding='utf-8'):\n"
                   "    json.loads(line)\n"
                   "assert json.load(open(os.path.join(d, 'run', 'report.json'), encoding='utf-8'))\n"
                   "rows = json.load(open(os.path.join(d, 'predict.json'), encoding='utf-8'))\n"
                   "paths = [os.path.basename(r['path']) for r in rows]\n"
                   "assert len(rows) == 16, len(rows)\n"
                   "assert 'f\\\\xff.wav' in paths and 'bad\\\\xfe.wav' in paths, paths\n"
                   "scored = [r for r in rows if 'error' not in r]\n"
                   "assert len(scored) == 15, rows\n"
                   "assert all(sorted(r['probabilities']) == sorted(classes) for r in scored)\n"
                   "assert all(r['predicted'] in classes for r in scored)\n"
                   "assert any('c\\\\xff' in r['path'] for r in scored)\n"
                   "table = list(csv.DictReader(open(os.path.join(d, 'predict.csv'), encoding='utf-8', newline='')))\n"
                   "assert [os.path.basename(r['path']) for r in table] == paths\n"
                   "assert 'p_c\\\\xff' in table[0], list(table[0])\n"
                   "print('OK', len(rows))\n");
  std::string output;
  const int rc = test::run_command("/usr/bin/python3 '" + (d / "check.py").string() + "' '" + d.path().string() + "'",
                                   output);
  INFO(output);
  CHECK(rc == 0);
  CHECK_THAT(output, Catch::Contains("OK 16"));
}

}  // namespace melforge_test_trainer_predict
