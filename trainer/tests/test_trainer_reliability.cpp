// Interruptions, faults and resource bounds of melforge-train (issue 5), on the real binary run as a child process:
// SIGKILL during an epoch and inside checkpoint writes, SIGINT/SIGTERM, write errors during a checkpoint write,
// corrupt and foreign inputs; host memory over 10 epochs, thread counts and idle CPU.
// LibTorch (c10/util/logging_is_not_google_glog.h) defines CHECK too: include it first, so that Catch's wins.
#include <ATen/ops/equal.h>
#include "melforge_test_paths.h"

#include "catch_torch.h"

#include <malloc.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "cli.h"
#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "models/model.h"
#include "options.h"
#include "reliability/child_process.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"
#include "test_skip.h"

// This file's own names: the unity build compiles it with other test files (docs/ARCHITECTURE.md).
namespace melforge_test_trainer_reliability {

using namespace melforge;
using melforge::test::TempDir;
using melforge::test::run_in_process;
using melforge::test::with;
using melforge::test::read_lines;
using melforge::test::require_same_tensors;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

/// The melforge-train binary the build made (melforge_test_paths.h).
fs::path train_exe() { return MELFORGE_TRAIN_EXE; }

/// The tone dataset every test of this file trains on (3 classes x 4 files), built once.
struct Shared {
  TempDir dir;
  fs::path data;
  Shared() {
    if (!fs::exists(train_exe()))
      throw std::runtime_error(train_exe().string() + " does not exist: build the melforge-train target first");
    data = test::build_tone_dataset(dir.path(), 3, 4);
  }
};

Shared& shared() {
  static Shared s;
  return s;
}

/// `train` of a fresh run: the tiny configuration of trainer_fixture.h, `hidden` units, no early stop.
std::vector<std::string> train_args(const fs::path& data, const fs::path& out, int epochs, int hidden,
                                    int threads = 2) {
  return {train_exe().string(), "train", "--data", data.string(), "--out", out.string(), "--epochs",
          std::to_string(epochs), "--hidden", std::to_string(hidden), "--dropout", "0.2", "--seed", "42", "--lr",
          "3e-3", "--warmup", "0.1", "--batch-size", "16", "--prefetch", "2", "--patience", "0", "--threads",
          std::to_string(threads), "--log-level", "warn"};
}

std::vector<std::string> resume_args(const fs::path& run) {
  return {train_exe().string(), "train", "--resume", run.string(), "--threads", "2", "--log-level", "warn"};
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The epoch lines of a metrics.jsonl being written (its step lines and a partial last line left out).
int64_t count_lines(const fs::path& p) {
  std::ifstream f(p);
  int64_t n = 0;
  std::string line;
  while (std::getline(f, line)) n += line.find("\"type\":\"epoch\"") != std::string::npos;
  return n;
}

std::vector<std::string> temporary_files(const fs::path& run) {
  std::vector<std::string> out;
  if (!fs::exists(run / "checkpoints")) return out;
  for (const auto& e : fs::directory_iterator(run / "checkpoints"))
    if (e.path().extension() == ".tmp") out.push_back(e.path().filename().string());
  return out;
}

/// The invariants a run folder keeps whatever the moment of a kill: every checkpoint at a final path loads, and
/// best.pt is the best epoch last.pt knows of, or the next epoch's (written before last.pt; the resumed run redoes
/// that epoch and writes the same file).
void require_consistent_checkpoints(const fs::path& run) {
  const fs::path last = run / "checkpoints" / "last.pt", best = run / "checkpoints" / "best.pt";
  std::optional<trainer::Checkpoint> l, b;
  if (fs::exists(last)) REQUIRE_NOTHROW(l = trainer::load_checkpoint(last));
  if (fs::exists(best)) REQUIRE_NOTHROW(b = trainer::load_checkpoint(best));
  if (fs::exists(run / "config.json")) {
    std::ifstream f(run / "config.json");
    CHECK_NOTHROW(nlohmann::json::parse(f));
  }
  if (!l) return;
  REQUIRE(b.has_value());
  const int64_t best_epoch = l->state.at("best_epoch").get<int64_t>();
  INFO("last.pt: epoch " << l->epoch << ", best_epoch " << best_epoch << "; best.pt: epoch " << b->epoch);
  CHECK((b->epoch == best_epoch || b->epoch == l->epoch + 1));
}

/// A complete run folder equal to the reference run's: last.pt and best.pt bit for bit, the same losses per epoch.
void require_same_as(const fs::path& run, const fs::path& ref) {
  const auto la = trainer::load_checkpoint(ref / "checkpoints/last.pt");
  const auto lb = trainer::load_checkpoint(run / "checkpoints/last.pt");
  CHECK(la.epoch == lb.epoch);
  CHECK(la.step == lb.step);
  require_same_tensors(la.model, lb.model, "last.pt model");
  require_same_tensors(la.optimizer, lb.optimizer, "last.pt optimizer");
  const auto ba = trainer::load_checkpoint(ref / "checkpoints/best.pt");
  const auto bb = trainer::load_checkpoint(run / "checkpoints/best.pt");
  CHECK(ba.epoch == bb.epoch);
  require_same_tensors(ba.model, bb.model, "best.pt model");
  const auto ma = read_lines(ref / "metrics.jsonl"), mb = read_lines(run / "metrics.jsonl");
  REQUIRE(ma.size() == mb.size());
  for (std::size_t i = 0; i < ma.size(); ++i) {
    CHECK(ma[i]["type"] == mb[i]["type"]);
    CHECK(ma[i]["step"] == mb[i]["step"]);
    const char* loss = ma[i]["type"] == "step" ? "loss" : "train_loss";
    CHECK(ma[i][loss] == mb[i][loss]);
  }
  CHECK(fs::exists(run / "report.json"));
  CHECK(temporary_files(run).empty());
}

/// Continues a run after an interruption: `train --resume` when a checkpoint exists, else the run again with
/// --overwrite. Requires success.
void finish_run(const fs::path& run, const std::vector<std::string>& fresh) {
  const bool resumable = fs::exists(run / "checkpoints" / "last.pt");
  const auto [code, output] = run_in_process(resumable ? resume_args(run) : with(fresh, {"--overwrite"}));
  INFO((resumable ? "resumed" : "rerun") << ": " << output);
  REQUIRE(code == 0);
}

/// The 3-epoch run every interruption is compared with (hidden 128: a 6 MB checkpoint takes a while to write),
/// run in-process, and how long it took (about the training phase of a child, after LibTorch's start-up).
struct KillReference {
  TempDir dir;
  fs::path run = dir / "ref";
  std::vector<std::string> args;
  double train_s = 0;
  KillReference() {
    args = train_args(shared().data, run, 3, 128);
    const auto start = Clock::now();
    const auto [code, output] = run_in_process(args);
    if (code != 0) throw std::runtime_error("reference run failed: " + output);
    train_s = std::chrono::duration<double>(Clock::now() - start).count();
  }
};

KillReference& kill_reference() {
  static KillReference ref;
  return ref;
}

/// Reads VmRSS of this process, bytes.
int64_t own_rss_bytes() { return test::proc_status_field(::getpid(), "VmRSS") * 1024; }

/// Flips (XOR 0xFF) `n` bytes of `file` from `offset`.
void flip_bytes(const fs::path& file, std::uintmax_t offset, int n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < n; ++i) {
    f.seekg(static_cast<std::streamoff>(offset) + i);
    const int c = f.get();
    f.seekp(static_cast<std::streamoff>(offset) + i);
    f.put(static_cast<char>(c ^ 0xFF));
  }
  REQUIRE(f.good());
}

/// File offset of the middle of the first stored chunk of `frames` in a split file.
std::uintmax_t first_frames_chunk_offset(const fs::path& file) {
  auto f = h5::open_file(file);
  auto ds = h5::open_dataset(f, "frames");
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  unsigned mask = 0;
  std::vector<hsize_t> offset(h5::dims(ds).size(), 0);
  REQUIRE(H5Dget_chunk_info_by_coord(ds.id(), offset.data(), &mask, &addr, &size) >= 0);
  REQUIRE(addr != HADDR_UNDEF);
  return static_cast<std::uintmax_t>(addr) + size / 2;
}

/// A copy of the shared dataset in `dir`.
fs::path copy_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* name : {"train.h5", "val.h5", "test.h5"}) fs::copy_file(shared().data / name, dir / name);
  return dir;
}

}  // namespace

