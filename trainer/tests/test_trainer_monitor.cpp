// Monitoring of a run (train/monitor.h): the step lines of metrics.jsonl every --log-every optimizer steps, one
// TensorBoard event file per start of the run, --no-tensorboard, --overwrite, and a resumed run that truncates the
// step lines of later steps and opens a new event file with a session start. TensorBoard's own reader checks the
// files in python/tests/test_tensorboard.py.
#include <ATen/core/Tensor.h>

#include "catch_torch.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <fstream>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/png.h"
#include "melforge/common/tensorboard.h"
#include "test_util.h"
#include "train/config.h"
#include "train/monitor.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_monitor {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

/// The event files of a run folder, in name order.
std::vector<fs::path> event_files(const fs::path& run) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// The data of the TFRecords of `file` (framing checked by length only; the CRCs are tests/test_tensorboard.cpp's).
std::vector<std::string> records(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  const std::string s{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at + 16 <= s.size()) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(s[at + static_cast<std::size_t>(i)]);
    REQUIRE(at + 16 + n <= s.size());
    out.push_back(s.substr(at + 12, n));
    at += 16 + n;
  }
  CHECK(at == s.size());
  return out;
}

std::vector<nlohmann::json> step_lines(const fs::path& run) {
  std::vector<nlohmann::json> out;
  for (auto& j : test::read_lines(run / "metrics.jsonl"))
    if (j.value("type", "") == "step") out.push_back(std::move(j));
  return out;
}

trainer::TrainConfig parse(const std::vector<std::string>& args) {
  trainer::TrainConfig c;
  po::options_description desc;
  trainer::add_options(desc, c);
  std::vector<const char*> argv{"train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  po::variables_map vm;
  po::store(po::parse_command_line(static_cast<int>(argv.size()), argv.data(), desc), vm);
  po::notify(vm);
  return c;
}

}  // namespace

TEST_CASE("the monitor flags --log-every and --no-tensorboard are read, and a negative --log-every is refused",
          "[trainer][monitor]") {
  const trainer::TrainConfig defaults = parse({});
  CHECK(defaults.monitor.log_every == 10);
  CHECK(defaults.monitor.tensorboard);
  const trainer::TrainConfig set = parse({"--log-every", "3", "--no-tensorboard"});
  CHECK(set.monitor.log_every == 3);
  CHECK_FALSE(set.monitor.tensorboard);
  trainer::MonitorOptions bad;
  bad.log_every = -1;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("--log-every"));
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
}

TEST_CASE("confusion_png draws one cell per class pair at a readable size", "[trainer][monitor]") {
  const auto n = GENERATE(1, 3, 12);
  std::vector<std::vector<int64_t>> confusion(static_cast<std::size_t>(n), std::vector<int64_t>(n, 1));
  int64_t h = 0, w = 0;
  const std::string png = trainer::confusion_png(confusion, h, w);
  CHECK(png.substr(1, 3) == "PNG");
  CHECK(w == n * (heat_map_cell(n) + 1) + 1);
  CHECK(h == w);
  CHECK(heat_map_cell(n) >= 33);
  confusion[0].pop_back();
  CHECK_THROWS_AS(trainer::confusion_png(confusion, h, w), InvalidArgument);
}

TEST_CASE("a run writes a step line every --log-every steps and one event file, and none with --no-tensorboard",
          "[trainer][monitor]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  auto c = test::tiny_config(data, d / "run", 2);
  c.monitor.log_every = 3;
  trainer::train(c, log);
  const auto epochs = test::epoch_lines(d / "run" / "metrics.jsonl");
  REQUIRE(epochs.size() == 2);
  const int64_t steps = epochs.back()["step"].get<int64_t>();
  const auto lines = step_lines(d / "run");
  REQUIRE(static_cast<int64_t>(lines.size()) == steps / 3);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    INFO(lines[i].dump());
    const int64_t step = lines[i]["step"].get<int64_t>();
    CHECK(step == 3 * static_cast<int64_t>(i + 1));
    CHECK(lines[i]["epoch"] == (step <= epochs[0]["step"].get<int64_t>() ? 1 : 2));
    CHECK(std::isfinite(lines[i]["loss"].get<double>()));
    CHECK(lines[i]["lr"].get<double>() > 0);
    CHECK(lines[i]["lr"].get<double>() <= c.optim.lr);
    CHECK(lines[i]["samples_per_s"].get<double>() > 0);
    CHECK(lines[i]["data_wait_fraction"].get<double>() >= 0);
  }
  const auto files = event_files(d / "run");
  REQUIRE(files.size() == 1);
  const auto recs = records(files[0]);
  const std::size_t per_epoch = epochs[0].size() - 2 + 1;  // the numbers but "step" and "type", and the image
  CHECK(recs.size() == 1 + 4 * lines.size() + 2 * per_epoch);

  c.train.overwrite = true;
  c.monitor.tensorboard = false;
  c.monitor.log_every = 0;
  trainer::train(c, log);
  CHECK(event_files(d / "run").empty());
  CHECK(step_lines(d / "run").empty());
  CHECK(test::epoch_lines(d / "run" / "metrics.jsonl").size() == 2);
}

TEST_CASE("a resumed run drops the step lines after its checkpoint and opens a new event file with a session start",
          "[trainer][monitor][resume]") {
  TempDir d;
  const fs::path data = test::build_tone_dataset(d.path(), 3, 3);
  std::ostringstream log;
  auto straight = test::tiny_config(data, d / "straight", 3);
  straight.monitor.log_every = 2;
  trainer::train(straight, log);

  auto first = straight;
  first.train.out = d / "pieces";
  trainer::TrainHooks stop_after_one;
  stop_after_one.on_epoch_end = [](int64_t) { return false; };
  trainer::train(first, log, stop_after_one);
  const int64_t checkpoint_step = test::epoch_lines(d / "pieces" / "metrics.jsonl").at(0)["step"].get<int64_t>();
  {
    std::ofstream m(d / "pieces" / "metrics.jsonl", std::ios::app);
    m << trainer::step_line(2, checkpoint_step + 1, 99.0, 1.0, 1.0, 0.0).dump() << "\n";
  }
  trainer::TrainConfig resume;
  resume.train.resume = d / "pieces";
  resume.runtime.threads = 2;
  resume.runtime.log_level = "warn";
  resume.monitor.log_every = 2;
  trainer::train(resume, log);

  const auto a = step_lines(d / "straight"), b = step_lines(d / "pieces");
  REQUIRE(a.size() == b.size());
  REQUIRE_FALSE(a.empty());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"epoch", "step", "loss", "lr"}) {
      INFO(i << " " << k);
      CHECK(a[i][k] == b[i][k]);
    }
  const auto files = event_files(d / "pieces");
  REQUIRE(files.size() == 2);
  const auto recs = records(files[1]);
  REQUIRE(recs.size() >= 2);
  CHECK(recs[1].substr(9) == tensorboard::session_start_event(0, checkpoint_step + 1).substr(9));
}

}  // namespace melforge_test_trainer_monitor
