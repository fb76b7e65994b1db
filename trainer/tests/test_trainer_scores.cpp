// Scoring outputs of speaker verification (issue 32): several trial lists in one run (embedded once, each list's EER
// as a single-list run's), trial paths as the recipes write them (stored, absolute, under --trials-root), the scores
// files (`score label enroll test`) against naive cosine scores of `embed`'s output, their refusals, --embed-crops
// against a naive mean of crop embeddings, and train's final evaluation over two lists.
#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>

#include "catch_torch.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "data/dataset.h"
#include "embed/embed_command.h"
#include "eval/batching.h"
#include "eval/eval_command.h"
#include "eval/verification.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "models/model.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_scores {

using namespace melforge;
using melforge::test::read_json;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// How a list writes a stored path `p`: as stored, absolute under the corpus folder, or relative to the corpus
/// folder's parent (`in-12x4/class0/f0.wav`, resolved with --trials-root <that parent>).
enum class Form { stored, absolute, parent_relative };

std::vector<int32_t> scores_labels(const trainer::Split& split) {
  std::vector<int32_t> out;
  for (int64_t f = 0; f < split.files(); ++f) out.push_back(static_cast<int32_t>(split.label[f].item<int64_t>()));
  return out;
}

/// One trained speaker run shared by the tests: 12 tone classes of 4 files, split by class, a quarter-width resnet-se
/// for 1 epoch on crops of 0.5 s, its final test evaluation over two lists (a.txt: the first half of 40 generated
/// trials as stored paths; b.txt: the second half as absolute paths).
struct ScoresRun {
  TempDir dir;
  fs::path data, run, corpus;
  std::vector<std::string> paths;
  std::vector<verification::Trial> trials;
  ScoresRun() {
    data = test::build_tone_dataset(dir.path(), 12, 4, "data",
                                    [](builder::BuildConfig& c) { c.build.split_by = builder::SplitBy::class_; });
    corpus = dir / "in-12x4";
    run = dir / "run";
    const trainer::Dataset d = trainer::load_dataset(data, /*load_mel=*/false);
    paths = d.test.paths;
    trainer::VerifyOptions v;
    v.trial_count = 40;
    trials = trainer::split_trials(scores_labels(d.test), paths, v, false, "test");
    write_list(dir / "a.txt", 0, 20, Form::stored);
    write_list(dir / "b.txt", 20, 40, Form::absolute);
    trainer::TrainConfig c = test::tiny_config(data, run, 1);
    c.model.model = "resnet-se";
    c.model.width = "quarter";
    c.model.embedding_dim = 32;
    c.train.task = "verification";
    c.view.crop_seconds = 0.5;
    c.verify.trials = {dir / "a.txt", dir / "b.txt"};
    c.runtime.threads = 1;
    std::ostringstream log;
    trainer::train(c, log);
  }

  /// The field a list of `form` writes for stored path `p`.
  std::string field(const std::string& p, Form form) const {
    if (form == Form::absolute) return (corpus / p).string();
    if (form == Form::parent_relative) return (corpus.filename() / p).string();
    return p;
  }

  /// Writes trials [first, last) to `list` in `form`.
  void write_list(const fs::path& list, std::size_t first, std::size_t last, Form form) const {
    std::ofstream out(list);
    for (std::size_t i = first; i < last; ++i)
      out << (trials[i].target ? 1 : 0) << ' ' << field(paths[static_cast<std::size_t>(trials[i].enroll)], form) << ' '
          << field(paths[static_cast<std::size_t>(trials[i].test)], form) << '\n';
  }

  trainer::EvalCommandOptions eval_options() const {
    trainer::EvalCommandOptions e;
    e.checkpoint = run / "checkpoints" / "best.pt";
    return e;
  }
};

ScoresRun& scores_run() {
  static ScoresRun r;
  return r;
}

nlohmann::json eval_run(const ScoresRun& s, const trainer::EvalCommandOptions& e, std::string* printed = nullptr) {
  trainer::DataOptions data;
  data.data = s.data;
  trainer::EvalOptions eval;
  trainer::RuntimeOptions runtime;
  runtime.threads = 1;
  std::ostringstream out, log;
  nlohmann::json report = trainer::run_eval(e, data, eval, runtime, out, log);
  if (printed) *printed = out.str();
  return report;
}

/// The lines of a scores file, each split into its 4 fields.
std::vector<std::vector<std::string>> score_lines(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  std::vector<std::vector<std::string>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string x; fields >> x;) f.push_back(x);
    out.push_back(f);
  }
  return out;
}