TEST_CASE("melforge-train interrupted by SIGKILL, SIGINT or SIGTERM keeps loadable checkpoints and resumes to the "
          "uninterrupted result",
          "[trainer][reliability][faults]") {
  // One test case for both, so that ctest (one process per test case) runs the reference once.
  auto& ref = kill_reference();
  SECTION("SIGKILL during an epoch or inside a checkpoint write") {
    INFO("reference training phase: " << ref.train_s << " s");
    std::mt19937 rng(20261123);
    struct Plan {
      bool in_write;
      std::string target;   // in a write: the checkpoint whose temporary file triggers the kill
      int64_t after_lines;  // once metrics.jsonl has this many lines (epochs checkpointed or being checkpointed)
      double delay_s;       // not in a write: this long after that
    };
    const double epoch_s = ref.train_s / 3;
    std::uniform_int_distribution<int64_t> epoch(1, 3);
    std::uniform_int_distribution<int64_t> finished(0, 1);
    std::uniform_real_distribution<double> delay(0.0, 0.6 * epoch_s);
    const std::vector<Plan> plans = {{false, "", finished(rng), delay(rng)},
                                     {true, "best.pt", 1, 0},
                                     {true, "last.pt", epoch(rng), 0}};
    for (std::size_t round = 0; round < plans.size(); ++round) {
      const Plan& p = plans[round];
      const fs::path run = ref.dir / ("kill" + std::to_string(round));
      auto args = ref.args;
      std::replace(args.begin(), args.end(), ref.run.string(), run.string());
      CAPTURE(round, p.in_write, p.target, p.after_lines, p.delay_s);
      std::optional<Clock::time_point> t_lines;
      bool killed = false;
      test::ChildOptions opts;
      opts.on_poll = [&](pid_t pid) {
        if (killed || !fs::exists(run / "config.json") || count_lines(run / "metrics.jsonl") < p.after_lines) return;
        if (!t_lines) t_lines = Clock::now();
        const bool fire = p.in_write ? fs::exists(run / "checkpoints" / (p.target + ".tmp"))
                                     : std::chrono::duration<double>(Clock::now() - *t_lines).count() >= p.delay_s;
        if (fire) killed = ::kill(pid, SIGKILL) == 0;
      };
      const auto r = test::run_child(args, ref.dir / ("kill" + std::to_string(round) + ".log"), opts);
      INFO(r.output);
      REQUIRE(killed);
      REQUIRE(r.term_signal == SIGKILL);
      const std::vector<std::string> tmp = temporary_files(run);
      INFO("left behind: " << (tmp.empty() ? "no temporary file" : tmp.front()));
      if (p.in_write) CHECK(tmp == std::vector<std::string>{p.target + ".tmp"});
      CHECK_FALSE(fs::exists(run / "report.json"));
      require_consistent_checkpoints(run);
      finish_run(run, args);
      require_same_as(run, ref.run);
    }
  }
  SECTION("SIGINT and SIGTERM stop at a clean point with 130 / 143") {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int64_t> finished(0, 1);
    std::uniform_real_distribution<double> delay(0.0, 0.6 * ref.train_s / 3);
    for (const int sig : {SIGINT, SIGTERM}) {
      const int64_t after_lines = finished(rng);
      const double at = delay(rng);
      const fs::path run = ref.dir / ("sig" + std::to_string(sig));
      auto args = ref.args;
      std::replace(args.begin(), args.end(), ref.run.string(), run.string());
      CAPTURE(sig, after_lines, at);
      std::optional<Clock::time_point> t_lines, t_signal;
      test::ChildOptions opts;
      opts.on_poll = [&](pid_t pid) {
        if (t_signal || !fs::exists(run / "config.json") || count_lines(run / "metrics.jsonl") < after_lines) return;
        if (!t_lines) t_lines = Clock::now();
        if (std::chrono::duration<double>(Clock::now() - *t_lines).count() >= at && ::kill(pid, sig) == 0)
          t_signal = Clock::now();
      };
      const auto r = test::run_child(args, ref.dir / ("sig" + std::to_string(sig) + ".log"), opts);
      INFO(r.output);
      REQUIRE(t_signal.has_value());
      CHECK(r.term_signal == 0);
      CHECK(r.exit_code == 128 + sig);
      CHECK_THAT(r.output, Catch::Contains(std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM")));
      const bool mid_epoch = r.output.find("which is dropped") != std::string::npos;
      CHECK((mid_epoch || r.output.find("(checkpointed)") != std::string::npos));
      CHECK_FALSE(fs::exists(run / "report.json"));
      CHECK(temporary_files(run).empty());
      require_consistent_checkpoints(run);
      if (fs::exists(run / "checkpoints" / "last.pt"))
        CHECK_THAT(r.output, Catch::Contains("--resume " + run.string()));
      finish_run(run, args);
      require_same_as(run, ref.run);
    }
  }
}

TEST_CASE("a second stop signal makes melforge-train quit at once", "[trainer][reliability][faults]") {
  // Two signals are made pending together (the child is stopped meanwhile) so that the second arrives before the
  // first one's clean stop can finish; two SIGINTs would merge into one pending signal, hence SIGINT + SIGTERM.
  TempDir d;
  const fs::path run = d / "run";
  bool sent = false;
  test::ChildOptions opts;
  opts.on_poll = [&](pid_t pid) {
    if (sent || !fs::exists(run / "config.json")) return;
    sent = ::kill(pid, SIGSTOP) == 0 && ::kill(pid, SIGINT) == 0 && ::kill(pid, SIGTERM) == 0 &&
           ::kill(pid, SIGCONT) == 0;
  };
  const auto r = test::run_child(train_args(shared().data, run, 50, 24), d / "run.log", opts);
  INFO(r.output);
  REQUIRE(sent);
  CHECK(r.term_signal == 0);
  CHECK((r.exit_code == 130 || r.exit_code == 143));
  CHECK_THAT(r.output, Catch::Contains("second signal: quitting now"));
  CHECK_FALSE(fs::exists(run / "report.json"));
  require_consistent_checkpoints(run);
}

TEST_CASE("a write error during a checkpoint write: a clear error, nothing half-written, the previous checkpoint "
          "intact",
          "[trainer][reliability][faults]") {
  TempDir d;
  const fs::path data = shared().data;

  SECTION("RLIMIT_FSIZE below one checkpoint on a fresh run") {
    const fs::path run = d / "run";
    test::ChildOptions opts;
    opts.file_size_limit = 256 * 1024;
    const auto r = test::run_child(train_args(data, run, 3, 24), d / "run.log", opts);
    INFO(r.output);
    CHECK(r.term_signal == 0);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("cannot write '" + (run / "checkpoints").string()) &&
                             Catch::Contains("File too large"));
    CHECK_FALSE(fs::exists(run / "checkpoints" / "last.pt"));
    CHECK_FALSE(fs::exists(run / "checkpoints" / "best.pt"));
    CHECK(temporary_files(run).empty());
  }

  SECTION("RLIMIT_FSIZE on a resumed run: the previous checkpoints stay byte-identical") {
    const fs::path run = d / "run";
    {
      auto c = test::tiny_config(data, run, 4);
      c.train.patience = 0;
      trainer::TrainHooks stop_after_one;
      stop_after_one.on_epoch_end = [](int64_t) { return false; };
      std::ostringstream log;
      REQUIRE(trainer::train(c, log, stop_after_one).interrupted);
    }
    const std::string last = file_bytes(run / "checkpoints" / "last.pt");
    const std::string best = file_bytes(run / "checkpoints" / "best.pt");

    test::ChildOptions limited;
    limited.file_size_limit = 256 * 1024;
    const auto r = test::run_child(resume_args(run), d / "resume.log", limited);
    INFO(r.output);
    CHECK(r.term_signal == 0);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("cannot write '" + (run / "checkpoints").string()) &&
                             Catch::Contains("File too large"));
    CHECK(file_bytes(run / "checkpoints" / "last.pt") == last);
    CHECK(file_bytes(run / "checkpoints" / "best.pt") == best);
    CHECK(temporary_files(run).empty());
    CHECK_FALSE(fs::exists(run / "report.json"));
  }
}

