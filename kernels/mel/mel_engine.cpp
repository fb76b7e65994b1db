#include "mel/mel_engine.h"

#include <algorithm>
#include <exception>
#include <istream>
#include <ostream>
#include <thread>

#include "melforge/common/errors.h"
#include "fbank/fbank_math.h"
#include "mel/mel_math.h"

namespace melforge::mel {

std::string to_string(Device d) {
  switch (d) {
    case Device::auto_select: return "auto";
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "?";
}

Device parse_device(const std::string& s) {
  if (s == "auto") return Device::auto_select;
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  throw InvalidArgument("invalid device '" + s + "' (accepted: auto, cpu, cuda)");
}

std::istream& operator>>(std::istream& in, Device& d) {
  std::string token;
  if (in >> token) d = parse_device(token);
  return in;
}

std::ostream& operator<<(std::ostream& out, Device d) { return out << to_string(d); }

MelLayout make_layout(const EngineConfig& config) {
  MelLayout layout;
  layout.n_frames = config.mel.n_frames(config.segment_samples);
  if (config.segment_samples <= 0 || layout.n_frames < 1) {
    throw InvalidArgument("a segment of " + std::to_string(config.segment_samples) + " samples gives no frame (" +
                          config.mel.to_string() + ")");
  }
  layout.n_mels = config.mel.n_mels;
  layout.n_freqs = config.mel.n_freqs();
  layout.segment_samples = config.segment_samples;
  layout.out_elem_bytes = config.dtype == DType::float16 ? 2 : 4;
  return layout;
}

ClipBatch ClipBatch::slice(int64_t first, int64_t last) const {
  if (first < 0 || first > last || last > clips()) {
    throw InvalidArgument("clip range [" + std::to_string(first) + ", " + std::to_string(last) +
                          ") is not within the batch's " + std::to_string(clips()) + " clips");
  }
  ClipBatch sub;
  sub.n_mels = n_mels;
  sub.out_elem_bytes = out_elem_bytes;
  const auto begin = static_cast<std::ptrdiff_t>(first);
  const auto end = static_cast<std::ptrdiff_t>(last);
  sub.sample_offsets.assign(sample_offsets.begin() + begin, sample_offsets.begin() + end + 1);
  sub.flags.assign(flags.begin() + begin, flags.begin() + end);
  const int64_t base = frame_offsets[static_cast<size_t>(first)];
  sub.frame_offsets.reserve(static_cast<size_t>(last - first + 1));
  for (auto i = begin; i <= end; ++i) sub.frame_offsets.push_back(frame_offsets[static_cast<size_t>(i)] - base);
  return sub;
}

namespace {
/// Whether a clip of `samples` samples reads zeros beyond the signal under Kaldi framing: snip_edges false and a
/// frame reaching past one mirror image (fbank::kaldi_mirror_index), or a clip padded to its one frame.
bool fbank_zero_edges(const MelArgs& args, int64_t samples) {
  if (args.fbank.snip_edges || samples == 0) return false;
  const int64_t frames = args.clip_frames(samples);
  const int64_t first = args.fbank.frame_start(0, args.sample_rate);
  const int64_t last = args.fbank.frame_start(frames - 1, args.sample_rate) + args.win() - 1;
  return first < -samples || last >= 2 * samples;
}
}  // namespace

ClipBatch plan_clips(const MelArgs& args, DType dtype, std::span<const int64_t> sample_offsets) {
  args.validate();
  if (sample_offsets.empty()) throw InvalidArgument("a clip batch needs C + 1 sample offsets, got none");
  if (sample_offsets.front() < 0) {
    throw InvalidArgument("clip sample offsets must be >= 0, got " + std::to_string(sample_offsets.front()));
  }
  ClipBatch batch;
  batch.n_mels = args.n_mels;
  batch.out_elem_bytes = dtype == DType::float16 ? 2 : 4;
  batch.sample_offsets.assign(sample_offsets.begin(), sample_offsets.end());
  const size_t clips = sample_offsets.size() - 1;
  batch.frame_offsets.resize(clips + 1, 0);
  batch.flags.resize(clips, 0);
  const int pad = args.pad();
  const bool reflect = args.center && args.pad_mode == PadMode::reflect;
  for (size_t c = 0; c < clips; ++c) {
    const int64_t samples = sample_offsets[c + 1] - sample_offsets[c];
    if (samples < 0) {
      throw InvalidArgument("clip sample offsets must not decrease: clip " + std::to_string(c) + " is [" +
                            std::to_string(sample_offsets[c]) + ", " + std::to_string(sample_offsets[c + 1]) + ")");
    }
    batch.frame_offsets[c + 1] = batch.frame_offsets[c] + args.clip_frames(samples);
    uint8_t flags = 0;
    if (samples == 0 || args.n_frames(samples) == 0) flags |= kClipPaddedToFrame;
    if (args.is_fbank() ? fbank_zero_edges(args, samples) : reflect && !clip_reflects(samples, pad, reflect))
      flags |= kClipZeroEdges;
    batch.flags[c] = flags;
  }
  return batch;
}

void check_clip_batch(const ClipBatch& batch, const MelArgs& args, DType dtype) {
  const ClipBatch want = plan_clips(args, dtype, batch.sample_offsets);
  if (batch.frame_offsets != want.frame_offsets || batch.flags != want.flags || batch.n_mels != want.n_mels ||
      batch.out_elem_bytes != want.out_elem_bytes) {
    throw InvalidArgument("the clip batch was not planned for this engine (plan_clips with its mel args and dtype: " +
                          args.to_string() + ", " + to_string(dtype) + ")");
  }
}

std::vector<std::pair<int64_t, int64_t>> deal_clips(const ClipBatch& batch, int engines) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const int64_t clips = batch.clips();
  const int64_t total = batch.total_frames();
  const int64_t n = std::max(engines, 1);
  int64_t first = 0;
  for (int64_t e = 1; e <= n && first < clips; ++e) {
    const int64_t share = (total * e + n - 1) / n;
    int64_t last = first + 1;
    while (last < clips && batch.frame_offsets[static_cast<size_t>(last)] < share) ++last;
    if (e == n) last = clips;
    ranges.emplace_back(first, last);
    first = last;
  }
  return ranges;
}

float silence_value(const MelArgs& args) {
  if (args.is_fbank()) return args.fbank.use_log_fbank ? fbank::kaldi_log(0.0f) : 0.0f;
  return log_compress(0.0f, static_cast<int>(args.log), args.power, args.amin, args.log_eps);
}

namespace {

/// "CUDA 13.0" for 13000, "none installed" for 0.
std::string cuda_version_text(int version) {
  if (version <= 0) return "none installed";
  return "CUDA " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

/// "NVIDIA H100 (compute capability 9.0)"; "" when the name is unknown.
std::string device_name(const CudaDeviceSupport& s) {
  if (s.name.empty()) return "";
  return s.name + " (compute capability " + std::to_string(s.cc_major) + "." + std::to_string(s.cc_minor) + ")";
}

/// "CUDA device 1 (NVIDIA H100, compute capability 9.0)".
std::string device_text(const CudaDeviceSupport& s) {
  std::string text = "CUDA device " + std::to_string(s.device);
  if (!s.name.empty()) {
    text += " (" + s.name + ", compute capability " + std::to_string(s.cc_major) + "." + std::to_string(s.cc_minor) +
            ")";
  }
  return text;
}

}  // namespace

std::string CudaDeviceQuery::describe() const {
  if (!built_with_cuda) return "built without CUDA (MELFORGE_CUDA=OFF)";
  const std::string versions =
      " (driver: " + cuda_version_text(driver_version) + "; runtime: " + cuda_version_text(runtime_version) + ")";
  if (error_code != 0) return "cudaGetDeviceCount: " + error_name + ": " + error_message + versions;
  if (count < 1) return "cudaGetDeviceCount found no CUDA device" + versions;
  return std::to_string(count) + (count == 1 ? " CUDA device" : " CUDA devices") + versions;
}

EnginePlan plan_engines(Device device, const CudaDeviceQuery& query, const std::vector<CudaDeviceSupport>& support) {
  EnginePlan plan;
  if (device == Device::cpu) return plan;
  plan.cuda_query = query.describe();
  if (!query.usable()) {
    if (device == Device::cuda) {
      plan.cuda = true;
      plan.error = "the CUDA engine was requested, but no CUDA device is usable: " + query.describe();
    } else {
      plan.fallback_reason = "no usable CUDA device: " + query.describe();
    }
    return plan;
  }
  std::vector<int> devices;
  std::vector<std::string> names;
  std::string problems;
  for (int d = 0; d < query.count; ++d) {
    const auto at = static_cast<size_t>(d);
    if (at >= support.size() || support[at].supported()) {
      devices.push_back(d);
      names.push_back(at < support.size() ? device_name(support[at]) : "");
      continue;
    }
    CudaDeviceSupport named = support[at];
    named.device = d;
    problems += (problems.empty() ? "" : "; ") + device_text(named) + ": " + named.problem;
  }
  if (device == Device::cuda) {
    plan.cuda = true;
    if (problems.empty()) {
      plan.devices = std::move(devices);
      plan.device_names = std::move(names);
    } else {
      plan.error = "the CUDA engine was requested, but " + problems +
                   (devices.empty() ? "" : " (leave unsupported devices out with CUDA_VISIBLE_DEVICES)");
    }
    return plan;
  }
  if (devices.empty()) {
    plan.fallback_reason = "no supported CUDA device: " + problems;
    return plan;
  }
  plan.cuda = true;
  plan.devices = std::move(devices);
  plan.device_names = std::move(names);
  if (!problems.empty()) plan.fallback_reason = "left out " + problems;
  return plan;
}

EnginePlan choose_engines(Device device) {
  if (device == Device::cpu) return plan_engines(device, {}, {});
  const CudaDeviceQuery query = query_cuda_devices();
  std::vector<CudaDeviceSupport> support;
  for (int d = 0; d < query.count; ++d) support.push_back(cuda_device_support(d));
  return plan_engines(device, query, support);
}

std::vector<std::vector<DealtBatch>> deal_round_robin(int64_t count, int64_t unit, int engines) {
  std::vector<std::vector<DealtBatch>> out(static_cast<size_t>(std::max(engines, 1)));
  if (count <= 0) return out;
  const auto n = static_cast<int64_t>(out.size());
  const int64_t u = std::max<int64_t>(unit, 1);
  const int64_t units = (count + u - 1) / u;
  const int64_t chunk = (units + n - 1) / n * u;
  for (int64_t b = 0; b * chunk < count; ++b)
    out[static_cast<size_t>(b % n)].push_back({b * chunk, std::min(chunk, count - b * chunk)});
  return out;
}

namespace {

class MultiEngine final : public MelEngine {
 public:
  MultiEngine(std::vector<std::unique_ptr<MelEngine>> engines, int64_t deal)
      : engines_(std::move(engines)), deal_(deal) {
    if (engines_.empty()) throw InvalidArgument("a multi-device engine needs at least one engine");
    if (deal_ < 1) throw InvalidArgument("a multi-device engine deals batches of at least 1 segment");
    const MelLayout& l = engines_.front()->layout();
    for (const auto& e : engines_) {
      const MelLayout& o = e->layout();
      if (o.n_frames != l.n_frames || o.n_mels != l.n_mels || o.segment_samples != l.segment_samples ||
          o.out_elem_bytes != l.out_elem_bytes)
        throw InvalidArgument("a multi-device engine needs engines of one layout");
    }
    name_ = engines_.front()->name() + " x" + std::to_string(engines_.size());
  }