/// `embed`'s rows of `split` of the run's best.pt with `crops` crops, as read back from its HDF5 file.
std::pair<at::Tensor, std::vector<std::string>> embedded(const ScoresRun& s, const fs::path& out, int64_t crops) {
  trainer::EmbedOptions o;
  o.checkpoint = s.run / "checkpoints" / "best.pt";
  o.data = s.data;
  o.split = "test";
  o.out = out;
  o.threads = 1;
  o.embed_crops = crops;
  std::ostringstream printed, log;
  trainer::run_embed(o, printed, log);
  h5::File f = h5::open_file(o.out);
  const h5::Dataset ds = h5::open_dataset(f, "embedding");
  const std::vector<int64_t> dims = h5::dims(ds);
  REQUIRE(dims.size() == 2);
  std::vector<float> values(static_cast<std::size_t>(dims[0] * dims[1]));
  REQUIRE(H5Dread(ds.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  return {at::from_blob(values.data(), {dims[0], dims[1]}, at::kFloat).clone(), h5::read_strings(f, "path")};
}

std::shared_ptr<trainer::Classifier> scores_model(const fs::path& checkpoint) {
  const trainer::Checkpoint c = trainer::load_checkpoint(checkpoint);
  auto model = trainer::make_model_from_json(c.model_config, /*any_task=*/true);
  trainer::load_state_dict(*model, c.model, checkpoint.string());
  model->eval();
  return model;
}

}  // namespace

TEST_CASE("two trial lists in one eval embed the split once and score as two single-list evals", "[trainer][scores]") {
  const ScoresRun& s = scores_run();
  const fs::path folder = s.dir / "two_scores";
  const auto [rc, printed] = test::run_in_process(
      {"melforge-train", "eval", "--checkpoint", (s.run / "checkpoints" / "best.pt").string(), "--data",
       s.data.string(), "--trials", (s.dir / "a.txt").string(), "--trials", (s.dir / "b.txt").string(), "--scores",
       folder.string(), "--out", (s.dir / "two.json").string(), "--threads", "1", "--device", "cpu"});
  INFO(printed);
  REQUIRE(rc == 0);
  const nlohmann::json two = read_json(s.dir / "two.json");
  CHECK(two["trial_lists"] == nlohmann::json::array({(s.dir / "a.txt").string(), (s.dir / "b.txt").string()}));
  CHECK_THAT(printed, Catch::Contains("a.txt: EER ") && Catch::Contains("b.txt: EER "));
  for (const char* name : {"a.txt", "b.txt"}) {
    CAPTURE(name);
    trainer::EvalCommandOptions e = s.eval_options();
    e.verify.trials = {s.dir / name};
    const nlohmann::json one = eval_run(s, e);
    const nlohmann::json& listed = two["lists"][(s.dir / name).string()];
    CHECK(listed["EER"].get<double>() == Approx(one["EER"].get<double>()).margin(1e-12));
    CHECK(listed["minDCF_0.01"].get<double>() == Approx(one["minDCF_0.01"].get<double>()).margin(1e-12));
    CHECK(listed["targets"] == one["verification"]["targets"]);
    CHECK(two["forward_passes"] == one["forward_passes"]);
    CHECK(score_lines(folder / (std::string(name) + ".scores")).size() == 20);
  }
  CHECK(two["forward_passes"].get<int64_t>() == two["coverage"]["batches"].get<int64_t>());
  CHECK(two["EER"] == two["lists"][(s.dir / "a.txt").string()]["EER"]);

  SECTION("train's final evaluation scored both lists and wrote their scores") {
    const nlohmann::json report = read_json(s.run / "report.json");
    CHECK(report["test"]["lists"].size() == 2);
    CHECK(report["test"]["lists"][(s.dir / "b.txt").string()]["EER"].get<double>() ==
          Approx(two["lists"][(s.dir / "b.txt").string()]["EER"].get<double>()).margin(1e-9));
    CHECK(score_lines(s.run / "scores_test" / "a.txt.scores") == score_lines(folder / "a.txt.scores"));
    CHECK(score_lines(s.run / "scores_test" / "b.txt.scores") == score_lines(folder / "b.txt.scores"));
  }
}

TEST_CASE("the scores file holds each trial's cosine of embed's rows and the list's own path strings",
          "[trainer][scores]") {
  const ScoresRun& s = scores_run();
  const auto form = GENERATE(Form::stored, Form::absolute, Form::parent_relative);
  CAPTURE(static_cast<int>(form));
  s.write_list(s.dir / "c.txt", 0, s.trials.size(), form);
  const auto [emb, stored] = embedded(s, s.dir / "emb.h5", 0);
  REQUIRE(stored == s.paths);
  trainer::EvalCommandOptions e = s.eval_options();
  e.verify.trials = {s.dir / "c.txt"};
  if (form == Form::parent_relative) e.verify.trials_root = s.corpus.parent_path().string();
  e.scores = s.dir / "c.scores";
  const nlohmann::json report = eval_run(s, e);
  CHECK(report["scores"] == nlohmann::json::array({e.scores.string()}));
  const auto lines = score_lines(e.scores);
  REQUIRE(lines.size() == s.trials.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const verification::Trial& t = s.trials[i];
    const std::string& a = s.paths[static_cast<std::size_t>(t.enroll)];
    const std::string& b = s.paths[static_cast<std::size_t>(t.test)];
    REQUIRE(lines[i].size() == 4);
    CHECK(lines[i][1] == (t.target ? "1" : "0"));
    CHECK(lines[i][2] == s.field(a, form));
    CHECK(lines[i][3] == s.field(b, form));
    const double naive = (emb[t.enroll].to(at::kDouble) * emb[t.test].to(at::kDouble)).sum().item<double>();
    CHECK(std::stod(lines[i][0]) == Approx(naive).margin(1e-5));
  }
  if (form == Form::parent_relative) {
    e.verify.trials_root.clear();
    CHECK_THROWS_WITH(eval_run(s, e), Catch::Contains("c.txt:1: unknown path"));
  }
}

TEST_CASE("generated trials' scores name the stored paths", "[trainer][scores]") {
  const ScoresRun& s = scores_run();
  trainer::EvalCommandOptions e = s.eval_options();
  e.verify.trial_count = 40;
  e.scores = s.dir / "generated.scores";
  eval_run(s, e);
  const auto lines = score_lines(e.scores);
  REQUIRE(lines.size() == s.trials.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CHECK(lines[i][2] == s.paths[static_cast<std::size_t>(s.trials[i].enroll)]);
    CHECK(lines[i][3] == s.paths[static_cast<std::size_t>(s.trials[i].test)]);
  }
}

TEST_CASE("scores and trial lists that cannot work are refused naming the flag, the list and its line",
          "[trainer][scores]") {
  const ScoresRun& s = scores_run();
  trainer::EvalCommandOptions e = s.eval_options();
  e.verify.trials = {s.dir / "a.txt"};
  e.scores = s.dir / "missing" / "a.scores";
  CHECK_THROWS_AS(eval_run(s, e), InvalidArgument);
  CHECK_THROWS_WITH(eval_run(s, e), Catch::Contains("--scores") && Catch::Contains("does not exist"));
  fs::create_directories(s.dir / "other");
  fs::copy_file(s.dir / "a.txt", s.dir / "other" / "a.txt", fs::copy_options::overwrite_existing);
  e.verify.trials = {s.dir / "a.txt", s.dir / "other" / "a.txt"};
  e.scores = s.dir / "scores_dir";
  CHECK_THROWS_WITH(eval_run(s, e), Catch::Contains("share the file name"));
  e.verify.trials = {s.dir / "a.txt", s.dir / "a.txt"};
  CHECK_THROWS_WITH(eval_run(s, e), Catch::Contains("given twice"));
  e.scores.clear();

  const auto [text, message] = GENERATE(table<std::string, std::string>({
      {"1 {0} f1.wav\n", "bad.txt:1: ambiguous path 'f1.wav'"},
      {"1 {0} {1}\n0 {0} nowhere/f9.wav\n", "bad.txt:2: unknown path 'nowhere/f9.wav'"},
  }));
  std::string list = text;
  const std::vector<std::pair<std::string, std::string>> fill = {{"{0}", s.paths[0]}, {"{1}", s.paths[1]}};
  for (const auto& [key, value] : fill)
    for (std::size_t at; (at = list.find(key)) != std::string::npos;) list.replace(at, key.size(), value);
  CAPTURE(list);
  test::write_text(s.dir / "bad.txt", list);
  e.verify.trials = {s.dir / "bad.txt"};
  CHECK_THROWS_AS(eval_run(s, e), FormatError);
  CHECK_THROWS_WITH(eval_run(s, e), Catch::Contains(message));
}

TEST_CASE("embed-crops N embeds each file as the mean of N evenly spaced crops of the run's --crop-seconds",
          "[trainer][scores]") {
  const ScoresRun& s = scores_run();
  const int64_t n = GENERATE(1, 4);
  CAPTURE(n);
  const auto [emb, stored] = embedded(s, s.dir / "crops.h5", n);
  auto model = scores_model(s.run / "checkpoints" / "best.pt");
  const trainer::Split split = trainer::load_split(s.data / "test.h5", "test", trainer::StreamOptions{});
  const int64_t crop = static_cast<int64_t>(std::llround(0.5 * 8000 / 64.0));
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> rows;
  for (int64_t f = 0; f < split.files(); ++f) {
    const at::Tensor frames = split.read_clips(f, 1);
    const int64_t T = frames.size(0);
    REQUIRE(T > crop);
    at::Tensor sum;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t start = n == 1 ? 0 : i * (T - crop) / (n - 1);
      const at::Tensor x = frames.slice(0, start, start + crop).t().unsqueeze(0).contiguous();
      const at::Tensor e = model->forward(x).embedding.to(at::kDouble)[0];
      sum = sum.defined() ? sum + e : e;
    }
    rows.push_back(sum / sum.norm());
  }
  CHECK(at::allclose(emb.to(at::kDouble), at::stack(rows), 1e-5, 1e-5));

  SECTION("eval scores the same crop embeddings and says so") {
    trainer::EvalCommandOptions e = s.eval_options();
    e.verify.trials = {s.dir / "a.txt"};
    e.verify.embed_crops = n;
    e.scores = s.dir / "crops.scores";
    std::string printed;
    const nlohmann::json report = eval_run(s, e, &printed);
    CHECK(report["coverage"]["view"] == "embed-crops");
    CHECK(report["coverage"]["examples"].get<int64_t>() == n * split.files());
    CHECK(report["verification"]["embed_crops"] == n);
    CHECK_THAT(printed, Catch::Contains("mean of " + std::to_string(n) + " crops"));
    const auto lines = score_lines(e.scores);
    REQUIRE(lines.size() == 20);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const double naive = (rows[static_cast<std::size_t>(s.trials[i].enroll)] *
                            rows[static_cast<std::size_t>(s.trials[i].test)]).sum().item<double>();
      CHECK(std::stod(lines[i][0]) == Approx(naive).margin(1e-5));
    }
  }
}

