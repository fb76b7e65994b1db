// Interruptions and faults of melforge-build (issue 5): SIGINT, SIGTERM and SIGKILL at seeded random points, a
// second build into a folder in use, stale locks, and write errors (RLIMIT_FSIZE, a full tmpfs).
#include <catch2/catch.hpp>

#include <sys/file.h>
#include <sys/mount.h>

#include <map>
#include <random>
#include <string>

#include "build_options.h"
#include "output_folder.h"
#include "reliability/child_process.h"
#include "reliability/corpus.h"
#include "test_skip.h"
#include "test_util.h"

namespace melforge_test_reliability_faults {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A corpus that takes about a second to build, and an uninterrupted reference build of it.
struct Reference {
  TempDir dir;
  fs::path in = dir / "in";
  fs::path out = dir / "ref";
  double wall_s = 0;
  Reference() {
    test::write_slow_corpus(in, 3, 120);
    const auto r = test::run_child(test::build_args(in, out), dir / "ref.log");
    if (r.exit_code != 0) throw std::runtime_error("reference build failed: " + r.output);
    wall_s = r.wall_s;
  }
};

Reference& reference() {
  static Reference ref;
  return ref;
}

/// Checks that `out` holds a complete build whose four outputs are byte-identical to the reference's.
void require_same_as_reference(const fs::path& out) {
  for (const auto& name : test::kOutputNames) {
    if (name == "build_report.json") {
      REQUIRE(fs::exists(out / name));
      continue;
    }
    CAPTURE(out / name);
    REQUIRE(test::read_file_bytes(out / name) == test::read_file_bytes(reference().out / name));
  }
  CHECK_FALSE(fs::exists(out / builder::kStagingName));
  CHECK_FALSE(fs::exists(out / builder::kLockFileName));
}

std::string signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGKILL"; }

}  // namespace

TEST_CASE("a build killed at random points never leaves outputs that look complete, and a rerun is identical",
          "[reliability][faults]") {
  auto& ref = reference();
  INFO("reference build: " << ref.wall_s << " s");
  std::mt19937 rng(20240517);
  std::uniform_real_distribution<double> when(0.02, 0.7);
  const int signals[] = {SIGINT, SIGTERM, SIGKILL, SIGINT, SIGTERM, SIGKILL, SIGKILL};
  int interrupted = 0;
  int stale_locks = 0;
  for (std::size_t round = 0; round < std::size(signals); ++round) {
    const int sig = signals[round];
    const double at = when(rng) * ref.wall_s;
    const fs::path out = ref.dir / ("kill" + std::to_string(round));
    CAPTURE(round, signal_name(sig), at);
    bool report_before_outputs = false;
    test::ChildOptions opts;
    opts.signal = sig;
    opts.signal_after = std::chrono::duration<double>(at);
    opts.on_poll = [&](pid_t) {
      if (fs::exists(out / "build_report.json"))
        for (const char* h5 : {"train.h5", "val.h5", "test.h5"})
          if (!fs::exists(out / h5)) report_before_outputs = true;
    };
    const auto r = test::run_child(test::build_args(ref.in, out), ref.dir / "kill.log", opts);
    INFO(r.output);
    CHECK_FALSE(report_before_outputs);
    if (r.exit_code == 0) {
      WARN("round " << round << ": the build finished before " << signal_name(sig) << " at " << at << " s");
      require_same_as_reference(out);
      continue;
    }
    ++interrupted;
    CHECK_FALSE(fs::exists(out / "build_report.json"));
    if (sig == SIGKILL) {
      CHECK(r.term_signal == SIGKILL);
      for (const char* h5 : {"train.h5", "val.h5", "test.h5"}) {
        if (fs::exists(out / h5))
          CHECK(test::read_file_bytes(out / h5) == test::read_file_bytes(ref.out / h5));
      }
      if (fs::exists(out / builder::kLockFileName)) ++stale_locks;
    } else {
      CHECK(r.exit_code == 128 + sig);
      CHECK_THAT(r.output, Catch::Contains("interrupted by " + signal_name(sig)));
      CHECK_THAT(r.output, Catch::Contains("temporary files were removed"));
      CHECK_FALSE(fs::exists(out));
    }
    const auto rerun = test::run_child(test::build_args(ref.in, out, {"--overwrite"}), ref.dir / "rerun.log");
    INFO(rerun.output);
    REQUIRE(rerun.exit_code == 0);
    require_same_as_reference(out);
  }
  CHECK(interrupted >= 5);
  CHECK(stale_locks >= 1);
}

