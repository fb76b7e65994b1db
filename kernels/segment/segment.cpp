#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <istream>
#include <map>
#include <ostream>

#include "melforge/common/errors.h"
#include "melforge/common/options.h"
#include "segment/segment_args.h"

namespace po = boost::program_options;

namespace melforge::segment {

std::string to_string(ShortFilePolicy p) { return p == ShortFilePolicy::pad ? "pad" : "skip"; }

ShortFilePolicy parse_short_file_policy(const std::string& s) {
  if (s == "pad") return ShortFilePolicy::pad;
  if (s == "skip") return ShortFilePolicy::skip;
  throw InvalidArgument("--short-files: '" + s + "' is not one of pad, skip");
}

std::istream& operator>>(std::istream& in, ShortFilePolicy& p) {
  std::string s;
  in >> s;
  p = parse_short_file_policy(s);
  return in;
}

std::ostream& operator<<(std::ostream& out, ShortFilePolicy p) { return out << to_string(p); }

int64_t SegmentArgs::long_samples(int sample_rate) const { return std::llround(long_seconds * sample_rate); }

int64_t SegmentArgs::short_samples(int sample_rate) const { return std::llround(short_seconds * sample_rate); }

int SegmentArgs::num_short(int sample_rate) const {
  const int64_t s = short_samples(sample_rate);
  return s > 0 ? static_cast<int>(long_samples(sample_rate) / s) : 0;
}

void SegmentArgs::validate(int sample_rate) const {
  if (!(long_seconds > 0) || !std::isfinite(long_seconds))
    throw InvalidArgument("--long-seconds must be > 0 (got " + std::to_string(long_seconds) + ")");
  if (!(short_seconds > 0) || !std::isfinite(short_seconds))
    throw InvalidArgument("--short-seconds must be > 0 (got " + std::to_string(short_seconds) + ")");
  if (short_seconds > long_seconds)
    throw InvalidArgument("--short-seconds (" + std::to_string(short_seconds) + ") must not exceed --long-seconds (" +
                          std::to_string(long_seconds) + ")");
  if (num_long < 0) throw InvalidArgument("--num-long must be a positive number or auto");
  if (!(long_seconds * sample_rate < 0x1p31))
    throw InvalidArgument("--long-seconds " + std::to_string(long_seconds) + " is 2^31 samples or more at " +
                          std::to_string(sample_rate) + " Hz");
  if (short_samples(sample_rate) < 1)
    throw InvalidArgument("--short-seconds is shorter than one sample at " + std::to_string(sample_rate) + " Hz");
}


void add_options(po::options_description& desc, SegmentArgs& args) {
  desc.add_options()
    ("long-seconds", po::value<double>(&args.long_seconds)->default_value(args.long_seconds),
     "length of a long segment, seconds")
    ("short-seconds", po::value<double>(&args.short_seconds)->default_value(args.short_seconds),
     "length of a short segment, seconds (a long segment holds floor(long/short) of them)")
    ("num-long", po::value<std::string>()->default_value(args.num_long > 0 ? std::to_string(args.num_long) : "auto")
         ->notifier([&args](const std::string& v) { args.num_long = parse_positive_or_auto(v, "--num-long"); }),
     "long segments stored per file, or auto (the most common count of whole long segments)")
    ("short-files", po::value<ShortFilePolicy>(&args.short_files)->default_value(args.short_files),
     "files shorter than one long segment: pad (zero-pad to one long segment) or skip");
}

FilePlan plan_file(int64_t frames, const SegmentArgs& args, int sample_rate, int num_long) {
  FilePlan plan;
  const int64_t L = args.long_samples(sample_rate);
  const int64_t S = args.short_samples(sample_rate);
  char reason[200];
  if (frames < S) {
    std::snprintf(reason, sizeof reason, "too short: %.3f s < one short segment (%.3f s)",
                  static_cast<double>(frames) / sample_rate, args.short_seconds);
    plan.skip_reason = reason;
    return plan;
  }
  if (frames < L) {
    if (args.short_files == ShortFilePolicy::skip) {
      std::snprintf(reason, sizeof reason, "too short: %.3f s < one long segment (%.3f s) and --short-files skip",
                    static_cast<double>(frames) / sample_rate, args.long_seconds);
      plan.skip_reason = reason;
      return plan;
    }
    plan.num_valid_long = 1;
    plan.arena_samples = L;
    plan.padded_samples = L - frames;
    return plan;
  }
  const int64_t whole = frames / L;
  plan.capped = whole > num_long;
  plan.num_valid_long = static_cast<int>(std::min<int64_t>(whole, num_long));
  plan.arena_samples = plan.num_valid_long * L;
  plan.dropped_samples = frames - plan.arena_samples;
  return plan;
}

int resolve_num_long(const std::vector<int64_t>& frames, const SegmentArgs& args, int sample_rate) {
  if (args.num_long > 0) return args.num_long;
  const int64_t L = args.long_samples(sample_rate);
  std::map<int64_t, int64_t> counts;
  for (int64_t f : frames) counts[std::max<int64_t>(1, f / L)]++;
  int64_t best = 1;
  int64_t best_count = 0;
  for (const auto& [n, c] : counts) {
    if (c > best_count) {
      best = n;
      best_count = c;
    }
  }
  return static_cast<int>(best);
}

}  // namespace melforge::segment