TEST_CASE("crop_starts spaces crops from the clip's start to its end", "[trainer][scores]") {
  CHECK(trainer::crop_starts(100, 20, 5) == std::vector<int64_t>{0, 20, 40, 60, 80});
  CHECK(trainer::crop_starts(100, 20, 1) == std::vector<int64_t>{0});
  CHECK(trainer::crop_starts(101, 20, 3) == std::vector<int64_t>{0, 40, 81});
  CHECK(trainer::crop_starts(20, 20, 4) == std::vector<int64_t>{0});
  CHECK(trainer::crop_starts(5, 20, 4) == std::vector<int64_t>{0});
  CHECK_THROWS_AS(trainer::crop_starts(5, 20, 0), InvalidArgument);
}

TEST_CASE("the verify group reads an older configuration's single trial list and writes a list of lists",
          "[trainer][scores]") {
  CHECK(trainer::VerifyOptions::from_json({{"trials", "/x/t.txt"}}).trials == std::vector<fs::path>{"/x/t.txt"});
  CHECK(trainer::VerifyOptions::from_json({{"trials", ""}}).trials.empty());
  const trainer::VerifyOptions two = trainer::VerifyOptions::from_json(
      {{"trials", {"/x/a.txt", "/y/b.txt"}}, {"trials_root", "wav"}, {"embed_crops", 5}});
  CHECK(two.trials == std::vector<fs::path>{"/x/a.txt", "/y/b.txt"});
  CHECK(two.trials_root == "wav");
  CHECK(two.embed_crops == 5);
  CHECK(trainer::VerifyOptions::from_json(two.to_json()).to_json() == two.to_json());
  CHECK_THROWS_AS(trainer::VerifyOptions::from_json({{"trials", 3}}), FormatError);
  trainer::VerifyOptions bad;
  bad.embed_crops = -1;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("--embed-crops"));
  bad = {};
  bad.trials_root = "wav";
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("--trials-root"));
}

}  // namespace melforge_test_trainer_scores
