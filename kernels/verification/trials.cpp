#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "melforge/common/errors.h"
#include "melforge/common/splitmix.h"
#include "verification/verification.h"

namespace melforge::verification {

namespace {

using Rng = SplitMixRng;

using Pair = std::pair<int64_t, int64_t>;

Pair ordered(int64_t a, int64_t b) { return a < b ? Pair{a, b} : Pair{b, a}; }

/// `needed` distinct pairs out of the `available` ones: by rejection of repeats from `draw` when needed is at most
/// half of them, else by a partial Fisher-Yates shuffle of every pair that `enumerate` lists.
template <class Draw, class Enumerate>
std::vector<Pair> distinct_pairs(int64_t needed, int64_t available, int64_t files, Rng& rng, Draw&& draw,
                                 Enumerate&& enumerate) {
  std::vector<Pair> out;
  out.reserve(static_cast<std::size_t>(needed));
  if (2 * needed <= available) {
    std::unordered_set<uint64_t> seen;
    while (static_cast<int64_t>(out.size()) < needed) {
      const Pair p = draw();
      if (seen.insert(static_cast<uint64_t>(p.first) * static_cast<uint64_t>(files) + static_cast<uint64_t>(p.second))
              .second)
        out.push_back(p);
    }
    return out;
  }
  std::vector<Pair> all = enumerate();
  for (int64_t i = 0; i < needed; ++i) {
    const auto j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(all.size() - static_cast<std::size_t>(i))));
    std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(j)]);
    out.push_back(all[static_cast<std::size_t>(i)]);
  }
  return out;
}

/// Files of each class, classes in ascending label order.
std::vector<std::vector<int64_t>> group_by_label(const std::vector<int32_t>& labels) {
  std::map<int32_t, std::vector<int64_t>> groups;
  for (std::size_t f = 0; f < labels.size(); ++f) groups[labels[f]].push_back(static_cast<int64_t>(f));
  std::vector<std::vector<int64_t>> out;
  for (auto& [label, files] : groups) out.push_back(std::move(files));
  return out;
}

int64_t pairs_of(int64_t n) { return n * (n - 1) / 2; }

/// An index c drawn with probability w_c / sum(w), from the running sums `cumulative` of the weights w (sum > 0).
std::size_t draw_weighted(const std::vector<int64_t>& cumulative, Rng& rng) {
  const auto r = static_cast<int64_t>(rng.below(static_cast<uint64_t>(cumulative.back())));
  return static_cast<std::size_t>(std::upper_bound(cumulative.begin(), cumulative.end(), r) - cumulative.begin());
}

std::vector<Pair> draw_targets(const std::vector<std::vector<int64_t>>& groups, int64_t needed, int64_t available,
                               int64_t files, Rng& rng) {
  std::vector<int64_t> cumulative;
  int64_t total = 0;
  for (const auto& g : groups) cumulative.push_back(total += pairs_of(static_cast<int64_t>(g.size())));
  auto draw = [&] {
    const auto& g = groups[draw_weighted(cumulative, rng)];
    const auto m = static_cast<uint64_t>(g.size());
    const uint64_t i = rng.below(m);
    uint64_t j = rng.below(m - 1);
    if (j >= i) ++j;
    return ordered(g[i], g[j]);
  };
  auto enumerate = [&] {
    std::vector<Pair> all;
    for (const auto& g : groups)
      for (std::size_t i = 0; i < g.size(); ++i)
        for (std::size_t j = i + 1; j < g.size(); ++j) all.emplace_back(g[i], g[j]);
    return all;
  };
  return distinct_pairs(needed, available, files, rng, draw, enumerate);
}

std::vector<Pair> draw_nontargets(const std::vector<std::vector<int64_t>>& groups, int64_t files, int64_t needed,
                                  int64_t available, Rng& rng) {
  std::vector<int64_t> cumulative, start, by_class;
  int64_t total = 0;
  for (const auto& g : groups) {
    const auto m = static_cast<int64_t>(g.size());
    cumulative.push_back(total += m * (files - m));
    start.push_back(static_cast<int64_t>(by_class.size()));
    by_class.insert(by_class.end(), g.begin(), g.end());
  }
  auto draw = [&] {
    const std::size_t c = draw_weighted(cumulative, rng);
    const auto m = static_cast<uint64_t>(groups[c].size());
    const int64_t a = groups[c][rng.below(m)];
    auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(files) - m));
    if (j >= start[c]) j += static_cast<int64_t>(m);
    return ordered(a, by_class[static_cast<std::size_t>(j)]);
  };
  auto enumerate = [&] {
    std::vector<Pair> all;
    for (std::size_t c = 0; c < groups.size(); ++c)
      for (std::size_t d = c + 1; d < groups.size(); ++d)
        for (const int64_t a : groups[c])
          for (const int64_t b : groups[d]) all.push_back(ordered(a, b));
    return all;
  };
  return distinct_pairs(needed, available, files, rng, draw, enumerate);
}

}  // namespace

