#include "views/gather.h"

#include <algorithm>
#include <string>

#include "melforge/common/errors.h"

namespace melforge::data::views {

int64_t gather_example(const Example& e, const float* clip, int64_t n_mels, int64_t out_length, float pad_value,
                       float* x) {
  const bool fits = e.real >= 1 && e.clip_frames >= 1 && e.start >= 0 && e.start < e.clip_frames &&
                    (e.repeat || e.start + e.real <= e.clip_frames);
  if (!fits || n_mels < 1 || out_length < e.real)
    throw InvalidArgument("gather_example: example of clip " + std::to_string(e.clip) + " (start " +
                          std::to_string(e.start) + ", real " + std::to_string(e.real) + " of " +
                          std::to_string(e.clip_frames) + " clip frames) does not fit its clip or " +
                          std::to_string(out_length) + " output frames of " + std::to_string(n_mels) + " mels");
  for (int64_t i = 0; i < e.real;) {
    const int64_t source = e.repeat ? (e.start + i) % e.clip_frames : e.start + i;
    const int64_t run = std::min(e.real - i, e.clip_frames - source);
    for (int64_t m = 0; m < n_mels; ++m) {
      float* row = x + m * out_length + i;
      const float* column = clip + source * n_mels + m;
      for (int64_t k = 0; k < run; ++k) row[k] = column[k * n_mels];
    }
    i += run;
  }
  for (int64_t m = 0; m < n_mels; ++m) std::fill(x + m * out_length + e.real, x + (m + 1) * out_length, pad_value);
  return e.real;
}

}  // namespace melforge::data::views