  void compute(const float* base, std::span<const int64_t> offsets, void* out) override {
    const auto dealt = deal_round_robin(static_cast<int64_t>(offsets.size()), deal_, static_cast<int>(engines_.size()));
    const int64_t bytes_per_segment = layout().out_bytes_per_segment();
    run_engines(dealt, [&](size_t e) {
      for (const DealtBatch& b : dealt[e])
        engines_[e]->compute(base, offsets.subspan(static_cast<size_t>(b.first), static_cast<size_t>(b.count)),
                             static_cast<char*>(out) + b.first * bytes_per_segment);
    });
  }

  void compute_clips(const float* samples, const ClipBatch& batch, void* out) override {
    const auto dealt = deal_clips(batch, static_cast<int>(engines_.size()));
    const int64_t row_bytes = static_cast<int64_t>(batch.n_mels) * batch.out_elem_bytes;
    run_engines(dealt, [&](size_t e) {
      const auto [first, last] = dealt[e];
      engines_[e]->compute_clips(samples, batch.slice(first, last),
                                 static_cast<char*>(out) + batch.frame_offsets[static_cast<size_t>(first)] * row_bytes);
    });
  }

  std::string name() const override { return name_; }

  EngineTimes times() const override {
    EngineTimes sum;
    for (const auto& e : engines_) {
      const EngineTimes t = e->times();
      sum.h2d_s += t.h2d_s;
      sum.compute_s += t.compute_s;
      sum.d2h_s += t.d2h_s;
    }
    return sum;
  }

