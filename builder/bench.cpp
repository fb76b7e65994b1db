#include "bench.h"

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ostream>

#include "augment_stage.h"
#include "batch_runner.h"
#include "bench_report.h"
#include "build_state.h"
#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/timing.h"
#include "pipeline.h"
#include "plan.h"
#include "report.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

/// The bench's scratch folder: a fresh melforge-bench-XXXXXX under `parent`, removed with everything in it when the
/// object is destroyed (normal end, error or Interrupted).
class ScratchDir {
 public:
  explicit ScratchDir(const fs::path& parent) {
    std::string templ = (parent / "melforge-bench-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr)
      throw IoError("cannot create a scratch folder in '" + parent.string() + "': " + std::strerror(errno));
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Runs `fn(r)` `repeats` times and adds each run's wall time to `stage`, checking for a stop request before each.
template <class F>
void timed(RepeatTimes& times, const std::string& stage, int repeats, F&& fn) {
  for (int r = 0; r < repeats; ++r) {
    check_stop();
    const Stopwatch watch;
    fn(r);
    times.add(stage, r, watch.seconds());
  }
}

/// One field of a CSV row, always quoted (RFC 4180), as scan_manifest reads it.
std::string csv_field(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

/// The bench's selection, in place of select_shard: every entry the scan skipped (accept_scan), and `bench_files`
/// audio files spread evenly over the scan (index floor(i * total / n); all of them with 0), labelled
/// (label_files). A sample that is not the whole corpus gets absolute paths, is sorted by path (the order the scan of
/// its manifest gives) and is written to `scratch`/sample.csv for the end-to-end build; returns that path, else
/// an empty one. Sets the counts of `figures`.
fs::path select_sample(BuildState& state, int64_t bench_files, const fs::path& scratch, BenchFigures& figures) {
  ScanResult& scan = state.scan;
  const auto total = static_cast<int64_t>(scan.files.size());
  figures.audio_files = total;
  figures.scanned = state.scanned = total + static_cast<int64_t>(scan.skipped.size());
  state.skipped_range = {0, static_cast<int64_t>(scan.skipped.size())};
  accept_scan(state, state.skipped_range);
  const int64_t n = bench_files == 0 ? total : std::min(bench_files, total);
  figures.selected = n;
  figures.whole = n == total;
  std::vector<InputFile> sample;
  sample.reserve(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) sample.push_back(scan.files[static_cast<std::size_t>(i * total / n)]);
  scan.files = std::move(sample);
  state.files_range = {0, n};
  label_files(state);
  if (figures.whole) return {};
  for (auto& f : scan.files) f.path = fs::absolute(f.path);
  std::sort(scan.files.begin(), scan.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.path.string() < b.path.string(); });
  const fs::path manifest = scratch / "sample.csv";
  std::string csv = "path,label,split\n";
  for (const auto& f : scan.files)
    csv += csv_field(f.path.string()) + "," + csv_field(f.label) + "," +
           kSplitNames[static_cast<std::size_t>(f.split)] + "\n";
  write_file_atomically(manifest, csv);
  return manifest;
}

/// The figures of the planned sample that do not depend on a run: the rows the audio stages run on (files and their
/// augmented copies), their bytes on disk (read once per row) and in the arena, the chunk geometry, whether the
/// writes compress, and the audio stages' names.
void count_planned(const BuildState& state, BenchFigures& figures) {
  for (std::size_t split = 0; split < kSplitNames.size(); ++split)
    for (const PlannedCopy& row : split_copies(state, split)) {
      std::error_code ec;
      const auto bytes = static_cast<int64_t>(fs::file_size(row.file->input->path, ec));
      figures.decoded++;
      figures.augmented += row.recipe.copy > 0 ? 1 : 0;
      figures.input_bytes += ec ? 0 : bytes;
      figures.arena_bytes += row.plan.samples * static_cast<int64_t>(sizeof(float));
    }
  figures.frames_per_chunk = chunk_frames(state.frame_bytes(), state.config.build.frames_per_chunk);
  figures.chunk_bytes = figures.frames_per_chunk * state.frame_bytes();
  figures.compressed = state.config.build.compression_level > 0;
  for (const auto& stage : state.audio_stages) figures.audio_stages.push_back(stage->name());
}

/// Repeat `r` of the build's batch runner (run_batches, with the writes in line so that each stage is timed alone)
/// into `scratch`/write, removed after: the audio stages and mel are timed under their names, compress and write
/// are the compressing writers' own seconds, write_raw those of a second target without compression (only when the
/// build compresses). Returns the run's totals.
BatchTotals bench_batches(BuildState& state, const fs::path& scratch, int r, RepeatTimes& times) {
  check_stop();
  const int level = state.config.build.compression_level;
  const fs::path dir = scratch / "write";
  std::vector<WriteTarget> targets = {{dir / "compressed", level}};
  if (level > 0) targets.push_back({dir / "raw", 0});
  std::error_code ec;
  for (const auto& t : targets) {
    fs::create_directories(t.folder, ec);
    if (ec) throw IoError("cannot create '" + t.folder.string() + "': " + ec.message());
  }
  StageTimes run_times;
  BatchTotals run = run_batches(state, targets, {false, false}, run_times);
  for (const auto& s : run_times.order())
    if (s != "write_wait") times.add(s, r, run_times.get(s));
  if (level > 0 && run.writes[0].chunks > 0) times.add("compress", r, run.writes[0].compress_s);
  times.add("write", r, run.writes[0].write_s);
  if (level > 0) times.add("write_raw", r, run.writes[1].write_s);
  fs::remove_all(dir, ec);
  return run;
}

/// The configuration of the bench's end-to-end build: `config` with --overwrite and --quiet, writing under `parent`
/// (the folder of the scratch folder). Throws InvalidArgument, before any work, when `parent` is missing or `config`
/// is invalid.
BuildConfig end_to_end_config(const BuildConfig& config, const fs::path& parent) {
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    throw InvalidArgument("scratch folder '" + parent.string() + "' does not exist (set --scratch or $TMPDIR)");
  BuildConfig e2e = config;
  e2e.build.output = parent / "melforge-bench-XXXXXX" / "end_to_end";
  e2e.build.overwrite = true;
  e2e.build.quiet = true;
  e2e.validate();
  return e2e;
}

/// The repeats of the batch runner (bench_batches), the first one's totals and skipped files kept in `figures`.
void bench_batch_runs(BuildState& state, const fs::path& scratch, RepeatTimes& times, BenchFigures& figures) {
  for (int r = 0; r < times.repeats(); ++r) {
    BatchTotals run = bench_batches(state, scratch, r, times);
    if (r == 0) figures.run = std::move(run);
  }
  figures.skipped = state.skipped;
  figures.skipped.insert(figures.skipped.end(), figures.run.skipped.begin(), figures.run.skipped.end());
}

/// Stage "end_to_end": run_build of `e2e` (with `extra_stages`) into `output`, removed after each repeat, reading
/// `manifest` instead of --input when it is given (a sample smaller than the corpus). Returns the first report.
nlohmann::json bench_end_to_end(BuildConfig e2e, const fs::path& output, const fs::path& manifest,
                                const AudioStages& extra_stages, RepeatTimes& times) {
  e2e.build.output = output;
  if (!manifest.empty()) {
    e2e.build.input.clear();
    e2e.build.manifest = manifest;
  }
  nlohmann::json report;
  timed(times, "end_to_end", times.repeats(), [&](int r) {
    BuildResult result = run_build(e2e, extra_stages);
    if (r == 0) report = std::move(result.report);
    std::error_code ec;
    fs::remove_all(e2e.build.output, ec);
  });
  return report;
}

}  // namespace

void BenchOptions::validate() const {
  if (bench_files < 0) throw InvalidArgument("--bench-files must be >= 0 (0: every scanned file)");
  if (repeats < 1) throw InvalidArgument("--repeats must be >= 1");
  std::error_code ec;
  if (!scratch.empty() && !fs::is_directory(scratch, ec))
    throw InvalidArgument("--scratch: '" + scratch.string() + "' is not an existing folder");
  if (!bench_out.empty()) {
    if (fs::is_directory(bench_out, ec)) throw InvalidArgument("--bench-out: '" + bench_out.string() + "' is a folder");
    const fs::path parent = bench_out.parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
      throw InvalidArgument("--bench-out: folder '" + parent.string() + "' does not exist");
  }
}

void add_options(po::options_description& desc, BenchOptions& o) {
  desc.add_options()
    ("bench-files", po::value<int64_t>(&o.bench_files)->default_value(o.bench_files),
     "files benchmarked, spread evenly over the sorted scan (0: every file)")
    ("repeats", po::value<int>(&o.repeats)->default_value(o.repeats), "runs of each stage; the median is reported")
    ("bench-out", po::value<fs::path>(&o.bench_out), "also write the results as JSON to FILE")
    ("scratch", po::value<fs::path>(&o.scratch),
     "existing folder for the scratch HDF5 files and the end-to-end build (default $TMPDIR or /tmp); "
     "use the disk the dataset goes to");
}

fs::path scratch_parent(const BenchOptions& opts) {
  if (!opts.scratch.empty()) return opts.scratch;
  const char* tmp = std::getenv("TMPDIR");
  if (tmp != nullptr && *tmp != '\0') return tmp;
  return "/tmp";
}

nlohmann::json run_bench(const BuildConfig& config, const BenchOptions& opts, std::ostream& out, std::ostream& log,
                         const AudioStages& extra_stages) {
  opts.validate();
  const fs::path parent = scratch_parent(opts);
  const BuildConfig e2e = end_to_end_config(config, parent);
  const int R = opts.repeats;
  const auto note = [&](const std::string& text) {
    if (!config.build.quiet) log << "melforge-build bench: " << text << std::endl;
  };
  if (!config.build.output.empty()) note("--output is not used: the end-to-end build writes into the scratch folder");

  ScratchDir scratch(parent);
  RepeatTimes times(R);
  BuildState state(config, extra_stages);
  BenchFigures figures;
  note("scan");
  timed(times, "scan", R, [&](int) { scan_corpus(state); });
  const fs::path manifest = select_sample(state, opts.bench_files, scratch.path(), figures);
  if (state.augment) note("augmentation banks");
  init_augment(state);
  note("probe of " + std::to_string(figures.selected) + " files");
  timed(times, "probe", R, [&](int) { probe_files(state, false); });
  plan_clip_files(state);
  note("mel engine");
  timed(times, "engine_init", R, [&](int) { init_engine(state); });
  init_augment_device(state);
  if (const std::string line = engine_choice_message(config.build.device, state.engine_plan, state.engine->name());
      !line.empty())
    note(line);
  count_planned(state, figures);
  note("decode, mel" + std::string(figures.compressed ? ", compress" : "") + " and HDF5 write of " +
       std::to_string(figures.decoded) + " files, " + std::to_string(R) + " times");
  bench_batch_runs(state, scratch.path(), times, figures);
  note("end-to-end build of the same " + std::to_string(figures.selected) + " files");
  const nlohmann::json e2e_report =
      bench_end_to_end(e2e, scratch.path() / "end_to_end", figures.whole ? fs::path() : manifest, extra_stages, times);

  const StageRates rates = stage_rates(figures, times, e2e_report);
  const nlohmann::json result = bench_results(state, opts, parent, figures, times, rates, e2e_report);
  print_bench_table(out, result, times, rates, e2e_report);
  if (!opts.bench_out.empty()) {
    write_json_atomically(opts.bench_out, result);
    out << "results: " << opts.bench_out.string() << "\n";
  }
  return result;
}

}  // namespace melforge::builder
