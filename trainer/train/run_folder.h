#pragma once
/// The run folder of `train` (RUN): finding it from --out or --resume, checking and clearing it, and the
/// metrics.jsonl lines it accumulates.
#include <cstdint>
#include <filesystem>
#include <string>

namespace melforge::trainer {

/// The checkpoint a --resume argument names: a file as given, or RUN/checkpoints/last.pt for a folder.
std::filesystem::path resume_checkpoint(const std::filesystem::path& resume);

/// The run folder of a checkpoint: RUN for RUN/checkpoints/X.pt, else the checkpoint's folder (absolute).
std::filesystem::path run_dir_of(const std::filesystem::path& checkpoint);

/// Checks a fresh run's folder: absent, empty, or any folder when `overwrite` (its run files are removed later by
/// clear_run_files). Throws InvalidArgument naming --out otherwise.
void check_run_dir(const std::filesystem::path& dir, bool overwrite);

/// Removes the files and folders a run writes into `dir` (config.json, metrics.jsonl, checkpoints/, report.json,
/// the confusion CSVs, timings.json, trace.json), and nothing else.
void clear_run_files(const std::filesystem::path& dir);

/// Appends `line` and a newline to `path`. Throws IoError when it cannot.
void append_line(const std::filesystem::path& path, const std::string& line);

/// Keeps the lines of metrics.jsonl whose epoch is at most `epochs` (a resumed run rewrites the rest), through
/// an atomic rewrite; nothing when the file does not exist.
void truncate_metrics(const std::filesystem::path& path, int64_t epochs);

}  // namespace melforge::trainer
