#pragma once
// Shared pieces of the reliability tests: a corpus that takes about a second to build, the CLI arguments for it,
// and byte comparison of outputs.
#include <fcntl.h>
#include "melforge_test_paths.h"
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "build_fixture.h"

namespace melforge::test {

/// Reads a whole file (empty when it does not exist).
inline std::string read_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// `classes` x `per_class` mono 16-bit WAVs at 16 kHz (resampled to 8 kHz by the build), 1.5 to 4.5 s long.
/// With per_class 120 a build with --threads 2 takes about a second on a 2-core machine.
inline int write_slow_corpus(const std::filesystem::path& root, int classes, int per_class) {
  int n = 0;
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i) {
      const int64_t frames = 24000 + (i * 7919 + c * 3331) % 48000;
      write_tone(root / ("c" + std::to_string(c)) / ("f" + std::to_string(i) + ".wav"), 200.0 + 150 * c + 3 * i,
                 frames, 16000);
      ++n;
    }
  }
  return n;
}

/// melforge-build arguments (argv[0] included) for an 8 kHz CPU build of `in` into `out` with small batches
/// (--threads 2 --max-ram 70M), followed by `extra`; a flag in `extra` replaces the default of the same name.
inline std::vector<std::string> build_args(const std::filesystem::path& in, const std::filesystem::path& out,
                                           const std::vector<std::string>& extra = {}) {
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"--input", in.string()}, {"--output", out.string()}, {"--sample-rate", "8000"}, {"--n-fft", "256"},
      {"--hop-length", "64"}, {"--n-mels", "32"}, {"--short-seconds", "0.25"},
      {"--device", "cpu"}, {"--threads", "2"}, {"--max-ram", "70M"}};
  std::vector<std::string> a = {MELFORGE_BUILD_EXE, "--quiet"};
  for (const auto& [flag, value] : defaults) {
    if (std::find(extra.begin(), extra.end(), flag) != extra.end()) continue;
    a.push_back(flag);
    a.push_back(value);
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

/// The four outputs of a complete build.
inline const std::vector<std::string> kOutputNames = {"train.h5", "val.h5", "test.h5", "build_report.json"};

/// True when process `pid` holds an exclusive flock on `lock`, read from /proc/locks (which does not touch the lock,
/// so it cannot make the build fail to take it).
inline bool holds_flock(pid_t pid, const std::filesystem::path& lock) {
  struct stat st {};
  if (::stat(lock.c_str(), &st) != 0) return false;
  std::ifstream locks("/proc/locks");
  std::string line;
  const std::string inode = ":" + std::to_string(st.st_ino) + " ";
  while (std::getline(locks, line)) {
    std::istringstream f(line);
    std::string n, kind, mode, rw, p, dev;
    f >> n >> kind >> mode >> rw >> p >> dev;
    if (kind == "FLOCK" && rw == "WRITE" && p == std::to_string(pid) && (dev + " ").find(inode) != std::string::npos)
      return true;
  }
  return false;
}

}  // namespace melforge::test
