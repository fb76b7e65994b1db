#include "bench.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <ostream>

#include "featurize/featurize.h"
#include "h5_writer.h"
#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/h5.h"
#include "melforge/common/parallel.h"
#include "melforge/common/timing.h"
#include "pipeline.h"
#include "report.h"
#include "scan.h"
#include "split.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

constexpr double kMB = 1e6;
constexpr int64_t kMaxChunkBytes = int64_t{1} << 31;

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

/// Seconds of each stage, one entry per repeat, in first-use order. Batched stages add up over batches.
class RepeatTimes {
 public:
  explicit RepeatTimes(int repeats) : repeats_(repeats) {}
  void add(const std::string& stage, int repeat, double seconds) {
    auto [it, fresh] = seconds_.try_emplace(stage, std::vector<double>(static_cast<std::size_t>(repeats_), 0.0));
    if (fresh) order_.push_back(stage);
    it->second[static_cast<std::size_t>(repeat)] += seconds;
  }
  bool has(const std::string& stage) const { return seconds_.count(stage) > 0; }
  const std::vector<double>& seconds(const std::string& stage) const { return seconds_.at(stage); }
  double median(const std::string& stage) const {
    std::vector<double> v = seconds_.at(stage);
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  const std::vector<std::string>& order() const { return order_; }

 private:
  int repeats_;
  std::vector<std::string> order_;
  std::map<std::string, std::vector<double>> seconds_;
};

/// Runs `fn` `repeats` times and adds each run's wall time to `stage`, checking for a stop request before each.
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

/// A file of the sample that passed the probe, with its plan.
struct SampleFile {
  const InputFile* input = nullptr;
  audio::AudioInfo info;
  int64_t frames = 0;
  segment::FilePlan plan;
  int64_t file_bytes = 0;
};

/// Chunks of one split as the writer stores them: compressed bytes (or raw bytes at level 0) and the file count.
struct SplitChunks {
  std::vector<std::vector<unsigned char>> chunks;
  int64_t files = 0;
};

/// Writes every split's chunks into `folder`/<split>.h5 the way SplitWriter does: a chunked `mel` dataset of the
/// build's type, shape, chunk shape and filters, extended to its file count, the chunks written with
/// H5Dwrite_chunk, then flush and close. `raw` given: each chunk is that uncompressed chunk instead, in a dataset
/// without filters (what --compression-level 0 writes). Returns the bytes written.
int64_t write_splits(const fs::path& folder, const std::array<SplitChunks, 3>& splits,
                     const std::vector<int64_t>& file_shape, mel::DType dtype, int level, bool shuffle,
                     int64_t files_per_chunk, const std::vector<unsigned char>* raw) {
  int64_t bytes = 0;
  for (std::size_t s = 0; s < splits.size(); ++s) {
    h5::File file = h5::create_file(folder / (kSplitNames[s] + ".h5"));
    h5::Dataset mel = create_mel_dataset(file, file_shape, dtype, files_per_chunk, shuffle,
                                         raw == nullptr ? level : 0);
    if (splits[s].files > 0) {
      std::vector<int64_t> extent = {splits[s].files};
      extent.insert(extent.end(), file_shape.begin(), file_shape.end());
      h5::set_extent(mel, extent);
    }
    for (std::size_t c = 0; c < splits[s].chunks.size(); ++c) {
      std::vector<int64_t> offset(5, 0);
      offset[0] = static_cast<int64_t>(c) * files_per_chunk;
      const std::vector<unsigned char>& data = raw != nullptr ? *raw : splits[s].chunks[c];
      h5::write_chunk(mel, offset, data.data(), data.size(), 0);
      bytes += static_cast<int64_t>(data.size());
    }
    h5::silence_errors();
    if (H5Fflush(file.id(), H5F_SCOPE_GLOBAL) < 0) h5::throw_io(file.name() + ": cannot flush");
    mel.close();
    file.close();
  }
  return bytes;
}

/// `v` printed with `decimals` decimals.
std::string num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
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

nlohmann::json run_bench(const BuildConfig& config, const BenchOptions& opts, std::ostream& out, std::ostream& log) {
  using nlohmann::json;
  opts.validate();
  const fs::path parent = scratch_parent(opts);
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    throw InvalidArgument("scratch folder '" + parent.string() + "' does not exist (set --scratch or $TMPDIR)");
  BuildConfig e2e = config;
  e2e.build.output = parent / "melforge-bench-XXXXXX" / "end_to_end";
  e2e.build.overwrite = true;
  e2e.build.quiet = true;
  e2e.validate();

  const auto& bo = config.build;
  const int R = opts.repeats;
  const int sr = config.mel.sample_rate;
  const int threads = resolve_threads(bo.threads);
  const auto ratios = bo.split_ratios();
  const int64_t max_ram = bo.max_ram_bytes();
  audio::DecodeOptions decode_options = config.decode;
  decode_options.sample_rate = sr;
  const auto note = [&](const std::string& text) {
    if (!bo.quiet) log << "melforge-build bench: " << text << std::endl;
  };
  if (!bo.output.empty()) note("--output is not used: the end-to-end build writes into the scratch folder");

  ScratchDir scratch(parent);
  RepeatTimes times(R);
  std::vector<SkippedFile> skipped;
  const auto skip = [&](SkippedFile f) {
    if (bo.strict) throw StrictError("--strict: " + f.path + ": " + f.reason);
    skipped.push_back(std::move(f));
  };

  note("scan");
  ScanResult scan;
  timed(times, "scan", R, [&](int r) {
    ScanResult s = bo.input.empty() ? scan_manifest(bo.manifest) : scan_folder(bo.input, bo.extension_list());
    if (r == 0) scan = std::move(s);
  });
  const auto scanned = static_cast<int64_t>(scan.files.size() + scan.skipped.size());
  for (auto& s : scan.skipped) skip(s);
  if (scan.files.empty())
    throw InvalidArgument("no audio files found in " + (bo.input.empty() ? bo.manifest : bo.input).string());

  const auto total = static_cast<int64_t>(scan.files.size());
  const int64_t n = opts.bench_files == 0 ? total : std::min(opts.bench_files, total);
  const bool whole = n == total;
  std::vector<InputFile> sample;
  sample.reserve(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) sample.push_back(scan.files[static_cast<std::size_t>(i * total / n)]);
  assign_splits(sample, ratios, bo.seed);
  fs::path manifest;
  if (!whole) {
    for (auto& f : sample) f.path = fs::absolute(f.path);
    std::sort(sample.begin(), sample.end(),
              [](const InputFile& a, const InputFile& b) { return a.path.string() < b.path.string(); });
    manifest = scratch.path() / "sample.csv";
    std::string csv = "path,label,split\n";
    for (const auto& f : sample)
      csv += csv_field(f.path.string()) + "," + csv_field(f.label) + "," + kSplitNames[static_cast<std::size_t>(f.split)] + "\n";
    write_file_atomically(manifest, csv);
  }

  note("probe of " + std::to_string(n) + " files");
  std::vector<SampleFile> planned(static_cast<std::size_t>(n));
  std::vector<std::string> probe_error(static_cast<std::size_t>(n));
  timed(times, "probe", R, [&](int r) {
    parallel_for(n, threads, [&](int64_t i) {
      check_stop();
      auto& p = planned[static_cast<std::size_t>(i)];
      p.input = &sample[static_cast<std::size_t>(i)];
      try {
        p.info = audio::probe(p.input->path);
        p.frames = audio::output_frames(p.info, sr);
      } catch (const AudioError& e) {
        if (r == 0) probe_error[static_cast<std::size_t>(i)] = e.what();
      }
    }, 16);
  });

  std::vector<int64_t> lengths;
  for (std::size_t i = 0; i < planned.size(); ++i)
    if (probe_error[i].empty()) lengths.push_back(planned[i].frames);
  const int num_long = segment::resolve_num_long(lengths, config.segment, sr);
  const int num_short = config.segment.num_short(sr);
  const int64_t L = config.segment.long_samples(sr);
  const int64_t S = config.segment.short_samples(sr);
  std::vector<SampleFile> usable;
  for (std::size_t i = 0; i < planned.size(); ++i) {
    const InputFile& in = sample[i];
    if (!probe_error[i].empty()) {
      skip({in.rel_path, probe_error[i], "probe"});
      continue;
    }
    planned[i].plan = segment::plan_file(planned[i].frames, config.segment, sr, num_long);
    if (!planned[i].plan.skip_reason.empty()) {
      skip({in.rel_path, in.path.string() + ": " + planned[i].plan.skip_reason, "segment"});
      continue;
    }
    planned[i].file_bytes = static_cast<int64_t>(fs::file_size(in.path, ec));
    if (ec) planned[i].file_bytes = 0;
    usable.push_back(planned[i]);
  }

  note("mel engine");
  mel::EngineConfig engine_config;
  engine_config.mel = config.mel;
  engine_config.segment_samples = S;
  engine_config.dtype = bo.dtype;
  engine_config.threads = threads;
  engine_config.device_batch = bo.device_batch;
  std::unique_ptr<mel::MelEngine> engine;
  mel::EnginePlan engine_plan;
  timed(times, "engine_init", R, [&](int) {
    engine.reset();
    engine = mel::make_engine(bo.device, engine_config, &engine_plan);
  });
  if (const std::string line = engine_choice_message(bo.device, engine_plan, engine->name()); !line.empty()) note(line);
  const mel::MelLayout layout = engine->layout();
  const int64_t segs_per_file = int64_t{num_long} * num_short;
  const int64_t out_bytes_per_file = segs_per_file * layout.out_bytes_per_segment();
  const float silence = mel::silence_value(config.mel);
  const featurize::BatchLayout batch_layout{num_long, num_short, L, S};
  const std::vector<int64_t> file_shape = {num_long, num_short, layout.n_mels, layout.n_frames};
  const int64_t files_per_chunk = chunk_files(out_bytes_per_file, bo.files_per_chunk);
  const int64_t chunk_bytes = files_per_chunk * out_bytes_per_file;
  if (chunk_bytes > kMaxChunkBytes)
    throw InvalidArgument("HDF5 chunks of " + std::to_string(files_per_chunk) + " files would take " +
                          std::to_string(chunk_bytes) + " bytes, more than 2 GiB (lower --files-per-chunk)");
  const bool compressed = bo.compression_level > 0;
  const int64_t elem_bytes = bo.dtype == mel::DType::float16 ? 2 : 4;
  std::unique_ptr<ChunkCompressor> compressor;
  if (compressed)
    compressor = std::make_unique<ChunkCompressor>(bo.compression_level, bo.shuffle, elem_bytes, threads,
                                                   (scratch.path() / "compress").string());

  int64_t largest_decode = 0;
  for (const auto& f : usable)
    largest_decode = std::max(largest_decode, audio::decode_bytes(f.info, decode_options, f.plan.arena_samples));
  const int64_t budget = batch_budget(max_ram, threads, largest_decode);
  const auto batch_bytes = [&](const SampleFile& f) { return batch_file_bytes(f.plan.arena_samples, out_bytes_per_file); };

  int64_t decoded_files = 0;
  int64_t written = 0;
  int64_t segments = 0;
  int64_t input_bytes = 0;
  int64_t arena_bytes = 0;
  int64_t batches = 0;
  double audio_seconds = 0;
  int64_t compress_in = 0;
  int64_t compress_out = 0;
  std::array<SplitChunks, 3> split_chunks;
  std::vector<unsigned char> raw_chunk;
  std::vector<float> arena;
  std::vector<uint8_t> mel_out;
  std::vector<uint8_t> compact;
  const int64_t compress_batch = std::max<int64_t>(1, int64_t{threads} * kChunksPerThreadPerBatch);

  const auto store_chunks = [&](const std::vector<const unsigned char*>& sources, SplitChunks& dst) {
    if (sources.empty()) return;
    if (raw_chunk.empty()) raw_chunk.assign(sources[0], sources[0] + chunk_bytes);
    const auto count = static_cast<int64_t>(sources.size());
    compress_in += count * chunk_bytes;
    if (!compressed) {
      for (const unsigned char* s : sources) dst.chunks.emplace_back(s, s + chunk_bytes);
      compress_out += count * chunk_bytes;
      return;
    }
    for (int64_t first = 0; first < count; first += compress_batch) {
      const int64_t k = std::min(compress_batch, count - first);
      timed(times, "compress", R,
            [&](int) { compressor->compress(sources.data() + first, k, static_cast<std::size_t>(chunk_bytes)); });
      for (int64_t i = 0; i < k; ++i) {
        dst.chunks.emplace_back(compressor->output(i), compressor->output(i) + compressor->output_size(i));
        compress_out += static_cast<int64_t>(compressor->output_size(i));
      }
    }
  };

  note("decode, mel" + std::string(compressed ? " and compress" : "") + " of " + std::to_string(usable.size()) +
       " files, " + std::to_string(R) + " times each");
  for (std::size_t split = 0; split < kSplitNames.size(); ++split) {
    std::vector<const SampleFile*> files;
    for (const auto& f : usable)
      if (f.input->split == static_cast<int>(split)) files.push_back(&f);
    SplitChunks& chunks = split_chunks[split];
    ChunkCutter cutter(files_per_chunk, out_bytes_per_file);
    std::size_t next = 0;
    while (next < files.size()) {
      std::size_t end = next;
      int64_t bytes = 0;
      do {
        bytes += batch_bytes(*files[end]);
        ++end;
      } while (end < files.size() && bytes + batch_bytes(*files[end]) <= budget);
      const std::size_t nb = end - next;
      ++batches;

      std::vector<int64_t> arena_offset(nb + 1, 0);
      for (std::size_t i = 0; i < nb; ++i) arena_offset[i + 1] = arena_offset[i] + files[next + i]->plan.arena_samples;
      std::vector<std::string> decode_error(nb);
      std::vector<int64_t> decoded_frames(nb, 0);
      timed(times, "decode", R, [&](int r) {
        arena.assign(static_cast<std::size_t>(arena_offset[nb]), 0.0f);
        parallel_for(static_cast<int64_t>(nb), threads, [&](int64_t i) {
          const SampleFile& f = *files[next + static_cast<std::size_t>(i)];
          check_stop();
          try {
            audio::DecodedAudio a = audio::decode(f.input->path, decode_options, f.plan.arena_samples);
            const int64_t take = std::min<int64_t>(static_cast<int64_t>(a.samples.size()), f.plan.arena_samples);
            std::memcpy(arena.data() + arena_offset[static_cast<std::size_t>(i)], a.samples.data(),
                        static_cast<std::size_t>(take) * sizeof(float));
            decoded_frames[static_cast<std::size_t>(i)] = take < f.plan.arena_samples ? take : std::max(take, f.frames);
          } catch (const AudioError& e) {
            if (r == 0) decode_error[static_cast<std::size_t>(i)] = e.what();
          }
        });
      });
      decoded_files += static_cast<int64_t>(nb);
      arena_bytes += arena_offset[nb] * static_cast<int64_t>(sizeof(float));

      std::vector<int64_t> file_offsets;
      std::vector<int> file_valid_long;
      for (std::size_t i = 0; i < nb; ++i) {
        const SampleFile& f = *files[next + i];
        input_bytes += f.file_bytes;
        if (!decode_error[i].empty()) {
          skip({f.input->rel_path, decode_error[i], "decode"});
          continue;
        }
        file_offsets.push_back(arena_offset[i]);
        file_valid_long.push_back(f.plan.num_valid_long);
        audio_seconds += static_cast<double>(decoded_frames[i]) / sr;
      }
      const auto kept = static_cast<int64_t>(file_offsets.size());
      written += kept;
      chunks.files += kept;
      segments += std::accumulate(file_valid_long.begin(), file_valid_long.end(), int64_t{0}) * num_short;
      mel_out.resize(static_cast<std::size_t>(kept * out_bytes_per_file));
      if (kept > 0) {
        timed(times, "mel", R, [&](int) {
          featurize::compute_files(*engine, arena.data(), file_offsets, file_valid_long, batch_layout, bo.dtype,
                                   silence, mel_out.data(), compact);
        });
      }

      store_chunks(cutter.append(mel_out.data(), kept), chunks);
      next = end;
    }
    if (const unsigned char* last = cutter.flush()) store_chunks({last}, chunks);
  }
  arena = {};
  mel_out = {};
  int64_t chunk_count = 0;
  for (const auto& s : split_chunks) chunk_count += static_cast<int64_t>(s.chunks.size());

  note("HDF5 write of " + std::to_string(chunk_count) + " chunks");
  const fs::path write_dir = scratch.path() / "write";
  int64_t write_bytes = 0;
  int64_t raw_bytes = 0;
  for (const bool raw : {false, true}) {
    if (raw && !compressed) break;
    for (int r = 0; r < R; ++r) {
      fs::create_directories(write_dir, ec);
      if (ec) throw IoError("cannot create '" + write_dir.string() + "': " + ec.message());
      check_stop();
      const Stopwatch watch;
      const int64_t b = write_splits(write_dir, split_chunks, file_shape, bo.dtype, bo.compression_level, bo.shuffle,
                                     files_per_chunk, raw ? &raw_chunk : nullptr);
      times.add(raw ? "write_raw" : "write", r, watch.seconds());
      (raw ? raw_bytes : write_bytes) = b;
      fs::remove_all(write_dir, ec);
    }
  }

  note("end-to-end build of the same " + std::to_string(n) + " files");
  e2e.build.output = scratch.path() / "end_to_end";
  if (!whole) {
    e2e.build.input.clear();
    e2e.build.manifest = manifest;
  }
  json e2e_report;
  timed(times, "end_to_end", R, [&](int r) {
    BuildResult result = run_build(e2e);
    if (r == 0) e2e_report = std::move(result.report);
    fs::remove_all(e2e.build.output, ec);
  });

  const auto median = [&](const std::string& s) { return times.has(s) ? std::max(times.median(s), 1e-12) : 1e-12; };
  std::vector<std::string> summed;
  if (whole) summed.push_back("scan");
  for (const std::string s : {"probe", "engine_init", "decode", "mel", "compress", "write"})
    if (times.has(s)) summed.push_back(s);
  double sum_s = 0;
  for (const auto& s : summed) sum_s += times.median(s);
  const double e2e_s = median("end_to_end");

  struct Rate {
    double value;
    std::string unit;
    std::string key;
  };
  std::map<std::string, std::vector<Rate>> rates;
  rates["scan"] = {{static_cast<double>(scanned) / median("scan"), "entries/s", "entries"}};
  rates["probe"] = {{static_cast<double>(n) / median("probe"), "files/s", "files"}};
  rates["engine_init"] = {};
  rates["decode"] = {{static_cast<double>(decoded_files) / median("decode"), "files/s", "files"},
                     {audio_seconds / median("decode"), "audio s/s", "audio_seconds"},
                     {static_cast<double>(input_bytes) / kMB / median("decode"), "MB/s of input files", "mb_input"}};
  rates["mel"] = {{static_cast<double>(segments) / median("mel"), "segments/s", "segments"}};
  if (compressed)
    rates["compress"] = {{static_cast<double>(compress_in) / kMB / median("compress"), "MB/s in", "mb_in"},
                         {static_cast<double>(compress_out) / kMB / median("compress"), "MB/s out", "mb_out"}};
  rates["write"] = {{static_cast<double>(write_bytes) / kMB / median("write"),
                     compressed ? "MB/s (compressed chunks)" : "MB/s (raw chunks)", "mb"}};
  if (compressed)
    rates["write_raw"] = {{static_cast<double>(raw_bytes) / kMB / median("write_raw"),
                           "MB/s (uncompressed, no filters)", "mb"}};
  rates["end_to_end"] = {
      {static_cast<double>(e2e_report["files"]["written"].get<int64_t>()) / e2e_s, "files/s", "files"},
      {static_cast<double>(e2e_report["segments"].get<int64_t>()) / e2e_s, "segments/s", "segments"}};

  json stages = json::object();
  for (const auto& s : times.order()) {
    json per_s = json::object();
    for (const auto& rate : rates[s]) per_s[rate.key] = rate.value;
    stages[s] = {{"seconds", times.seconds(s)}, {"median_s", times.median(s)}, {"per_s", per_s}};
  }
  if (times.has("compress"))
    stages["compress"]["ratio"] = static_cast<double>(compress_in) / static_cast<double>(std::max<int64_t>(compress_out, 1));

  json skipped_json = json::array();
  for (const auto& f : skipped) skipped_json.push_back({{"path", f.path}, {"reason", f.reason}, {"stage", f.stage}});
  json cfg = e2e_report["config"];
  cfg["input"] = bo.input.string();
  cfg["manifest"] = bo.manifest.string();
  cfg.erase("output");
  const bool files_equal = e2e_report["files"]["written"].get<int64_t>() == written;
  const bool segments_equal = e2e_report["segments"].get<int64_t>() == segments;
  const bool bytes_equal = e2e_report["mel_bytes_compressed"].get<int64_t>() == compress_out;
  json result = {
      {"melforge_version", MELFORGE_VERSION},
      {"engine", engine->name()},
      {"engine_choice", engine_choice_json(bo.device, engine_plan, engine->name())},
      {"config", cfg},
      {"bench",
       {{"bench_files", opts.bench_files}, {"repeats", R}, {"scratch", parent.string()}, {"whole_corpus", whole}}},
      {"machine", {{"threads", threads}, {"cores", omp_get_num_procs()}, {"max_ram_bytes", max_ram}}},
      {"files",
       {{"scanned", scanned},
        {"audio_files", total},
        {"selected", n},
        {"decoded", decoded_files},
        {"written", written},
        {"skipped", static_cast<int64_t>(skipped.size())}}},
      {"skipped", skipped_json},
      {"segments", segments},
      {"audio_seconds", audio_seconds},
      {"batches", batches},
      {"bytes",
       {{"input_files", input_bytes},
        {"arena", arena_bytes},
        {"mel", compress_in},
        {"compressed", compress_out},
        {"written", write_bytes},
        {"written_raw", raw_bytes}}},
      {"chunks", {{"files_per_chunk", files_per_chunk}, {"chunk_bytes", chunk_bytes}, {"count", chunk_count}}},
      {"stages", stages},
      {"sum_of_stages_s", sum_s},
      {"sum_includes", summed},
      {"overlap", sum_s / e2e_s},
      {"checks",
       {{"written_equal_build", files_equal},
        {"segments_equal_build", segments_equal},
        {"compressed_bytes_equal_build", bytes_equal}}},
      {"peak_rss_bytes", peak_rss_bytes()},
  };

  char line[256];
  out << "\nmelforge-build bench: " << engine->name() << " engine, " << threads << " threads, " << n << " of " << total
      << " audio files (" << scanned << " entries scanned), median of " << R << " run" << (R == 1 ? "" : "s") << "\n";
  out << "  " << written << " files written, " << skipped.size() << " skipped, " << segments << " segments, "
      << num(audio_seconds, 1) << " s of audio, " << chunk_count << " HDF5 chunks of " << files_per_chunk
      << " files\n";
  for (const auto& f : skipped) out << "  skipped " << f.path << ": " << f.reason << "\n";
  std::snprintf(line, sizeof line, "\n%-13s %10s %14s  %s\n", "stage", "median s", "throughput", "unit");
  out << line;
  for (const auto& s : times.order()) {
    const auto& rs = rates[s];
    std::snprintf(line, sizeof line, "%-13s %10.4f %14s  %s\n", s.c_str(), times.median(s),
                  rs.empty() ? "" : num(rs[0].value, 1).c_str(), rs.empty() ? "" : rs[0].unit.c_str());
    out << line;
    for (std::size_t i = 1; i < rs.size(); ++i) {
      std::snprintf(line, sizeof line, "%-13s %10s %14s  %s\n", "", "", num(rs[i].value, 1).c_str(), rs[i].unit.c_str());
      out << line;
    }
    if (s == "compress") {
      std::snprintf(line, sizeof line, "%-13s %10s %14s  %s\n", "", "",
                    num(stages["compress"]["ratio"].get<double>(), 2).c_str(), "ratio (in/out)");
      out << line;
    }
  }
  std::string joined;
  for (const auto& s : summed) joined += (joined.empty() ? "" : "+") + s;
  std::snprintf(line, sizeof line, "\nsum of stages %10.4f s (%s)\n", sum_s, joined.c_str());
  out << line;
  std::snprintf(line, sizeof line,
                "end to end    %10.4f s; sum / end to end = %.2f (above 1: the pipeline overlaps the stages)\n", e2e_s,
                sum_s / e2e_s);
  out << line;
  if (!files_equal || !segments_equal || !bytes_equal)
    out << "note: the end-to-end build differs from the stages (files " << e2e_report["files"]["written"] << " vs "
        << written << ", segments " << e2e_report["segments"] << " vs " << segments << ", compressed bytes "
        << e2e_report["mel_bytes_compressed"] << " vs " << compress_out << ")\n";
  out.flush();
  if (!opts.bench_out.empty()) {
    write_json_atomically(opts.bench_out, result);
    out << "results: " << opts.bench_out.string() << "\n";
  }
  return result;
}

}  // namespace melforge::builder