TEST_CASE("a second stop signal exits at once, leaves .partial/ and the lock as they were, and the next build "
          "clears them",
          "[reliability][faults]") {
  // The child is held with SIGSTOP while train.h5 is being written (its .partial file exists), SIGINT and SIGTERM are
  // made pending together (two SIGINTs would merge into one pending signal) and the staging folder and lock are
  // recorded; after SIGCONT the signal thread takes SIGINT (the lower number) first, asks the build to stop, and
  // then takes SIGTERM at once, before the build reaches its next file: the second-signal path runs every time.
  auto& ref = reference();
  const fs::path out = ref.dir / "twice";
  const fs::path staging = out / builder::kStagingName;
  const fs::path lock = out / builder::kLockFileName;
  const auto listing = [&staging] {
    std::map<std::string, uintmax_t> sizes;
    for (const auto& e : fs::directory_iterator(staging)) sizes[e.path().filename().string()] = e.file_size();
    return sizes;
  };
  bool sent = false;
  bool stopped = false;
  std::map<std::string, uintmax_t> staged_at_stop;
  std::string lock_at_stop;
  test::ChildOptions opts;
  opts.on_poll = [&](pid_t pid) {
    if (sent || !fs::exists(staging / "train.h5.partial")) return;
    stopped = ::kill(pid, SIGSTOP) == 0 && test::wait_until_stopped(pid, std::chrono::seconds(10));
    if (stopped) {
      staged_at_stop = listing();
      lock_at_stop = test::read_file_bytes(lock);
    }
    sent = ::kill(pid, SIGINT) == 0 && ::kill(pid, SIGTERM) == 0;
    ::kill(pid, SIGCONT);
  };
  const auto r = test::run_child(test::build_args(ref.in, out), ref.dir / "twice.log", opts);
  INFO(r.output);
  REQUIRE(stopped);
  REQUIRE(sent);
  CHECK(r.term_signal == 0);
  CHECK(r.exit_code == 128 + SIGTERM);
  const auto first = r.output.find("SIGINT received: stopping");
  const auto again = r.output.find("SIGTERM received again: exiting now");
  CHECK(first != std::string::npos);
  CHECK(again != std::string::npos);
  CHECK(first < again);
  CHECK_THAT(r.output, !Catch::Contains("temporary files were removed"));

  for (const auto& name : test::kOutputNames) CHECK_FALSE(fs::exists(out / name));
  REQUIRE(fs::is_directory(staging));
  const auto staged_after = listing();
  CAPTURE(staged_at_stop.size(), staged_after.size());
  CHECK(staged_at_stop.count("train.h5.partial") == 1);
  REQUIRE(staged_after.size() == staged_at_stop.size());
  for (const auto& [name, size] : staged_at_stop) {
    CAPTURE(name, size);
    REQUIRE(staged_after.count(name) == 1);
    CHECK(staged_after.at(name) >= size);
  }
  REQUIRE(fs::exists(lock));
  CHECK(test::read_file_bytes(lock) == lock_at_stop);

  const auto next = test::run_child(test::build_args(ref.in, out), ref.dir / "twice2.log");
  INFO(next.output);
  REQUIRE(next.exit_code == 0);
  require_same_as_reference(out);
}