TEST_CASE("a full disk (a tmpfs sized for two checkpoints) during a checkpoint write: a clear error, the previous "
          "checkpoint intact",
          "[trainer][reliability][faults]") {
  TempDir d;
  const fs::path data = shared().data;
  std::string last;
  {
    const fs::path sizing = d / "sizing";
    auto c = test::tiny_config(data, sizing, 1);
    std::ostringstream log;
    trainer::train(c, log);
    last = file_bytes(sizing / "checkpoints" / "last.pt");
  }
  const fs::path mnt = d / "mnt";
  fs::create_directories(mnt);
  const std::uintmax_t size = 2 * last.size() + last.size() / 2 + 64 * 1024;
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, ("size=" + std::to_string(size)).c_str()) != 0)
    MELFORGE_SKIP("cannot mount a tmpfs (" << std::strerror(errno) << "); needs root or CAP_SYS_ADMIN");
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const fs::path full = mnt / "run";
  const auto f = test::run_child(train_args(data, full, 3, 24), d / "full.log");
  INFO(f.output);
  CHECK(f.term_signal == 0);
  CHECK(f.exit_code == 1);
  CHECK_THAT(f.output, Catch::Contains("cannot write '" + (full / "checkpoints").string()) &&
                           Catch::Contains("No space left on device"));
  CHECK(temporary_files(full).empty());
  const auto kept = trainer::load_checkpoint(full / "checkpoints" / "last.pt");
  CHECK(kept.epoch == 1);
  require_consistent_checkpoints(full);
}

