#include "report.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <variant>

#include "mel/half.h"
#include "melforge/common/timing.h"
#include "write_stage.h"

namespace melforge::builder {

void BuildStats::add_row(const audio::AudioInfo& info, const ClipPlan& plan, int copy, int64_t decoded_frames,
                         int sample_rate) {
  files++;
  frames += plan.frames;
  const double decoded = static_cast<double>(decoded_frames) / sample_rate;
  audio_seconds += decoded;
  if (info.sample_rate != sample_rate) resampled++;
  if (plan.padded()) padded++;
  if (plan.capped()) capped++;
  if (copy != 0) return;
  source_seconds += static_cast<double>(plan.source_samples) / sample_rate;
  stored_seconds += decoded;
  dropped_seconds += static_cast<double>(plan.source_samples - plan.samples) / sample_rate;
}

std::vector<std::string> clip_warnings(const BuildConfig& config, const BuildStats& stats) {
  const double seconds_in = stats.source_seconds;
  std::vector<std::string> out;
  const mel::MelArgs& m = config.mel;
  char text[400];
  if (stats.padded > 0 && m.is_fbank()) {
    std::snprintf(text, sizeof text,
                  "%lld %s too short for one Kaldi frame (%d samples, --frame-length %g ms, --snip-edges %s) and "
                  "zero-padded to one frame (clip_flags bit 0; counted in build_report.json clips.padded)",
                  static_cast<long long>(stats.padded), stats.padded == 1 ? "clip was" : "clips were", m.win(),
                  m.fbank.frame_length, m.fbank.snip_edges ? "true" : "false");
    out.emplace_back(text);
  } else if (stats.padded > 0) {
    std::snprintf(text, sizeof text,
                  "%lld %s too short for one STFT frame (n_fft %d, center %s) and zero-padded to one frame "
                  "(clip_flags bit 0; counted in build_report.json clips.padded)",
                  static_cast<long long>(stats.padded), stats.padded == 1 ? "clip was" : "clips were", m.n_fft,
                  m.center ? "true" : "false");
    out.emplace_back(text);
  }
  if (stats.capped > 0) {
    std::snprintf(text, sizeof text,
                  "--max-seconds %g: %lld %s cut, %.1f s of %.1f s of audio dropped (%.2f%%; clip_flags bit 1; "
                  "build_report.json clips.capped and clips.seconds_dropped)",
                  config.clips.max_seconds, static_cast<long long>(stats.capped),
                  stats.capped == 1 ? "clip was" : "clips were", stats.dropped_seconds, seconds_in,
                  seconds_in > 0 ? 100.0 * stats.dropped_seconds / seconds_in : 0.0);
    out.emplace_back(text);
  }
  return out;
}

nlohmann::json engine_choice_json(mel::Device device, const mel::EnginePlan& plan, const std::string& engine_name) {
  const auto text_or_null = [](const std::string& text) {
    return text.empty() ? nlohmann::json() : nlohmann::json(text);
  };
  nlohmann::json devices = nlohmann::json::array();
  for (size_t i = 0; i < plan.devices.size(); ++i)
    devices.push_back({{"index", plan.devices[i]},
                       {"name", text_or_null(i < plan.device_names.size() ? plan.device_names[i] : "")}});
  return {{"device", mel::to_string(device)},
          {"engine", engine_name},
          {"cuda_devices", devices},
          {"cuda_query", text_or_null(plan.cuda_query)},
          {"fallback_reason", text_or_null(plan.fallback_reason)}};
}

std::string engine_choice_message(mel::Device device, const mel::EnginePlan& plan, const std::string& engine_name) {
  if (plan.fallback_reason.empty()) return "";
  return "--device " + mel::to_string(device) + ": " + engine_name + " engine: " + plan.fallback_reason;
}

nlohmann::json make_report(const ReportInputs& in) {
  using nlohmann::json;
  const auto& c = in.config;
  const auto& m = c.mel;
  const auto& b = c.build;
  json config = {
      {"input", b.input.string()},
      {"manifest", b.manifest.string()},
      {"output", b.output.string()},
      {"split", b.split},
      {"seed", b.seed},
      {"split_by", to_string(b.split_by)},
      {"layout", b.layout},
      {"columns", b.columns},
      {"label_sep", std::string(1, b.label_separator())},
      {"audio_root", b.audio_root.string()},
      {"classes", b.classes.string()},
      {"group_by", b.group_by},
      {"folds", b.folds},
      {"speed_speakers", b.speed_speakers},
      {"test_trials", b.test_trials.string()},
      {"device", mel::to_string(b.device)},
      {"device_batch", b.device_batch},
      {"threads", b.threads},
      {"max_ram", b.max_ram},
      {"strict", b.strict},
      {"dtype", mel::to_string(b.dtype)},
      {"compression_level", b.compression_level},
      {"shuffle", b.shuffle},
      {"frames_per_chunk", b.frames_per_chunk},
      {"channel", c.decode.channel},
      {"sample_rate", m.sample_rate},
      {"n_fft", m.n_fft},
      {"win_length", m.win()},
      {"hop_length", m.hop()},
      {"window", mel::to_string(m.window)},
      {"center", m.center},
      {"pad_mode", mel::to_string(m.pad_mode)},
      {"power", m.power},
      {"n_mels", m.n_mels},
      {"f_min", m.f_min},
      {"f_max", m.fmax()},
      {"mel_scale", mel::to_string(m.mel_scale)},
      {"mel_norm", mel::to_string(m.mel_norm)},
      {"log", mel::to_string(m.log)},
      {"amin", m.amin},
      {"log_eps", m.log_eps},
      {"short_seconds", c.clips.short_seconds},
      {"short_samples", c.clips.short_samples(m.sample_rate)},
      {"n_frames", c.clips.tile_frames(m.sample_rate, m.hop())},
      {"max_seconds", c.clips.max_seconds},
  };
  for (const Attribute& a : front_end_attributes(m))
    config[a.name] = std::visit([](const auto& v) { return json(v); }, a.value);
  json counts = json::object();
  json totals = json::object();
  for (std::size_t i = 0; i < kSplitNames.size(); ++i) {
    int64_t t = 0;
    for (const auto& [k, v] : in.counts[i]) t += v;
    counts[kSplitNames[i]] = in.counts[i];
    totals[kSplitNames[i]] = t;
  }
  json skipped = json::array();
  for (const auto& f : in.skipped) skipped.push_back({{"path", f.path}, {"reason", f.reason}, {"stage", f.stage}});
  const double t = std::max(in.total_seconds, 1e-9);
  const auto& st = in.stats;
  json report = {
      {"melforge_version", MELFORGE_VERSION},
      {"engine", in.engine.name()},
      {"engine_choice", engine_choice_json(b.device, in.engine_plan, in.engine.name())},
      {"config", config},
      {"classes", in.class_names},
      {"counts", counts},
      {"files",
       {{"scanned", in.scanned},
        {"written", st.files},
        {"skipped", static_cast<int64_t>(in.skipped.size())},
        {"per_split", totals},
        {"resampled", st.resampled},
        {"padded", st.padded},
        {"capped", st.capped}}},
      {"skipped", json::array()},
      {"clips",
       {{"rows", st.files},
        {"frames", st.frames},
        {"padded", st.padded},
        {"capped", st.capped},
        {"seconds_in", st.source_seconds},
        {"seconds_stored", st.stored_seconds},
        {"seconds_dropped", st.dropped_seconds},
        {"stored_fraction",
         st.source_seconds > 0 ? nlohmann::json(st.stored_seconds / st.source_seconds) : nlohmann::json()}}},
      {"audio_seconds", st.audio_seconds},
      {"dropped_seconds", st.dropped_seconds},
      {"batches", st.batches},
      {"frame_bytes_compressed", in.frame_bytes},
      {"times_s", in.times.to_json()},
      {"total_s", in.total_seconds},
      {"throughput",
       {{"files_per_s", static_cast<double>(st.files) / t},
        {"frames_per_s", static_cast<double>(st.frames) / t},
        {"audio_hours_per_s", st.audio_seconds / 3600.0 / t}}},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"device_buffer_bytes", in.engine.device_bytes()},
  };
  report["skipped"] = std::move(skipped);
  return report;
}

}  // namespace melforge::builder
