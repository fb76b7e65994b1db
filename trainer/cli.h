#pragma once
/// melforge-train's command line: `melforge-train <command> [options]`. The binary's main only calls run_cli.
#include <ostream>

namespace melforge::trainer {

/// Exit code of a successful command.
inline constexpr int kExitOk = 0;
/// Exit code of a failed command (I/O, format, CUDA, ... errors).
inline constexpr int kExitError = 1;
/// Exit code of invalid arguments (unknown command or flag, bad value), reported before any work.
inline constexpr int kExitUsage = 2;
/// Exit code of `predict` when some inputs could not be scored: the others were scored and every row printed,
/// the failed ones with their error column.
inline constexpr int kExitSomeFailed = 3;

/// Runs melforge-train with `argc`/`argv` as main receives them: argv[1] is the command, the rest its options.
/// Results go to `out`, messages to `err`. Every error becomes a message and an exit code; nothing is thrown.
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace melforge::trainer
