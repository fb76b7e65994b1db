#pragma once
// Runs melforge-build as a child process for the reliability tests: with resource limits, another user or a signal
// sent at a chosen time, while sampling its threads and peak RSS from /proc.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace melforge::test {

/// How to start the child.
struct ChildOptions {
  /// RLIMIT_FSIZE in bytes (as `ulimit -f`); SIGXFSZ is ignored so that a write past it fails with EFBIG.
  std::optional<rlim_t> file_size_limit;
  /// Run as this uid and gid (as `setpriv --reuid --regid --clear-groups`).
  std::optional<uid_t> uid;
  /// RLIMIT_NOFILE (soft and hard) in file descriptors, as `ulimit -n`.
  std::optional<rlim_t> open_files_limit;
  /// Send `signal` this long after the start (nothing when `signal` is 0).
  std::chrono::duration<double> signal_after{0};
  /// Signal to send (SIGINT, SIGTERM, SIGKILL), 0 for none.
  int signal = 0;
  /// Called every few milliseconds while the child runs (e.g. to start a second build); may be empty.
  std::function<void(pid_t)> on_poll;
};

/// What happened to the child.
struct ChildResult {
  /// Exit status when it exited, else -1.
  int exit_code = -1;
  /// Signal that killed it, else 0.
  int term_signal = 0;
  /// stdout and stderr together.
  std::string output;
  /// Wall time from start to exit, seconds.
  double wall_s = 0;
  /// Largest VmHWM seen in /proc/<pid>/status while it ran, bytes (sampled every 2 ms; the final peak can only be
  /// missed if it was reached in the last 2 ms).
  int64_t peak_rss_bytes = 0;
  /// Largest `Threads:` count seen in /proc/<pid>/status.
  int max_threads = 0;
  /// User + system CPU time of the child, seconds (wait4 rusage; not affected by the parent's memory).
  double cpu_s = 0;
  /// The signal was sent while the child was still running.
  bool signalled = false;
};

/// Reads a `Key:   value` field of /proc/<pid>/status as an integer (-1 when absent).
inline int64_t proc_status_field(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") == 0) {
      std::istringstream v(line.substr(key.size() + 1));
      int64_t x = -1;
      v >> x;
      return x;
    }
  }
  return -1;
}

/// Waits until every thread of `pid` is stopped (state T or t in /proc/<pid>/task/*/stat), as after SIGSTOP, which
/// takes effect asynchronously. Returns false after `timeout` or when the process is gone.
inline bool wait_until_stopped(pid_t pid, std::chrono::duration<double> timeout) {
  const auto task_dir = std::filesystem::path("/proc") / std::to_string(pid) / "task";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(task_dir, ec)) {
      std::ifstream in(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto paren = stat.rfind(')');
      const char state = paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
      if (state != 'T' && state != 't') all = false;
    }
    if (ec) return false;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

/// User + system CPU time of this process (every thread), seconds.
inline double own_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/// In a forked child: sets RLIMIT_NOFILE and drops to opts.uid as `opts` says. Returns 0, or the exit code the child
/// should end with: 121 when it cannot switch user, 123 when it cannot set the limit.
inline int enter_child_identity(const ChildOptions& opts) {
  if (opts.uid) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(*opts.uid) != 0 || ::setuid(*opts.uid) != 0) return 121;
  }
  if (opts.open_files_limit) {
    const rlimit lim{*opts.open_files_limit, *opts.open_files_limit};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 123;
  }
  return 0;
}

/// Runs `fn` in a forked child of this test process, after enter_child_identity(opts) (uid and open-file limit; the
/// other fields are not used), and returns the text `fn` returned, or "exception: <what>" when it threw.
/// std::nullopt when the child could not switch user or set the limit. Throws std::runtime_error when the child
/// died or its answer could not be read.
inline std::optional<std::string> run_in_child(const std::function<std::string()>& fn, const ChildOptions& opts) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    if (const int code = enter_child_identity(opts); code != 0) ::_exit(code);
    std::string text;
    try {
      text = fn();
    } catch (const std::exception& e) {
      text = std::string("exception: ") + e.what();
    }
    const bool written = ::write(fds[1], text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::_exit(written ? 0 : 122);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    throw std::runtime_error("the test child did not exit normally");
  if (WEXITSTATUS(status) == 121 || WEXITSTATUS(status) == 123) return std::nullopt;
  if (WEXITSTATUS(status) != 0) throw std::runtime_error("the test child could not send its answer");
  return text;
}

/// Runs `argv` (argv[0] is the executable path) and waits for it. Output goes to `log_path` and is returned.
inline ChildResult run_child(const std::vector<std::string>& argv, const std::filesystem::path& log_path,
                             const ChildOptions& opts = {}) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    if (opts.file_size_limit) {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{*opts.file_size_limit, *opts.file_size_limit};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(120);
    }
    if (const int code = enter_child_identity(opts); code != 0) ::_exit(code);
    ::execv(args[0], args.data());
    ::_exit(122);
  }
  ChildResult r;
  int status = 0;
  rusage usage{};
  for (;;) {
    const pid_t done = ::wait4(pid, &status, WNOHANG, &usage);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) throw std::runtime_error(std::string("wait4: ") + std::strerror(errno));
    const int64_t hwm_kb = proc_status_field(pid, "VmHWM");
    if (hwm_kb > 0) r.peak_rss_bytes = std::max(r.peak_rss_bytes, hwm_kb * 1024);
    r.max_threads = std::max(r.max_threads, static_cast<int>(proc_status_field(pid, "Threads")));
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (opts.signal != 0 && !r.signalled && elapsed >= opts.signal_after) {
      r.signalled = ::kill(pid, opts.signal) == 0;
    }
    if (opts.on_poll) opts.on_poll(pid);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.cpu_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
            static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  std::ifstream log(log_path, std::ios::binary);
  r.output.assign(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>());
  return r;
}

}  // namespace melforge::test