TEST_CASE("a second build into a folder in use is refused, and a stale lock does not block", "[reliability][faults]") {
  auto& ref = reference();
  static int section_run = 0;
  const fs::path out = ref.dir / ("locked" + std::to_string(section_run++));
  const fs::path lock = out / builder::kLockFileName;

  SECTION("while another melforge-build runs") {
    int refused = 0;
    std::string second_output;
    test::ChildOptions opts;
    opts.on_poll = [&](pid_t pid) {
      if (refused > 0 || !test::holds_flock(pid, lock)) return;
      for (const bool overwrite : {true, false}) {
        const auto r = test::run_child(test::build_args(ref.in, out, overwrite ? std::vector<std::string>{"--overwrite"}
                                                                               : std::vector<std::string>{}),
                                       ref.dir / "second.log");
        second_output += r.output;
        if (r.exit_code == 1 && r.output.find("is in use by another melforge-build (pid " + std::to_string(pid) +
                                              ")") != std::string::npos)
          ++refused;
      }
    };
    const auto first = test::run_child(test::build_args(ref.in, out), ref.dir / "first.log", opts);
    INFO(first.output << "\nsecond build:\n" << second_output);
    CHECK(refused == 2);
    REQUIRE(first.exit_code == 0);
    require_same_as_reference(out);
  }

  SECTION("a lock held by another process, then released") {
    fs::create_directories(out);
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    REQUIRE(::write(fd, "4242\n", 5) == 5);
    const auto refused = test::run_child(test::build_args(ref.in, out), ref.dir / "held.log");
    ::close(fd);
    INFO(refused.output);
    CHECK(refused.exit_code == 1);
    CHECK_THAT(refused.output, Catch::Contains("in use by another melforge-build (pid 4242)"));
    CHECK(fs::exists(out));
    CHECK_FALSE(fs::exists(out / "train.h5"));
    const auto ok = test::run_child(test::build_args(ref.in, out), ref.dir / "after.log");
    INFO(ok.output);
    REQUIRE(ok.exit_code == 0);
    require_same_as_reference(out);
  }

  SECTION("a stale lock file and staging folder from a killed build") {
    fs::create_directories(out / builder::kStagingName);
    test::write_text(lock, "999999\n");
    test::write_text(out / builder::kStagingName / "train.h5.partial", "half a file");
    const auto ok = test::run_child(test::build_args(ref.in, out), ref.dir / "stale.log");
    INFO(ok.output);
    REQUIRE(ok.exit_code == 0);
    require_same_as_reference(out);
  }
}

namespace {

/// A tmpfs of `bytes` mounted at `path` for the life of the object (mounted() is false when mount(2) is refused).
class SmallFs {
 public:
  SmallFs(const fs::path& path, int64_t bytes) : path_(path) {
    fs::create_directories(path_);
    const std::string opts = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~SmallFs() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  SmallFs(const SmallFs&) = delete;
  SmallFs& operator=(const SmallFs&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  fs::path path_;
  bool mounted_ = false;
  std::string error_;
};

/// Checks the outcome of a build that failed to write: exit 1, an error naming an HDF5 file and the cause, and no
/// output at any final path (nor staging, nor lock).
void check_write_failure(const test::ChildResult& r, const fs::path& out, const std::string& cause) {
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.term_signal == 0);
  CHECK_THAT(r.output, Catch::Contains("melforge-build: error:"));
  CHECK_THAT(r.output, Catch::Contains(".h5"));
  CHECK_THAT(r.output, Catch::Contains(cause));
  for (const auto& name : test::kOutputNames) CHECK_FALSE(fs::exists(out / name));
  CHECK_FALSE(fs::exists(out / builder::kStagingName));
  CHECK_FALSE(fs::exists(out / builder::kLockFileName));
}

}  // namespace

TEST_CASE("a write error (RLIMIT_FSIZE) fails cleanly, naming the file, and keeps previous outputs", "[reliability][faults]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 12);
  const fs::path out = d / "out";

  SECTION("RLIMIT_FSIZE (ulimit -f) with SIGXFSZ ignored: EFBIG") {
    const rlim_t limit = GENERATE(rlim_t{4096}, rlim_t{40000});
    CAPTURE(limit);
    test::ChildOptions opts;
    opts.file_size_limit = limit;
    const auto r = test::run_child(test::build_args(d / "in", out), d / "fsize.log", opts);
    check_write_failure(r, out, "File too large");
    CHECK_FALSE(fs::exists(out));
  }

  SECTION("over a previous complete build with --overwrite: the old outputs stay") {
    REQUIRE(test::run_child(test::build_args(d / "in", out), d / "first.log").exit_code == 0);
    std::vector<std::string> before;
    for (const auto& name : test::kOutputNames) before.push_back(test::read_file_bytes(out / name));
    test::ChildOptions opts;
    opts.file_size_limit = 40000;
    const auto r = test::run_child(test::build_args(d / "in", out, {"--overwrite"}), d / "fsize.log", opts);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("File too large"));
    for (std::size_t i = 0; i < test::kOutputNames.size(); ++i)
      CHECK(test::read_file_bytes(out / test::kOutputNames[i]) == before[i]);
    CHECK_FALSE(fs::exists(out / builder::kStagingName));
    CHECK_FALSE(fs::exists(out / builder::kLockFileName));
  }
}

