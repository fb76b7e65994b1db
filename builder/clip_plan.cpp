#include "clip_plan.h"

#include <algorithm>
#include <string>

#include "melforge/common/errors.h"

namespace melforge::builder {

ClipPlan plan_clip(int64_t source_samples, int64_t max_samples, const mel::MelArgs& mel) {
  ClipPlan p;
  p.source_samples = source_samples;
  p.samples = max_samples > 0 ? std::min(source_samples, max_samples) : source_samples;
  const int64_t offsets[2] = {0, p.samples};
  const mel::ClipBatch one = mel::plan_clips(mel, mel::DType::float32, offsets);
  p.frames = one.total_frames();
  const int padded = one.flags[0] != 0 ? kStoredPadded : 0;
  const int capped = p.samples < source_samples ? kStoredCapped : 0;
  p.flags = static_cast<uint8_t>(padded | capped);
  return p;
}

int64_t KeptRows::total_frames() const {
  int64_t frames = 0;
  for (const FileRecord& r : records) frames += r.frames;
  return frames;
}

void compute_rows(mel::MelEngine& engine, const mel::MelArgs& mel, mel::DType dtype, const float* arena,
                  const KeptRows& rows, void* out) {
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t frame_bytes = int64_t{mel.n_mels} * (dtype == mel::DType::float16 ? 2 : 4);
  const std::size_t n = rows.records.size();
  std::vector<int64_t> offsets;
  for (std::size_t first = 0, last = 0; first < n; first = last) {
    offsets = {rows.starts[first]};
    for (last = first; last < n && rows.starts[last] == offsets.back(); ++last)
      offsets.push_back(rows.starts[last] + rows.records[last].num_samples);
    const mel::ClipBatch batch = mel::plan_clips(mel, dtype, offsets);
    for (std::size_t i = first; i < last; ++i)
      if (batch.frames(static_cast<int64_t>(i - first)) != rows.records[i].frames)
        throw Error("compute_rows: '" + rows.records[i].path + "' was planned with " +
                    std::to_string(rows.records[i].frames) + " frames, the engine gives " +
                    std::to_string(batch.frames(static_cast<int64_t>(i - first))));
    engine.compute_clips(arena, batch, dst);
    dst += batch.total_frames() * frame_bytes;
  }
}

}  // namespace melforge::builder
