#pragma once
/// How a file is cut into long segments and each long segment into short ones.
#include <cstdint>
#include <string>
#include <vector>

namespace boost::program_options {
class options_description;
}

namespace melforge::segment {

/// What to do with a file shorter than one long segment (but at least one short segment long).
enum class ShortFilePolicy { pad, skip };
std::string to_string(ShortFilePolicy p);
ShortFilePolicy parse_short_file_policy(const std::string& s);
std::istream& operator>>(std::istream& in, ShortFilePolicy& p);
std::ostream& operator<<(std::ostream& out, ShortFilePolicy p);

/// Segmentation parameters. Field names equal the flag names with underscores, and the HDF5 attribute names.
struct SegmentArgs {
  /// Length of a long segment, seconds.
  double long_seconds = 2.0;
  /// Length of a short segment, seconds. A long segment holds floor(long/short) short ones; the rest is unused.
  double short_seconds = 0.25;
  /// Long segments stored per file; 0 means auto: the most common number of whole long segments among the files
  /// (at least 1). Files with more are capped; files with fewer are zero-filled and record num_valid_long.
  int num_long = 0;
  /// Files shorter than one long segment: zero-pad to one long segment (pad), or skip them (skip).
  ShortFilePolicy short_files = ShortFilePolicy::pad;

  /// Long segment length, samples, at `sample_rate` (rounded to nearest).
  int64_t long_samples(int sample_rate) const;
  /// Short segment length, samples, at `sample_rate` (rounded to nearest).
  int64_t short_samples(int sample_rate) const;
  /// Short segments per long segment.
  int num_short(int sample_rate) const;
  /// Throws InvalidArgument for non-positive lengths, a short segment longer than a long one, a long segment of
  /// 2^31 samples or more at `sample_rate`, or num_long < 0.
  void validate(int sample_rate) const;
};

/// Registers --long-seconds, --short-seconds, --num-long (a number or "auto") and --short-files.
void add_options(boost::program_options::options_description& desc, SegmentArgs& args);

/// How one file is segmented.
struct FilePlan {
  /// Long segments that hold audio (1..num_long); 0 when the file is skipped.
  int num_valid_long = 0;
  /// Samples the arena stores for the file: num_valid_long * long_samples (zero-padded past the audio).
  int64_t arena_samples = 0;
  /// Samples of the file that are not used (past the last valid long segment, or beyond the cap).
  int64_t dropped_samples = 0;
  /// Samples of zero padding added (file shorter than one long segment, policy pad).
  int64_t padded_samples = 0;
  /// The file had more whole long segments than num_long.
  bool capped = false;
  /// Empty when the file is used; else why it is skipped (e.g. "too short: 0.100 s < one short segment 0.250 s").
  std::string skip_reason;
};

/// Plans a file of `frames` samples (at the target rate) with `num_long` long segments per file.
FilePlan plan_file(int64_t frames, const SegmentArgs& args, int sample_rate, int num_long);

/// The auto num_long for files of these lengths (samples at the target rate): the most common count of whole long
/// segments, ties to the smaller, at least 1. Returns args.num_long when it is set (> 0).
int resolve_num_long(const std::vector<int64_t>& frames, const SegmentArgs& args, int sample_rate);

}  // namespace melforge::segment