TEST_CASE("a full disk (a 64 KiB tmpfs) fails cleanly with ENOSPC, naming the file", "[reliability][faults]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 12);
  SmallFs small(d / "small", 64 * 1024);
  if (!small.mounted()) MELFORGE_SKIP("cannot mount a tmpfs here (" << small.error() << "); needs root or CAP_SYS_ADMIN");
  const fs::path sout = d / "small" / "out";
  const auto r = test::run_child(test::build_args(d / "in", sout), d / "enospc.log");
  check_write_failure(r, sout, "No space left on device");
  CHECK_FALSE(fs::exists(sout));
}

namespace {

/// Adds `count` files with .wav names of about 200 bytes that hold no audio to class c0 of `in`: each is skipped
/// with its path and reason, about 550 bytes of build_report.json each, which makes the report larger than any
/// split file of a small corpus.
void add_junk_files(const fs::path& in, int count) {
  for (int k = 0; k < count; ++k) test::write_text(in / "c0" / (std::string(200, 'j') + std::to_string(k) + ".wav"), "junk");
}

/// Every regular file under `folder` (relative path -> bytes); empty when the folder does not exist.
std::map<std::string, std::string> files_in(const fs::path& folder) {
  std::map<std::string, std::string> out;
  if (!fs::exists(folder)) return out;
  for (const auto& e : fs::recursive_directory_iterator(folder))
    if (e.is_regular_file()) out[fs::relative(e.path(), folder).string()] = test::read_file_bytes(e.path());
  return out;
}

}  // namespace

TEST_CASE("a build whose report cannot be written installs nothing, and a previous build stays byte for byte",
          "[reliability][faults]") {
  const bool overwrite = GENERATE(false, true);
  CAPTURE(overwrite);
  constexpr rlim_t kLimit = 256 * 1024;
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 12);
  const fs::path out = d / "out";
  const std::vector<std::string> one_second = {"--max-seconds", "1"};
  if (overwrite) REQUIRE(test::run_child(test::build_args(d / "in", out, one_second), d / "first.log").exit_code == 0);
  const auto before = files_in(out);
  CHECK(before.size() == (overwrite ? 4u : 0u));
  add_junk_files(d / "in", 800);
  std::vector<std::string> extra = one_second;
  if (overwrite) extra.push_back("--overwrite");
  test::ChildOptions opts;
  opts.file_size_limit = kLimit;
  const auto r = test::run_child(test::build_args(d / "in", out, extra), d / "report.log", opts);
  {
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("build_report.json") && Catch::Contains("File too large"));
  }
  CHECK(files_in(out) == before);
  CHECK(fs::exists(out) == overwrite);

  const auto ok = test::run_child(test::build_args(d / "in", out, {"--overwrite", "--max-seconds", "1"}), d / "ok.log");
  INFO(ok.output);
  REQUIRE(ok.exit_code == 0);
  CHECK(fs::file_size(out / builder::kReportName) > kLimit);
  for (const char* h5 : {"train.h5", "val.h5", "test.h5"}) CHECK(fs::file_size(out / h5) < kLimit * 3 / 4);
}

TEST_CASE("an install that fails half-way puts the previous build back", "[reliability][faults]") {
  TempDir d;
  test::write_tone_corpus(d / "in", 3, 12);
  const fs::path out = d / "out";
  REQUIRE(test::run_child(test::build_args(d / "in", out), d / "first.log").exit_code == 0);
  fs::remove(out / "val.h5");
  test::write_text(out / "val.h5" / "keep", "a folder in the way");
  const auto before = files_in(out);
  add_junk_files(d / "in", 3);
  const auto r = test::run_child(test::build_args(d / "in", out, {"--overwrite"}), d / "install.log");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("cannot install '" + (out / "val.h5").string() + "'") &&
                           Catch::Contains("the previous outputs were put back"));
  CHECK(files_in(out) == before);
  CHECK(before.count("train.h5") == 1);
  CHECK(before.count(builder::kReportName) == 1);
}

}  // namespace melforge_test_reliability_faults
