#include "windows/windows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "melforge/common/errors.h"

namespace melforge::windows {

namespace {

/// decode options of the featurizer's dataset.
audio::DecodeOptions decode_options(const featurize::DatasetParams& p) {
  audio::DecodeOptions d;
  d.sample_rate = p.mel.sample_rate;
  d.channel = p.channel;
  return d;
}

}  // namespace

int64_t WindowPlan::audio_samples(int64_t k) const { return std::min(long_samples, frames - start(k)); }

int64_t hop_samples(double hop_seconds, const segment::SegmentArgs& args, int sample_rate) {
  if (!std::isfinite(hop_seconds) || hop_seconds < 0)
    throw InvalidArgument("--hop must be a number of seconds > 0 (got " + std::to_string(hop_seconds) + ")");
  if (hop_seconds == 0) return args.long_samples(sample_rate);
  if (hop_seconds > args.long_seconds)
    throw InvalidArgument("--hop " + std::to_string(hop_seconds) + " s exceeds the model's window (long_seconds " +
                          std::to_string(args.long_seconds) + " s): windows would leave gaps");
  const int64_t hop = std::llround(hop_seconds * sample_rate);
  if (hop < 1)
    throw InvalidArgument("--hop " + std::to_string(hop_seconds) + " s is shorter than one sample at " +
                          std::to_string(sample_rate) + " Hz");
  return std::min(hop, args.long_samples(sample_rate));
}

WindowPlan plan_windows(int64_t frames, const segment::SegmentArgs& args, int sample_rate, int64_t hop_samples) {
  WindowPlan w;
  w.frames = frames;
  w.long_samples = args.long_samples(sample_rate);
  w.hop_samples = hop_samples;
  if (frames < w.long_samples) {
    const segment::FilePlan p = segment::plan_file(frames, args, sample_rate, 1);
    w.skip_reason = p.skip_reason;
    w.count = p.num_valid_long;
    return w;
  }
  w.count = (frames - w.long_samples) / hop_samples + 1;
  const int64_t covered = w.start(w.count - 1) + w.long_samples;
  if (covered < frames && args.short_files == segment::ShortFilePolicy::pad &&
      frames - w.start(w.count) >= args.short_samples(sample_rate))
    ++w.count;
  return w;
}

FileWindows::FileWindows(featurize::Featurizer& featurizer, const std::filesystem::path& path, int64_t hop_samples,
                         int64_t batch_windows)
    : featurizer_(featurizer), stream_(path, decode_options(featurizer.params())), batch_windows_(batch_windows) {
  if (batch_windows < 1) throw InvalidArgument("FileWindows: batch_windows must be >= 1");
  const featurize::DatasetParams& p = featurizer.params();
  plan_ = plan_windows(stream_.info().frames, p.segment, p.mel.sample_rate, hop_samples);
  if (!plan_.skip_reason.empty()) throw AudioError(path.string() + ": " + plan_.skip_reason);
}

void FileWindows::buffer(int64_t start, int64_t end) {
  const int64_t buf_end = buf_start_ + static_cast<int64_t>(buf_.size());
  const int64_t drop = std::min(start, buf_end) - buf_start_;
  if (drop > 0) {
    buf_.erase(buf_.begin(), buf_.begin() + drop);
    buf_start_ += drop;
  }
  while (buf_.empty() && buf_start_ < start) {
    buf_.resize(static_cast<size_t>(std::min<int64_t>(start - buf_start_, int64_t{1} << 16)));
    const int64_t got = stream_.read(buf_);
    buf_.clear();
    if (got == 0) return;
    buf_start_ += got;
  }
  const int64_t have = static_cast<int64_t>(buf_.size());
  if (buf_start_ + have >= end) return;
  buf_.resize(static_cast<size_t>(end - buf_start_));
  const int64_t got = stream_.read(std::span<float>(buf_).subspan(static_cast<size_t>(have)));
  buf_.resize(static_cast<size_t>(have + got));
}

bool FileWindows::next(WindowBatch& out) {
  if (next_ >= plan_.count) return false;
  const featurize::DatasetParams& p = featurizer_.params();
  const int64_t n = std::min(batch_windows_, plan_.count - next_);
  const int64_t L = plan_.long_samples;
  arena_.assign(static_cast<size_t>(n * L), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = next_ + i;
    const int64_t take = plan_.audio_samples(k);
    buffer(plan_.start(k), plan_.start(k) + take);
    const int64_t avail = std::min(take, buf_start_ + static_cast<int64_t>(buf_.size()) - plan_.start(k));
    std::memcpy(arena_.data() + i * L, buf_.data() + (plan_.start(k) - buf_start_),
                static_cast<size_t>(std::max<int64_t>(avail, 0)) * sizeof(float));
  }
  featurize::BatchLayout layout;
  layout.num_long = 1;
  layout.num_short = static_cast<int>(p.num_short);
  layout.long_samples = L;
  layout.short_samples = p.short_samples;
  std::vector<int64_t> offsets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) offsets[static_cast<size_t>(i)] = i * L;
  const std::vector<int> valid(static_cast<size_t>(n), 1);
  mel::MelEngine& engine = featurizer_.engine();
  const int64_t per_window = p.num_short * p.n_mels * p.n_frames;
  bytes_.resize(static_cast<size_t>(n * p.num_short * engine.layout().out_bytes_per_segment()));
  featurize::compute_files(engine, arena_.data(), offsets, valid, layout, p.dtype, mel::silence_value(p.mel),
                           bytes_.data(), scratch_);
  out.values.resize(static_cast<size_t>(n * per_window));
  featurize::to_float(bytes_.data(), p.dtype, out.values);
  out.first = next_;
  out.count = n;
  next_ += n;
  return true;
}

}  // namespace melforge::windows