TEST_CASE("corrupt, truncated and foreign inputs given to melforge-train get a clear error naming the file",
          "[trainer][reliability][inputs]") {
  // Covered in-process already: a newer schema version, a file without schema_version, a non-HDF5 file, splits of
  // different builds, contradicting attributes (test_trainer_dataset.cpp); truncated, random and foreign checkpoint
  // files, state dicts of another shape (test_trainer_checkpoint.cpp); resume and eval on a dataset of other mel
  // parameters (test_trainer_train.cpp). Here: the same kinds of damage through the binary, which must exit with 1
  // and a message naming the file, never with a signal.
  TempDir d;
  const fs::path source = shared().data;
  const auto size = fs::file_size(source / "train.h5");
  const std::uintmax_t chunk = first_frames_chunk_offset(source / "train.h5");
  struct Case {
    std::string name;
    std::function<void(const fs::path& data)> damage;
    bool in_child = false;  // also run the binary (the exit path after an HDF5 error)
  };
  const auto truncate_to = [](std::uintmax_t n) {
    return [n](const fs::path& data) { fs::resize_file(data / "train.h5", n); };
  };
  const auto flip_at = [](std::uintmax_t offset, int n) {
    return [offset, n](const fs::path& data) { flip_bytes(data / "train.h5", offset, n); };
  };
  const std::vector<Case> cases = {
      {"train.h5 truncated inside the superblock", truncate_to(40)},
      {"train.h5 truncated to half", truncate_to(size / 2), true},
      {"train.h5 without its last byte", truncate_to(size - 1)},
      {"train.h5 with flipped bytes in the superblock", flip_at(24, 8)},
      {"train.h5 with flipped bytes inside the first frames chunk", flip_at(chunk, 16), true},
      {"train.h5 of schema version 4",
       [](const fs::path& data) {
         auto f = h5::open_file(data / "train.h5", true);
         h5::write_attribute_int64(f, "schema_version", 4);
       }},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    CAPTURE(c.name);
    const fs::path data = copy_dataset(d / ("data" + std::to_string(i)));
    c.damage(data);
    const fs::path out = d / ("run" + std::to_string(i));
    const auto args = train_args(data, out, 1, 24);
    const auto [code, output] = run_in_process(args);
    INFO(output);
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains((data / "train.h5").string()));
    CHECK_FALSE(fs::exists(out / "checkpoints" / "last.pt"));
    if (!c.in_child) continue;
    const auto r = test::run_child(with(args, {"--overwrite"}), d / "case.log");
    INFO("as a process: " << r.output);
    CHECK(r.term_signal == 0);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains((data / "train.h5").string()));
  }

  const fs::path run = d / "good";
  {
    const auto [code, output] = run_in_process(train_args(source, run, 1, 24));
    INFO(output);
    REQUIRE(code == 0);
  }
  const fs::path best = run / "checkpoints" / "best.pt";
  const std::vector<std::string> eval = {train_exe().string(), "eval", "--checkpoint", "", "--data", source.string(),
                                         "--log-level", "warn"};
  {
    INFO("a checkpoint of another model (its tensors are a CRNN's, its configuration a CNN's)");
    trainer::Checkpoint c = trainer::load_checkpoint(best);
    trainer::ModelOptions crnn;
    crnn.model = "crnn";
    const trainer::Dataset meta = trainer::load_dataset(source, /*load_frames=*/false);
    c.model = trainer::state_dict(*trainer::make_model(crnn, meta.info, meta.num_classes()));
    const fs::path other = d / "other-model.pt";
    trainer::save_checkpoint(c, other);
    auto args = eval;
    args[3] = other.string();
    const auto [code, output] = run_in_process(args);
    INFO(output);
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains(other.string()) && Catch::Contains("entry"));
  }
  {
    INFO("a checkpoint of other mel parameters");
    const fs::path other = test::build_tone_dataset(d.path(), 3, 2, "n_mels16",
                                                    [](builder::BuildConfig& b) { b.mel.n_mels = 16; });
    auto args = eval;
    args[3] = best.string();
    args[5] = other.string();
    const auto [code, output] = run_in_process(args);
    INFO(output);
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains("does not fit") && Catch::Contains("n_mels") && Catch::Contains(best.string()));
  }
  {
    INFO("a truncated last.pt given to --resume");
    const fs::path last = run / "checkpoints" / "last.pt";
    fs::resize_file(last, fs::file_size(last) / 2);
    const auto [code, output] = run_in_process(resume_args(run));
    INFO(output);
    CHECK(code == 1);
    CHECK_THAT(output, Catch::Contains(last.string()) && Catch::Contains("truncated or corrupt"));
  }
}

