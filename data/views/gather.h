#pragma once
/// An example's frames laid out for a model: the one place where a view's Example meets the frames ClipReader reads.
#include <cstdint>

#include "views/view.h"

namespace melforge::data::views {

/// Writes example `e` as x[n_mels][out_length] (mel-major, the models' orientation) from `clip`, the clip's frames
/// float32 [e.clip_frames][n_mels] (frame-major, clip frame 0 first, as ClipReader::read_frames gives them):
/// position i < e.real takes clip frame source_frames(e)[i] (start + i, or (start + i) % clip_frames repeated);
/// positions [e.real, out_length) hold `pad_value` (the dataset's silence value, mel::silence_value). Returns
/// e.real, the real length. Throws InvalidArgument when out_length < e.real, n_mels < 1, or the example does not fit
/// its clip (real < 1, start outside the clip, a non-repeated example past the clip's end).
int64_t gather_example(const Example& e, const float* clip, int64_t n_mels, int64_t out_length, float pad_value,
                       float* x);

}  // namespace melforge::data::views