std::vector<Trial> generate_trials(const std::vector<int32_t>& labels, int64_t count, uint64_t seed) {
  if (count <= 0 || count % 2 != 0)
    throw InvalidArgument("trial generation: the trial count must be even and positive (half target, half "
                          "non-target), got " + std::to_string(count));
  const auto groups = group_by_label(labels);
  if (groups.size() < 2)
    throw InvalidArgument("trial generation needs files of at least 2 classes, the split has " +
                          std::to_string(groups.size()));
  const auto files = static_cast<int64_t>(labels.size());
  int64_t targets = 0;
  for (const auto& g : groups) targets += pairs_of(static_cast<int64_t>(g.size()));
  if (targets == 0)
    throw InvalidArgument("trial generation: no class has 2 files, so there is no target trial (" +
                          std::to_string(groups.size()) + " classes, " + std::to_string(files) + " files)");
  const int64_t nontargets = pairs_of(files) - targets, half = count / 2;
  if (half > targets || half > nontargets)
    throw InvalidArgument("trial generation: " + std::to_string(count) + " trials need " + std::to_string(half) +
                          " target and " + std::to_string(half) + " non-target pairs, the split has " +
                          std::to_string(targets) + " target and " + std::to_string(nontargets) +
                          " non-target pairs");
  Rng rng(seed);
  std::vector<Trial> trials;
  trials.reserve(static_cast<std::size_t>(count));
  for (const auto& [a, b] : draw_targets(groups, half, targets, files, rng)) trials.push_back({a, b, true});
  for (const auto& [a, b] : draw_nontargets(groups, files, half, nontargets, rng)) trials.push_back({a, b, false});
  std::sort(trials.begin(), trials.end(),
            [](const Trial& x, const Trial& y) { return Pair{x.enroll, x.test} < Pair{y.enroll, y.test}; });
  return trials;
}

namespace {

std::string where(const std::filesystem::path& path, int64_t line) {
  return "trial list " + path.string() + " line " + std::to_string(line) + ": ";
}

Trial parse_trial_line(const std::string& text, const std::filesystem::path& path, int64_t line,
                       const std::unordered_map<std::string, int64_t>& index) {
  std::istringstream in(text);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  if (fields.size() != 3)
    throw FormatError(where(path, line) + "expected 3 fields 'LABEL ENROLL TEST', found " +
                      std::to_string(fields.size()));
  if (fields[0] != "0" && fields[0] != "1")
    throw FormatError(where(path, line) + "the label must be 1 (target) or 0 (non-target), found '" + fields[0] +
                      "'");
  std::string unknown;
  for (std::size_t k = 1; k < 3; ++k)
    if (!index.contains(fields[k])) unknown += (unknown.empty() ? "'" : ", '") + fields[k] + "'";
  if (!unknown.empty())
    throw FormatError(where(path, line) + "unknown path " + unknown + " (not among the " +
                      std::to_string(index.size()) + " files of the split)");
  return {index.at(fields[1]), index.at(fields[2]), fields[0] == "1"};
}

}  // namespace

std::vector<Trial> read_trials(const std::filesystem::path& path, const std::vector<std::string>& file_paths) {
  std::unordered_map<std::string, int64_t> index;
  for (std::size_t i = 0; i < file_paths.size(); ++i)
    if (!index.emplace(file_paths[i], static_cast<int64_t>(i)).second)
      throw InvalidArgument("trial list " + path.string() + ": the split holds path '" + file_paths[i] + "' twice");
  std::ifstream in(path);
  if (!in) throw IoError("cannot open trial list " + path.string());
  std::vector<Trial> trials;
  int64_t line = 0;
  for (std::string text; std::getline(in, text);) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    trials.push_back(parse_trial_line(text, path, line, index));
  }
  if (in.bad()) throw IoError("cannot read trial list " + path.string());
  if (trials.empty()) throw FormatError("trial list " + path.string() + " holds no trial");
  return trials;
}

std::vector<uint8_t> trial_targets(const std::vector<Trial>& trials) {
  std::vector<uint8_t> out;
  out.reserve(trials.size());
  for (const Trial& t : trials) out.push_back(t.target ? 1 : 0);
  return out;
}

}  // namespace melforge::verification