TEST_CASE("configure_allocator keeps large tensors off mmap, and leaves a user's own settings alone",
          "[trainer][reliability][resources]") {
  ::setenv("MELFORGE_MALLOC", "default", 1);
  CHECK_FALSE(trainer::configure_allocator());
  ::unsetenv("MELFORGE_MALLOC");
  ::setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
  CHECK_FALSE(trainer::configure_allocator());
  ::unsetenv("MALLOC_TRIM_THRESHOLD_");
  REQUIRE(trainer::configure_allocator());
  const std::size_t mapped_before = mallinfo2().hblkhd;
  for (const std::size_t mib : {1, 16, 64, 256}) {
    void* p = std::malloc(mib << 20);
    REQUIRE(p != nullptr);
    std::memset(p, 1, mib << 20);
    INFO(mib << " MiB block");
    CHECK(mallinfo2().hblkhd == mapped_before);
    std::free(p);
  }
}

TEST_CASE("host memory stays flat over 10 epochs, and idle threads do not spin", "[trainer][reliability][resources]") {
  INFO("with the allocator settings melforge-train's main applies");
  ::unsetenv("MELFORGE_MALLOC");
  trainer::configure_allocator();
  TempDir d;
  auto c = test::tiny_config(shared().data, d / "run", 10);
  c.model.hidden = 64;
  std::vector<int64_t> rss;
  double idle_cpu_s = -1;
  trainer::TrainHooks hooks;
  hooks.on_epoch_end = [&](int64_t epoch) {
    rss.push_back(own_rss_bytes());
    if (epoch == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const double before = test::own_cpu_seconds();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      idle_cpu_s = test::own_cpu_seconds() - before;
    }
    return true;
  };
  std::ostringstream log;
  trainer::train(c, log, hooks);
  REQUIRE(rss.size() == 10);
  {
    INFO("the measures see what they should: 32 MiB of new pages touched raise VmRSS, a spinning thread costs CPU "
         "time");
    const int64_t before = own_rss_bytes();
    constexpr std::size_t kBlock = 32 << 20;
    void* block = ::mmap(nullptr, kBlock, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(block != MAP_FAILED);
    std::memset(block, 1, kBlock);
    CHECK(own_rss_bytes() - before >= (24 << 20));
    ::munmap(block, kBlock);
    std::atomic<bool> stop{false};
    const double cpu0 = test::own_cpu_seconds();
    std::thread spin([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    stop = true;
    spin.join();
    CHECK(test::own_cpu_seconds() - cpu0 >= 0.03);
  }
  std::ostringstream table;
  for (std::size_t e = 0; e < rss.size(); ++e) table << "epoch " << e + 1 << ": " << rss[e] / 1024 << " KiB\n";
  INFO(table.str());
  const int64_t after_two = rss[1];
  const int64_t peak_later = *std::max_element(rss.begin() + 2, rss.end());
  constexpr int64_t kTolerance = 4 << 20;
  CHECK(peak_later - after_two <= kTolerance);
  INFO("CPU time of the whole process during 300 ms of idle at the end of epoch 4: " << idle_cpu_s << " s");
  CHECK(idle_cpu_s >= 0);
  CHECK(idle_cpu_s < 0.06);
}

TEST_CASE("melforge-train's thread count follows --threads", "[trainer][reliability][resources]") {
  // With --threads N: the main thread and its OpenMP team (N - 1), LibTorch's pthreadpool (N - 1, for XNNPACK and
  // NNPACK kernels; idle here), and during an epoch the loader's prefetch thread: 1 + 2 (N - 1) between epochs,
  // 2 + 2 (N - 1) during one. The upper bound, 2 + 3 (N - 1), still admits the OpenMP team of its own the prefetch
  // thread had while it gathered with ATen's index_select (it copies rows with memcpy now; docs/RELIABILITY.md).
  TempDir d;
  std::map<int, int> seen;
  for (const int threads : {1, 2}) {
    auto args = train_args(shared().data, d / ("run" + std::to_string(threads)), 1, 24, threads);
    *(std::find(args.begin(), args.end(), "--batch-size") + 1) = "4";
    const auto r = test::run_child(args, d / "run.log");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    seen[threads] = r.max_threads;
    CAPTURE(threads, r.max_threads);
    CHECK(r.max_threads >= 1 + 2 * (threads - 1));
    CHECK(r.max_threads <= 2 + 3 * (threads - 1));
  }
  INFO("threads seen: --threads 1: " << seen[1] << ", --threads 2: " << seen[2]);
  CHECK(seen[2] > seen[1]);
}

TEST_CASE("melforge-train caps --threads at 4 per core, with a one-line warning", "[trainer][reliability][resources]") {
  // --threads 10000 made 20,000 threads (5.4 GB); 16 per core shows the cap at a cost the test can pay before it.
  TempDir d;
  const int cores = std::max(1, omp_get_num_procs());
  const int requested = 16 * cores;
  const int cap = 4 * cores;
  auto args = train_args(shared().data, d / "run", 1, 24, requested);
  *(std::find(args.begin(), args.end(), "--batch-size") + 1) = "4";
  const auto r = test::run_child(args, d / "run.log");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CAPTURE(requested, cap, r.max_threads);
  CHECK(r.max_threads <= 2 + 3 * (cap - 1));
  CHECK_THAT(r.output, Catch::Contains("[melforge-train] warn: --threads " + std::to_string(requested) +
                                       " is more than 4 threads per core (" + std::to_string(cores) +
                                       " cores); using " + std::to_string(cap) + "\n"));
}

}  // namespace melforge_test_trainer_reliability