  int64_t device_bytes() const override {
    int64_t sum = 0;
    for (const auto& e : engines_) sum += e->device_bytes();
    return sum;
  }

  int64_t host_bytes() const override {
    int64_t sum = 0;
    for (const auto& e : engines_) sum += e->host_bytes();
    return sum;
  }

  const MelLayout& layout() const override { return engines_.front()->layout(); }

 private:
  /// Runs work(e) for every engine e < dealt.size() that `dealt[e]` gives work (a non-empty entry), engine 0 on the
  /// calling thread and the others on one thread each; rethrows the first engine's error after all have finished.
  template <class Dealt, class Work>
  void run_engines(const std::vector<Dealt>& dealt, const Work& work) {
    std::vector<std::exception_ptr> errors(dealt.size());
    const auto run = [&](size_t e) {
      try {
        work(e);
      } catch (...) {
        errors[e] = std::current_exception();
      }
    };
    std::vector<std::thread> threads;
    for (size_t e = 1; e < dealt.size(); ++e)
      if (has_work(dealt[e])) threads.emplace_back(run, e);
    if (!dealt.empty() && has_work(dealt[0])) run(0);
    for (auto& t : threads) t.join();
    for (const auto& error : errors)
      if (error) std::rethrow_exception(error);
  }
  static bool has_work(const std::vector<DealtBatch>& batches) { return !batches.empty(); }
  static bool has_work(const std::pair<int64_t, int64_t>& clips) { return clips.second > clips.first; }

  std::vector<std::unique_ptr<MelEngine>> engines_;
  int64_t deal_;
  std::string name_;
};

}  // namespace

std::unique_ptr<MelEngine> make_multi_engine(std::vector<std::unique_ptr<MelEngine>> engines, int64_t deal) {
  return std::make_unique<MultiEngine>(std::move(engines), deal);
}

std::unique_ptr<MelEngine> make_engine(Device device, const EngineConfig& config, EnginePlan* chosen) {
  const EnginePlan plan = choose_engines(device);
  if (chosen != nullptr) *chosen = plan;
  if (!plan.error.empty()) throw CudaError(plan.error);
  if (!plan.cuda) return make_cpu_engine(config);
  std::vector<std::unique_ptr<MelEngine>> engines;
  for (const int d : plan.devices) {
    EngineConfig c = config;
    c.cuda_device = d;
    engines.push_back(make_cuda_engine(c));
  }
  if (engines.size() == 1) return std::move(engines.front());
  return make_multi_engine(std::move(engines), config.device_batch);
}

}  // namespace melforge::mel
