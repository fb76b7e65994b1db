#pragma once
/// Views (issue 28): the examples a split is read as, cut from clips stored whole. A view turns a split's per-clip
/// frame counts into a list of examples, each a window of one clip (with padding at its end, masked, or the clip
/// repeated); the reader gathers the frames. Pure index arithmetic: no I/O, no LibTorch.
///
/// The views are named in one list (view_list.cpp): tiles (fixed windows, tiles.cpp), crops (one seeded random window
/// per clip per epoch, crops.cpp) and clips (whole clips, clips.cpp). Adding a view is a file defining its factory and
/// a line in that list.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace melforge::data::views {

struct ViewOptions;

/// The frame rate of a split's log-mels: frame k is centred on sample k * hop_length.
struct FrameRate {
  /// Sample rate of the analysed audio, Hz (> 0).
  int64_t sample_rate = 16000;
  /// Hop between frames, samples (> 0).
  int64_t hop_length = 160;

  /// Frames in `seconds` (>= 0, finite): seconds * sample_rate / hop_length rounded to the nearest integer, halves
  /// away from zero (std::llround), so 2 s at 16 kHz with hop 160 is 200 frames and 0.1 s is 10 frames, whatever the
  /// binary rounding of 0.1. May be 0 for a very short duration; ViewOptions::validate(rate) refuses that.
  int64_t frames(double seconds) const;
  /// Throws InvalidArgument when sample_rate or hop_length is not positive.
  void validate() const;
};

/// One example: a window of `length` frames of one clip. Its first `real` frames are clip frames start, start + 1,
/// ...; the rest is padding, masked (never a labelled frame, never a vote). A repeated example instead reads the clip
/// over and over: position i is clip frame (start + i) % clip_frames, all real.
struct Example {
  /// Index of the clip in the split's clip order, in [0, clips).
  int64_t clip = 0;
  /// First clip frame of the example, in [0, clip_frames).
  int64_t start = 0;
  /// Frames of the example (real and padding), >= 1.
  int64_t length = 0;
  /// Frames read from the clip, in [1, length]; positions [real, length) are padding.
  int64_t real = 0;
  /// Frames of the whole clip (>= 1): the period of a repeated example.
  int64_t clip_frames = 0;
  /// True when the example's frames repeat the clip (then real == length).
  bool repeat = false;

  bool operator==(const Example&) const = default;
};

/// Clip frame (relative to the clip's first frame) read at each of the example's positions, [max(length,
/// padded_length)]: start + i for a real position, (start + i) % clip_frames for a repeated example, -1 for padding
/// (positions past `real`, and past `length` up to `padded_length` when a batch pads the example further).
std::vector<int64_t> source_frames(const Example& e, int64_t padded_length = 0);

/// Mask of the example's positions, [max(length, padded_length)]: 1 for a real frame, 0 for padding.
std::vector<uint8_t> frame_mask(const Example& e, int64_t padded_length = 0);

/// A way of reading a split's clips as examples. Implementations are stateless after construction: the examples of
/// an epoch are a function of (options, frame counts, seed, epoch) only, so a resumed run sees the same examples as
/// an uninterrupted one and clips can be planned in any order, on any thread.
class View {
 public:
  virtual ~View() = default;

  /// The view's name in the list (`--view`).
  virtual std::string_view name() const = 0;

  /// Appends the examples of clip `clip` (index in the split) of `clip_frames` frames (>= 1) for (`seed`, `epoch`).
  /// Depends on nothing else; thread-safe.
  virtual void clip_examples(int64_t clip, int64_t clip_frames, uint64_t seed, int64_t epoch,
                             std::vector<Example>& out) const = 0;

  /// Appends the examples of the group of copies of clips [first, first + rows) (a clean clip and its augmented
  /// copies; `clip_frames` is the whole split's [F]) for (`seed`, `epoch`). The default: clip_examples of every clip
  /// of the group, in order (tiles and clips read every copy); the crops view draws one crop of one copy.
  virtual void group_examples(int64_t first, int64_t rows, std::span<const int64_t> clip_frames, uint64_t seed,
                              int64_t epoch, std::vector<Example>& out) const;

  /// True when the examples change with the epoch (crops); false when every epoch has the same ones.
  virtual bool varies_by_epoch() const { return false; }

  /// The examples of epoch `epoch` (>= 0) of a split whose clip c has `clip_frames[c]` frames, group by group
  /// (group_examples), so in clip order and, within a clip, by start. `group_offsets` [groups + 1] cuts the clips
  /// into groups of copies (SplitInfo::group_offsets: group g is clips [group_offsets[g], group_offsets[g + 1]));
  /// empty: every clip is its own group. Throws InvalidArgument naming the clip when a count is below 1, when the
  /// epoch is negative, or when group_offsets does not start at 0, increase strictly and end at the clip count.
  std::vector<Example> examples(std::span<const int64_t> clip_frames, uint64_t seed, int64_t epoch,
                                std::span<const int64_t> group_offsets = {}) const;
};

/// One entry of the list of views.
struct ViewEntry {
  /// The `--view` name.
  std::string_view name;
  /// One line for --help.
  std::string_view summary;
  /// Builds the view from validated options and the split's frame rate.
  std::unique_ptr<View> (*make)(const ViewOptions& options, const FrameRate& rate);
};

/// The list of views, in --help order (view_list.cpp).
std::span<const ViewEntry> view_list();

/// The known names, comma-separated, in list order ("tiles, crops, clips").
std::string view_names();

/// The tiles view at exact frame counts: tiles of `tile` frames every `hop` frames, the last one padded, one with
/// fewer than min_real * tile real frames not made unless it is the clip's only one (tiles.cpp). make_view's tiles
/// are this at FrameRate::frames of the options' seconds; schema 1/2 datasets read as make_tiles_view_frames(n_frames,
/// n_frames, 0), exactly their valid short segments. Throws InvalidArgument naming the argument unless tile >= 1,
/// 1 <= hop <= tile and min_real in [0, 1].
std::unique_ptr<View> make_tiles_view_frames(int64_t tile, int64_t hop, double min_real);

/// The view named `options.view` for a split of frame rate `rate`. Validates the options against the rate first
/// (ViewOptions::validate(rate)); throws InvalidArgument naming --view and the known names for an unknown name.
std::unique_ptr<View> make_view(const ViewOptions& options, const FrameRate& rate);

}  // namespace melforge::data::views
