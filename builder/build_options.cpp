#include "build_options.h"

#include <unistd.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <regex>
#include <set>

#include "layouts/layout.h"
#include "melforge/common/errors.h"
#include "melforge/common/parallel.h"
#include "output_folder.h"
#include "scan.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace melforge::builder {

namespace {

/// Prints the one-line warning of threads_cap_warning for a --threads value that resolve_threads will cap.
void warn_if_threads_capped(int threads) {
  if (const std::string warning = threads_cap_warning(threads); !warning.empty())
    std::fprintf(stderr, "melforge-build: warning: %s\n", warning.c_str());
}

}  // namespace

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw InvalidArgument(flag + ": '" + text + "' is not a size such as 512M or 4G");
  }
  std::string suffix = text.substr(used);
  double mult = 1;
  if (suffix == "" || suffix == "B") mult = 1;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (suffix == "T" || suffix == "t" || suffix == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw InvalidArgument(flag + ": unknown unit '" + suffix + "' in '" + text + "' (use K, M, G or T)");
  if (!(value > 0) || !std::isfinite(value)) throw InvalidArgument(flag + ": '" + text + "' must be positive");
  if (!(value * mult < 0x1p63)) throw InvalidArgument(flag + ": '" + text + "' is too large");
  return static_cast<int64_t>(value * mult);
}

std::vector<double> BuildOptions::split_ratios() const {
  std::vector<double> r;
  std::stringstream in(split);
  std::string part;
  while (std::getline(in, part, ',')) {
    std::size_t used = 0;
    double v = -1;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || !(v >= 0) || !std::isfinite(v))
      throw InvalidArgument("--split: '" + split + "' must be 2 or 3 non-negative ratios such as 0.8,0.1,0.1");
    r.push_back(v);
  }
  if (r.size() == 2) r.push_back(0.0);
  if (r.size() != 3)
    throw InvalidArgument("--split: '" + split + "' must be 2 or 3 non-negative ratios such as 0.8,0.1,0.1");
  const double sum = r[0] + r[1] + r[2];
  if (std::fabs(sum - 1.0) > 1e-6) throw InvalidArgument("--split: ratios '" + split + "' must sum to 1");
  return r;
}

int64_t BuildOptions::max_ram_bytes() const {
  if (max_ram == "auto") {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    return static_cast<int64_t>(pages) * page / 2;
  }
  return parse_byte_size(max_ram, "--max-ram");
}

