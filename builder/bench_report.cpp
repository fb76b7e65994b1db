#include "bench_report.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "melforge/common/timing.h"
#include "report.h"

namespace melforge::builder {

namespace {

constexpr double kMB = 1e6;

/// Uncompressed bytes of the chunks the first run wrote (the last chunk of a split zero-padded).
int64_t mel_bytes(const BenchFigures& f) { return f.run.writes[0].chunks * f.chunk_bytes; }

/// Bytes of the chunks the first run wrote to the compressing target (raw chunks without compression).
int64_t compressed_bytes(const BenchFigures& f) { return f.run.writes[0].bytes; }

/// Median of `stage`, at least 1e-12 s (also when it was not timed), to divide by.
double median_or_tiny(const RepeatTimes& times, const std::string& stage) {
  return times.has(stage) ? std::max(times.median(stage), 1e-12) : 1e-12;
}

/// The stages whose medians add up to the sum compared with end to end, in order.
std::vector<std::string> summed_stages(const BenchFigures& f, const RepeatTimes& times) {
  std::vector<std::string> names;
  if (f.whole) names.push_back("scan");
  names.insert(names.end(), {"probe", "engine_init"});
  names.insert(names.end(), f.audio_stages.begin(), f.audio_stages.end());
  names.insert(names.end(), {"mel", "compress", "write"});
  std::vector<std::string> summed;
  for (const auto& s : names)
    if (times.has(s)) summed.push_back(s);
  return summed;
}

/// `v` printed with `decimals` decimals.
std::string num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

/// The `stages` object: per stage its seconds, median and per_s rates; compress also its ratio.
nlohmann::json stages_json(const BenchFigures& f, const RepeatTimes& times, const StageRates& rates) {
  nlohmann::json stages = nlohmann::json::object();
  for (const auto& s : times.order()) {
    nlohmann::json per_s = nlohmann::json::object();
    if (const auto it = rates.find(s); it != rates.end())
      for (const auto& rate : it->second) per_s[rate.key] = rate.value;
    stages[s] = {{"seconds", times.seconds(s)}, {"median_s", times.median(s)}, {"per_s", per_s}};
  }
  if (times.has("compress"))
    stages["compress"]["ratio"] =
        static_cast<double>(mel_bytes(f)) / static_cast<double>(std::max<int64_t>(compressed_bytes(f), 1));
  return stages;
}

}  // namespace

void RepeatTimes::add(const std::string& stage, int repeat, double seconds) {
  auto [it, fresh] = seconds_.try_emplace(stage, std::vector<double>(static_cast<std::size_t>(repeats_), 0.0));
  if (fresh) order_.push_back(stage);
  it->second[static_cast<std::size_t>(repeat)] += seconds;
}

double RepeatTimes::median(const std::string& stage) const {
  std::vector<double> v = seconds_.at(stage);
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

StageRates stage_rates(const BenchFigures& f, const RepeatTimes& times, const nlohmann::json& e2e_report) {
  const auto median = [&](const std::string& s) { return median_or_tiny(times, s); };
  const BuildStats& st = f.run.stats;
  StageRates rates;
  rates["scan"] = {{static_cast<double>(f.scanned) / median("scan"), "entries/s", "entries"}};
  rates["probe"] = {{static_cast<double>(f.selected) / median("probe"), "files/s", "files"}};
  rates["engine_init"] = {};
  for (const auto& s : f.audio_stages) rates[s] = {{static_cast<double>(f.decoded) / median(s), "files/s", "files"}};
  if (times.has("augment"))
    rates["augment"] = {{static_cast<double>(f.augmented) / median("augment"), "copies/s", "copies"},
                        {static_cast<double>(f.decoded) / median("augment"), "rows/s", "rows"}};
  rates["decode"] = {{static_cast<double>(f.decoded) / median("decode"), "files/s", "files"},
                     {st.audio_seconds / median("decode"), "audio s/s", "audio_seconds"},
                     {static_cast<double>(f.input_bytes) / kMB / median("decode"), "MB/s of input files", "mb_input"}};
  rates["mel"] = {{static_cast<double>(st.frames) / median("mel"), "frames/s", "frames"},
                  {st.audio_seconds / median("mel"), "audio s/s", "audio_seconds"}};
  if (f.compressed)
    rates["compress"] = {{static_cast<double>(mel_bytes(f)) / kMB / median("compress"), "MB/s in", "mb_in"},
                         {static_cast<double>(compressed_bytes(f)) / kMB / median("compress"), "MB/s out", "mb_out"}};
  rates["write"] = {{static_cast<double>(f.run.writes[0].bytes) / kMB / median("write"),
                     f.compressed ? "MB/s (compressed chunks)" : "MB/s (raw chunks)", "mb"}};
  if (f.compressed)
    rates["write_raw"] = {{static_cast<double>(f.run.writes[1].bytes) / kMB / median("write_raw"),
                           "MB/s (uncompressed, no filters)", "mb"}};
  const double e2e_s = median("end_to_end");
  rates["end_to_end"] = {
      {static_cast<double>(e2e_report["files"]["written"].get<int64_t>()) / e2e_s, "files/s", "files"},
      {static_cast<double>(e2e_report["clips"]["frames"].get<int64_t>()) / e2e_s, "frames/s", "frames"}};
  return rates;
}

nlohmann::json bench_results(const BuildState& state, const BenchOptions& opts, const std::filesystem::path& parent,
                             const BenchFigures& f, const RepeatTimes& times, const StageRates& rates,
                             const nlohmann::json& e2e_report) {
  using nlohmann::json;
  const BuildOptions& bo = state.config.build;
  const BuildStats& st = f.run.stats;
  const std::vector<std::string> summed = summed_stages(f, times);
  double sum_s = 0;
  for (const auto& s : summed) sum_s += times.median(s);
  json skipped = json::array();
  for (const auto& s : f.skipped) skipped.push_back({{"path", s.path}, {"reason", s.reason}, {"stage", s.stage}});
  json cfg = e2e_report["config"];
  cfg["input"] = bo.input.string();
  cfg["manifest"] = bo.manifest.string();
  cfg.erase("output");
  return {
      {"melforge_version", MELFORGE_VERSION},
      {"engine", state.engine->name()},
      {"engine_choice", engine_choice_json(bo.device, state.engine_plan, state.engine->name())},
      {"config", cfg},
      {"bench",
       {{"bench_files", opts.bench_files},
        {"repeats", opts.repeats},
        {"scratch", parent.string()},
        {"whole_corpus", f.whole}}},
      {"machine", {{"threads", state.threads}, {"cores", omp_get_num_procs()}, {"max_ram_bytes", bo.max_ram_bytes()}}},
      {"files",
       {{"scanned", f.scanned},
        {"audio_files", f.audio_files},
        {"selected", f.selected},
        {"decoded", f.decoded},
        {"written", st.files},
        {"skipped", static_cast<int64_t>(f.skipped.size())}}},
      {"skipped", skipped},
      {"frames", st.frames},
      {"audio_seconds", st.audio_seconds},
      {"batches", st.batches},
      {"bytes",
       {{"input_files", f.input_bytes},
        {"arena", f.arena_bytes},
        {"frames", mel_bytes(f)},
        {"compressed", compressed_bytes(f)},
        {"written", f.run.writes[0].bytes},
        {"written_raw", f.compressed ? f.run.writes[1].bytes : int64_t{0}}}},
      {"chunks",
       {{"frames_per_chunk", f.frames_per_chunk}, {"chunk_bytes", f.chunk_bytes}, {"count", f.run.writes[0].chunks}}},
      {"stages", stages_json(f, times, rates)},
      {"sum_of_stages_s", sum_s},
      {"sum_includes", summed},
      {"overlap", sum_s / median_or_tiny(times, "end_to_end")},
      {"checks",
       {{"written_equal_build", e2e_report["files"]["written"].get<int64_t>() == st.files},
        {"frames_equal_build", e2e_report["clips"]["frames"].get<int64_t>() == st.frames},
        {"compressed_bytes_equal_build", e2e_report["frame_bytes_compressed"].get<int64_t>() == compressed_bytes(f)}}},
      {"peak_rss_bytes", peak_rss_bytes()},
  };
}

void print_bench_table(std::ostream& out, const nlohmann::json& r, const RepeatTimes& times, const StageRates& rates,
                       const nlohmann::json& e2e_report) {
  const int repeats = r["bench"]["repeats"].get<int>();
  const auto& files = r["files"];
  char line[256];
  out << "\nmelforge-build bench: " << r["engine"].get<std::string>() << " engine, " << r["machine"]["threads"]
      << " threads, " << files["selected"] << " of " << files["audio_files"] << " audio files (" << files["scanned"]
      << " entries scanned), median of " << repeats << " run" << (repeats == 1 ? "" : "s") << "\n";
  out << "  " << files["written"] << " files written, " << files["skipped"] << " skipped, " << r["frames"]
      << " frames, " << num(r["audio_seconds"].get<double>(), 1) << " s of audio, " << r["chunks"]["count"]
      << " HDF5 chunks of " << r["chunks"]["frames_per_chunk"] << " frames\n";
  for (const auto& s : r["skipped"])
    out << "  skipped " << s["path"].get<std::string>() << ": " << s["reason"].get<std::string>() << "\n";
  std::snprintf(line, sizeof line, "\n%-13s %10s %14s  %s\n", "stage", "median s", "throughput", "unit");
  out << line;
  for (const auto& s : times.order()) {
    const auto it = rates.find(s);
    const std::vector<Rate> rs = it == rates.end() ? std::vector<Rate>{} : it->second;
    std::snprintf(line, sizeof line, "%-13s %10.4f %14s  %s\n", s.c_str(), times.median(s),
                  rs.empty() ? "" : num(rs[0].value, 1).c_str(), rs.empty() ? "" : rs[0].unit.c_str());
    out << line;
    for (std::size_t i = 1; i < rs.size(); ++i) {
      std::snprintf(line, sizeof line, "%-13s %10s %14s  %s\n", "", "", num(rs[i].value, 1).c_str(),
                    rs[i].unit.c_str());
      out << line;
    }
    if (s == "compress") {
      std::snprintf(line, sizeof line, "%-13s %10s %14s  %s\n", "", "",
                    num(r["stages"]["compress"]["ratio"].get<double>(), 2).c_str(), "ratio (in/out)");
      out << line;
    }
  }
  std::string joined;
  for (const auto& s : r["sum_includes"]) joined += (joined.empty() ? "" : "+") + s.get<std::string>();
  const double sum_s = r["sum_of_stages_s"].get<double>();
  std::snprintf(line, sizeof line, "\nsum of stages %10.4f s (%s)\n", sum_s, joined.c_str());
  out << line;
  std::snprintf(line, sizeof line,
                "end to end    %10.4f s; sum / end to end = %.2f (above 1: the pipeline overlaps the stages)\n",
                median_or_tiny(times, "end_to_end"), r["overlap"].get<double>());
  out << line;
  const auto& checks = r["checks"];
  if (!checks["written_equal_build"].get<bool>() || !checks["frames_equal_build"].get<bool>() ||
      !checks["compressed_bytes_equal_build"].get<bool>())
    out << "note: the end-to-end build differs from the stages (files " << e2e_report["files"]["written"] << " vs "
        << files["written"] << ", frames " << e2e_report["clips"]["frames"] << " vs " << r["frames"]
        << ", compressed bytes " << e2e_report["frame_bytes_compressed"] << " vs " << r["bytes"]["compressed"] << ")\n";
  out.flush();
}

}  // namespace melforge::builder
