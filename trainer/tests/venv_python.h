#pragma once
// The Python of tools/setup_torch.sh's environment, for tests that check files in Python's torch.
#include <sys/wait.h>
#include "melforge_test_paths.h"

#include <cstdio>
#include <filesystem>
#include <string>

namespace melforge::test {

/// The venv python of tools/setup_torch.sh (needs MELFORGE_SOURCE_DIR), or empty when it is not installed.
inline std::string venv_python() {
  const std::string cmd = "bash '" + std::string(MELFORGE_SOURCE_DIR) + "/tools/setup_torch.sh' --venv 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  const std::filesystem::path venv = out;
  if (out.empty() || !std::filesystem::exists(venv / ".melforge-complete") ||
      !std::filesystem::exists(venv / "bin/python"))
    return {};
  return (venv / "bin/python").string();
}

/// Runs `cmd` through the shell with stderr joined to stdout, appends its output to `output` and returns its exit
/// code (-1 when it could not run or did not exit normally).
inline int run_command(const std::string& cmd, std::string& output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) output += buf;
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace melforge::test