std::vector<std::string> BuildOptions::extension_list() const {
  std::vector<std::string> out;
  std::stringstream in(extensions);
  std::string part;
  while (std::getline(in, part, ',')) {
    while (!part.empty() && part.front() == '.') part.erase(part.begin());
    for (auto& c : part) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::string ShardSpec::text() const {
  return sharded() ? std::to_string(index) + "/" + std::to_string(count) : std::string();
}

ShardSpec parse_shard(const std::string& text) {
  if (text.empty()) return {};
  const auto number = [](const std::string& part) {
    if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos) return -1L;
    const long v = std::stol(part);
    return v > 100000 ? -1L : v;
  };
  const std::size_t slash = text.find('/');
  const long k = slash == std::string::npos ? -1 : number(text.substr(0, slash));
  const long n = slash == std::string::npos ? -1 : number(text.substr(slash + 1));
  if (k < 1 || n < 1 || k > n)
    throw InvalidArgument("--shard: '" + text + "' must be K/N with 1 <= K <= N (e.g. 1/3, 2/3, 3/3: shards are "
                          "numbered from 1)");
  return {static_cast<int>(k), static_cast<int>(n)};
}

std::pair<int64_t, int64_t> shard_range(int64_t n, const ShardSpec& spec) {
  if (!spec.sharded()) return {0, n};
  const auto cut = [&](int64_t k) { return n / spec.count * k + n % spec.count * k / spec.count; };
  return {cut(spec.index - 1), cut(spec.index)};
}

namespace {

/// Throws InvalidArgument naming the flag when `given` without --manifest.
void require_manifest(const BuildOptions& o, bool given, const std::string& flag) {
  if (given && o.manifest.empty()) throw InvalidArgument(flag + " applies to a --manifest CSV; give --manifest FILE");
}

/// The checks of --test-trials (BuildOptions::validate): a regular file, with --split-by class, not with --layout
/// (a layout's protocol gives the splits) or --folds (folds give the splits), and a train or val ratio > 0 for the
/// classes the list does not name.
void validate_test_trials(const BuildOptions& o) {
  if (o.test_trials.empty()) return;
  std::error_code ec;
  if (!fs::is_regular_file(o.test_trials, ec))
    throw InvalidArgument("--test-trials: '" + o.test_trials.string() + "' is not a readable file");
  if (o.split_by != SplitBy::class_)
    throw InvalidArgument("--test-trials puts whole speakers in test: it needs --split-by class (got --split-by " +
                          to_string(o.split_by) + ")");
  if (!o.layout.empty())
    throw InvalidArgument("--test-trials does not apply with --layout " + o.layout + ": the layout's own protocol "
                          "gives the splits (--layout voxceleb1 takes the speakers of its veri_test2.txt itself)");
  if (o.folds != 0)
    throw InvalidArgument("--test-trials does not apply with --folds " + std::to_string(o.folds) +
                          ": the folds would give the test split");
  const std::vector<double> r = o.split_ratios();
  if (!(r[0] + r[1] > 0))
    throw InvalidArgument("--test-trials with --split " + o.split + ": the classes the list does not name go to "
                          "train and val by their ratios, which are both 0");
}

/// The checks of the protocol flags (BuildOptions::validate).
void validate_protocol(const BuildOptions& o) {
  std::error_code ec;
  if (!o.layout.empty()) {
    layouts::find_layout(o.layout);
    if (o.input.empty())
      throw InvalidArgument("--layout " + o.layout + " reads the dataset's root folder: give --input ROOT");
    for (const auto& [given, flag] : {std::pair{!o.columns.empty(), "--columns"}, {!o.label_sep.empty(), "--label-sep"},
                                      {!o.audio_root.empty(), "--audio-root"}})
      if (given) throw InvalidArgument(std::string(flag) + " does not apply with --layout " + o.layout +
                                       " (the layout reads the dataset's own metadata)");
  }
  require_manifest(o, !o.columns.empty(), "--columns");
  require_manifest(o, !o.label_sep.empty(), "--label-sep");
  require_manifest(o, !o.audio_root.empty(), "--audio-root");
  const ManifestColumns columns = parse_columns(o.columns);
  if (!o.label_sep.empty() && (o.label_sep.size() != 1 || o.label_sep == "\"" || o.label_sep == "\n" ||
                               o.label_sep == "\r"))
    throw InvalidArgument("--label-sep: '" + o.label_sep + "' must be one character (not a quote or a line break)");
  if (!o.audio_root.empty() && !fs::is_directory(o.audio_root, ec))
    throw InvalidArgument("--audio-root: '" + o.audio_root.string() + "' is not a folder");
  if (!o.classes.empty() && !fs::is_regular_file(o.classes, ec))
    throw InvalidArgument("--classes: '" + o.classes.string() + "' is not a readable file");
  if (o.folds != 0 && (o.folds < 2 || o.folds > 100))
    throw InvalidArgument("--folds: " + std::to_string(o.folds) + " is outside 2..100 (0: no folds)");
  if (!o.group_by.empty() && !columns.group.empty())
    throw InvalidArgument("--group-by and --columns group=" + columns.group + " both name the groups; give one");
  if (!o.group_by.empty() && o.manifest.empty()) {
    try {
      std::regex re(o.group_by, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw InvalidArgument("--group-by: '" + o.group_by + "' is not a valid regular expression (" + e.what() + ")");
    }
  }
}

}  // namespace

void BuildOptions::validate() const {
  if (input.empty() == manifest.empty()) throw InvalidArgument("give exactly one of --input DIR or --manifest CSV");
  std::error_code ec;
  if (!input.empty() && !fs::is_directory(input, ec))
    throw InvalidArgument("--input: '" + input.string() + "' is not a folder");
  if (!manifest.empty() && !fs::is_regular_file(manifest, ec))
    throw InvalidArgument("--manifest: '" + manifest.string() + "' is not a readable file");
  check_output_folder(output, overwrite, "--output");
  shard_spec();
  split_ratios();
  max_ram_bytes();
  if (threads < 0) throw InvalidArgument("--threads must be >= 0 (0: all cores)");
  if (compression_level < 0 || compression_level > 9) throw InvalidArgument("--compression-level must be 0..9");
  if (frames_per_chunk < 0) throw InvalidArgument("--frames-per-chunk must be >= 0 (0: auto)");
  if (device_batch < 1) throw InvalidArgument("--device-batch must be >= 1");
  if (extension_list().empty()) throw InvalidArgument("--extensions must name at least one extension");
  validate_protocol(*this);
  speed_speaker_factors();
  validate_test_trials(*this);
}

std::string speed_text(double factor) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", factor);
  return buf;
}

std::vector<double> BuildOptions::speed_speaker_factors() const {
  if (speed_speakers.empty()) return {};
  augment::AugmentArgs as_speed;
  as_speed.speed = speed_speakers;
  std::vector<double> factors;
  try {
    factors = as_speed.speed_list();
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    throw InvalidArgument("--speed-speakers: " + (what.starts_with("--speed: ") ? what.substr(9) : what));
  }
  if (factors.size() > kMaxSpeedSpeakers)
    throw InvalidArgument("--speed-speakers: " + std::to_string(factors.size()) + " factors in '" + speed_speakers +
                          "'; at most " + std::to_string(kMaxSpeedSpeakers) + " (each adds a copy of every "
                          "training speaker)");
  std::set<std::string> seen;
  for (const double f : factors) {
    if (f == 1.0)
      throw InvalidArgument("--speed-speakers: factor 1 in '" + speed_speakers + "' would add the speakers "
                            "themselves again; give factors other than 1 (e.g. 0.9,1.1)");
    if (!seen.insert(speed_text(f)).second)
      throw InvalidArgument("--speed-speakers: factor " + speed_text(f) + " is given twice in '" + speed_speakers +
                            "'");
  }
  return factors;
}

void add_options(po::options_description& desc, BuildOptions& o) {
  desc.add_options()
    ("input", po::value<fs::path>(&o.input), "corpus folder: root/<class>/**/file or root/{train,val,test}/<class>/...")
    ("manifest", po::value<fs::path>(&o.manifest), "CSV manifest with path,label[,split] (instead of --input)")
    ("output", po::value<fs::path>(&o.output), "output folder for train.h5, val.h5, test.h5 and build_report.json")
    ("split", po::value<std::string>(&o.split)->default_value(o.split), "split ratios train,val,test (not used for "
     "files whose split comes from a fold)")
    ("seed", po::value<uint64_t>(&o.seed)->default_value(o.seed), "seed of the split assignment")
    ("split-by", po::value<SplitBy>(&o.split_by)->default_value(o.split_by),
     "what --split divides: file (each class's files; every class in every split) or class (whole classes, "
     "open-set: each class in one split)")
    ("device", po::value<mel::Device>(&o.device)->default_value(o.device), "mel engine: auto, cpu or cuda")
    ("threads", po::value<int>(&o.threads)->default_value(o.threads)->notifier(warn_if_threads_capped),
     "worker threads (0: all cores; at most 4 per core)")
    ("max-ram", po::value<std::string>(&o.max_ram)->default_value(o.max_ram),
     "memory budget for audio and output buffers (e.g. 512M, 4G; auto: half of RAM); larger corpora stream in batches."
     " The list of files comes on top: about 2.1 KB per file (a warning says when it exceeds this budget)")
    ("strict", po::bool_switch(&o.strict), "fail (non-zero exit naming the file) on the first skipped file")
    ("overwrite", po::bool_switch(&o.overwrite), "replace existing outputs in --output")
    ("quiet", po::bool_switch(&o.quiet), "no progress output")
    ("dtype", po::value<mel::DType>(&o.dtype)->default_value(o.dtype), "stored type: float16 or float32")
    ("compression-level", po::value<int>(&o.compression_level)->default_value(o.compression_level),
     "deflate level 0 (none) to 9")
    ("shuffle", po::value<bool>(&o.shuffle)->default_value(o.shuffle, o.shuffle ? "true" : "false"),
     "HDF5 shuffle filter before deflate (true/false)")
    ("frames-per-chunk", po::value<int64_t>(&o.frames_per_chunk)->default_value(o.frames_per_chunk),
     "frames per HDF5 chunk of the frames dataset (0: about 1 MiB uncompressed)")
    ("extensions", po::value<std::string>(&o.extensions)->default_value(o.extensions),
     "file extensions scanned as audio in --input folders")
    ("include-hidden", po::bool_switch(&o.include_hidden),
     "scan files and folders whose name starts with '.' (default: ignored and counted in the report)")
    ("device-batch", po::value<int64_t>(&o.device_batch)->default_value(o.device_batch),
     "CUDA engine: frames per cuFFT launch, in tiles of --short-seconds")
    ("layout", po::value<std::string>(&o.layout),
     "read --input as a public dataset's own tree, with its protocol (splits, folds, groups, class order): one of "
     "esc50, urbansound8k, speechcommands, fsd50k, voxceleb1, librispeech (docs/LAYOUTS.md)")
    ("columns", po::value<std::string>(&o.columns),
     "--manifest columns by header name: path=COL,label=COL[,split=COL][,fold=COL][,group=COL]")
    ("label-sep", po::value<std::string>(&o.label_sep),
     "separator of several labels in one manifest label field (default ';'; quoted fields honoured)")
    ("audio-root", po::value<fs::path>(&o.audio_root),
     "folder the manifest's relative paths are resolved against (default: the manifest's folder)")
    ("classes", po::value<fs::path>(&o.classes),
     "class order: a file of one class name a line, or a vocabulary CSV index,label,mid (FSD50K); default: sorted")
    ("group-by", po::value<std::string>(&o.group_by),
     "keep each group in one split and one fold: a manifest header column, or a regular expression searched in "
     "each path (its first group, else the whole match), e.g. '^[^/]+/([^_]+)_nohash_'")
    ("folds", po::value<int>(&o.folds)->default_value(o.folds),
     "assign folds 1..K (2..100), grouped and stratified by class, to files without one; fold K is then test, "
     "fold K-1 val, the others train (0: no folds)")
    ("speed-speakers", po::value<std::string>(&o.speed_speakers),
     "speed perturbation as new speakers (Kaldi/VoxCeleb recipes), e.g. 0.9,1.1: every train file gets one more "
     "utterance per factor, decoded at that speed as --speed does, of the new class <class>_sp<factor> "
     "(id10001_sp0.9), appended after the original classes; each factor in [0.5, 2], not 1, at most 8; "
     "train only, single-label corpora only (the speed_speaker dataset records the factor)")
    ("test-trials", po::value<fs::path>(&o.test_trials),
     "with --split-by class: a trial list (<1|0> <enroll> <test> a line, VoxCeleb1's veri_test2.txt) whose "
     "speakers (the classes of its paths, matched as stored or as the one stored path ending in /<path>) are the "
     "test split; the other classes go to train and val by --split; copied to OUT/trials.txt")
    ("shard", po::value<std::string>(&o.shard),
     "K/N: build only shard K of N (1..N) of the corpus into --output; join the N folders with "
     "`melforge-build merge`");
}

int64_t ClipOptions::short_samples(int sample_rate) const { return std::llround(short_seconds * sample_rate); }

int64_t ClipOptions::max_samples(int sample_rate) const {
  return max_seconds > 0 ? std::max<int64_t>(1, std::llround(max_seconds * sample_rate)) : 0;
}

int64_t ClipOptions::tile_frames(int sample_rate, int hop_length) const {
  return std::llround(short_seconds * sample_rate / hop_length);
}

void ClipOptions::validate(int sample_rate, int hop_length) const {
  if (!(short_seconds > 0) || !std::isfinite(short_seconds) || !(short_seconds * sample_rate < 0x1p31))
    throw InvalidArgument("--short-seconds must be > 0 and under 2^31 samples (got " + std::to_string(short_seconds) +
                          ")");
  if (short_samples(sample_rate) < 1 || tile_frames(sample_rate, hop_length) < 1)
    throw InvalidArgument("--short-seconds " + std::to_string(short_seconds) + " is shorter than one hop (" +
                          std::to_string(hop_length) + " samples) at " + std::to_string(sample_rate) + " Hz");
  if (!(max_seconds >= 0) || !std::isfinite(max_seconds) || !(max_seconds * sample_rate < 0x1p62))
    throw InvalidArgument("--max-seconds must be >= 0 seconds (0: no cap), got " + std::to_string(max_seconds));
}

void add_options(po::options_description& desc, ClipOptions& o) {
  const auto refuse = [](const std::string& flag) {
    return [flag](const std::string&) {
      throw InvalidArgument("--" + flag + " no longer exists: melforge-build stores every clip whole (schema 3), so "
                            "there are no long segments to count, cut or pad; readers choose tiles, crops or whole "
                            "clips. To cap long clips, use --max-seconds S");
    };
  };
  desc.add_options()
    ("short-seconds", po::value<double>(&o.short_seconds)->default_value(o.short_seconds),
     "the default tile readers cut clips into (the model input), seconds: stored as the short_seconds, "
     "short_samples and n_frames attributes")
    ("max-seconds", po::value<double>(&o.max_seconds)->default_value(o.max_seconds),
     "store at most the first S seconds of each clip (0: every clip whole); what is cut is a warning and figures "
     "in build_report.json, and clip_flags bit 1")
    ("num-long", po::value<std::string>()->notifier(refuse("num-long")), "removed (clips are stored whole): refused")
    ("long-seconds", po::value<std::string>()->notifier(refuse("long-seconds")),
     "removed (clips are stored whole): refused")
    ("short-files", po::value<std::string>()->notifier(refuse("short-files")),
     "removed (no clip is skipped for being short): refused");
}

void EngineCheckOptions::validate(mel::Device device) const {
  const EngineCheckFault& f = fault;
  if (f.cpu_acts_as != mel::Device::cpu && device != mel::Device::cpu)
    throw InvalidArgument("engine check hook: cpu_acts_as needs --device cpu, got --device " + mel::to_string(device));
  if (!std::isfinite(f.mel_offset) || !std::isfinite(f.augment_offset))
    throw InvalidArgument("engine check hook: the offsets must be finite");
  if (f.mel_element < 0 || f.augment_sample < 0)
    throw InvalidArgument("engine check hook: mel_element and augment_sample must be >= 0");
}

void add_options(po::options_description& desc, EngineCheckOptions& o) {
  desc.add_options()("no-engine-check", po::bool_switch(&o.skip),
                     "CUDA engine: do not compare the first batch (and the first augmented batch) with the CPU "
                     "engine (recorded in build_report.json's engine_check as skipped)");
}

namespace {

/// The mel-only flags (canonical names) and the fbank flag that plays their part ("" when none does).
const std::vector<std::pair<std::string, std::string>>& mel_only_flags() {
  static const std::vector<std::pair<std::string, std::string>> flags = {
      {"n-fft", "frame-length"},   {"win-length", "frame-length"}, {"hop-length", "frame-shift"},
      {"window", "window-type"},   {"center", "snip-edges"},       {"pad-mode", "snip-edges"},
      {"power", "use-power"},      {"n-mels", "num-mel-bins"},     {"f-min", "low-freq"},
      {"f-max", "high-freq"},      {"mel-scale", ""},              {"mel-norm", ""},
      {"log", "use-log-fbank"},    {"amin", "use-log-fbank"},      {"log-eps", "use-log-fbank"}};
  return flags;
}

/// The fbank flags' canonical names, as fbank::add_options registers them.
const std::vector<std::string>& fbank_flags() {
  static const std::vector<std::string> names = [] {
    fbank::FbankArgs scratch;
    po::options_description desc;
    fbank::add_options(desc, scratch);
    std::vector<std::string> out;
    for (const auto& option : desc.options()) out.push_back(option->long_name());
    return out;
  }();
  return names;
}

}  // namespace

void add_front_end_options(po::options_description& desc, mel::MelArgs& mel) {
  desc.add_options()("features", po::value<mel::Features>(&mel.features)->default_value(mel.features),
                     "feature front-end: mel (torchaudio's MelSpectrogram and --log) or fbank (Kaldi's filterbank as "
                     "torchaudio.compliance.kaldi.fbank computes it, with the flags below)");
  fbank::add_options(desc, mel.fbank);
}

void apply_front_end(mel::MelArgs& mel, const std::vector<std::string>& given_flags) {
  const auto given = [&](const std::string& name) {
    return std::find(given_flags.begin(), given_flags.end(), name) != given_flags.end();
  };
  if (mel.is_fbank()) {
    for (const auto& [flag, instead] : mel_only_flags())
      if (given(flag))
        throw InvalidArgument("--" + flag + " does not apply to --features fbank (a mel flag): " +
                              (instead.empty() ? std::string("Kaldi's filterbank has no such parameter")
                                               : "use --" + instead));
    mel.use_fbank(mel.fbank);
    return;
  }
  for (const std::string& flag : fbank_flags()) {
    if (!given(flag)) continue;
    std::string instead;
    for (const auto& [mel_flag, fbank_flag] : mel_only_flags())
      if (fbank_flag == flag && instead.empty()) instead = mel_flag;
    throw InvalidArgument("--" + flag + " applies to --features fbank, but --features is mel (the default): add "
                          "--features fbank" + (instead.empty() ? "" : ", or use --" + instead + " for mel features"));
  }
}

void BuildConfig::validate() const {
  build.validate();
  mel.validate();
  clips.validate(mel.sample_rate, mel.hop());
  mel.validate(clips.short_samples(mel.sample_rate));
  if (mel.log == mel::LogMode::none && build.dtype == mel::DType::float16)
    throw InvalidArgument("--log none with --dtype float16 (the default dtype) would store +Inf wherever the linear "
                          "mel power exceeds 65504, the largest float16 (a loud 16-bit file exceeds it); use --log "
                          "none with --dtype float32, or keep float16 with --log db or --log ln");
  if (mel.is_fbank() && !mel.fbank.use_log_fbank && build.dtype == mel::DType::float16)
    throw InvalidArgument("--use-log-fbank false with --dtype float16 (the default dtype) would store +Inf wherever "
                          "the linear filterbank energy exceeds 65504, the largest float16; use --dtype float32");
  if (mel.is_fbank() && mel.fbank.dither_seed > static_cast<uint64_t>(INT64_MAX))
    throw InvalidArgument("--dither-seed " + std::to_string(mel.fbank.dither_seed) +
                          " must be below 2^63 (it is stored as an int64 attribute)");
  if (decode.channel < -1) throw InvalidArgument("--channel must be -1 (mix down) or a channel index >= 0");
  if (!build.layout.empty() && augment.copies > 0 && augment.noise.empty()) {
    augment::AugmentArgs with_bank = augment;
    with_bank.noise = build.input;
    with_bank.validate();
  } else {
    augment.validate();
  }
  engine_check.validate(build.device);
}

}  // namespace melforge::builder
