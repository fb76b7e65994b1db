#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "melforge/common/errors.h"
#include "melforge/common/fs_util.h"
#include "melforge/common/utf8.h"
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

/// `p` lexically normalised with '/' separators ("./a//b.wav" -> "a/b.wav").
std::string normal(std::string_view p) { return std::filesystem::path(p).lexically_normal().generic_string(); }

/// Positions just after each '/' of `p` that starts a non-empty trailing run of components (the proper tails).
std::vector<std::size_t> tail_starts(const std::string& p) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i + 1 < p.size(); ++i)
    if (p[i] == '/' && p[i + 1] != '/') out.push_back(i + 1);
  return out;
}

}  // namespace

TrialPathIndex::TrialPathIndex(std::vector<std::string> stored) : stored_(std::move(stored)) {
  exact_.reserve(stored_.size());
  for (std::size_t i = 0; i < stored_.size(); ++i) {
    if (!exact_.emplace(stored_[i], static_cast<int64_t>(i)).second)
      throw InvalidArgument("the split holds path '" + utf8::for_terminal(stored_[i]) + "' twice");
    for (const std::size_t at : tail_starts(stored_[i])) {
      auto& [count, first] = tails_[stored_[i].substr(at)];
      if (++count <= 3) first.push_back(static_cast<int64_t>(i));
    }
  }
}

int64_t TrialPathIndex::exact(const std::string& p) const {
  const auto it = exact_.find(p);
  return it == exact_.end() ? -1 : it->second;
}

int64_t TrialPathIndex::longest_tail(const std::string& absolute) const {
  for (const std::size_t at : tail_starts(absolute))
    if (const int64_t i = exact(absolute.substr(at)); i >= 0) return i;
  return -1;
}

TrialPathIndex::Match TrialPathIndex::find(std::string_view field, const TrialPathRules& rules) const {
  Match m;
  if ((m.index = exact(std::string(field))) >= 0) return m;
  if (!rules.root.empty()) {
    const std::string joined = (std::filesystem::path(rules.root) / std::filesystem::path(field))
                                   .lexically_normal().generic_string();
    if ((m.index = exact(joined)) >= 0) return m;
    if (!joined.empty() && joined.front() == '/' && (m.index = longest_tail(joined)) >= 0) return m;
  }
  const std::string p = normal(field);
  if (!p.empty() && p.front() == '/') {
    m.index = longest_tail(p);
    return m;
  }
  if ((m.index = exact(p)) >= 0) return m;
  const auto it = tails_.find(p);
  if (it == tails_.end()) return m;
  if (it->second.first == 1) {
    m.index = it->second.second.front();
    return m;
  }
  m.ambiguous = it->second.first;
  for (const int64_t i : it->second.second) m.candidates.push_back(path(i));
  return m;
}

namespace {

std::string where(const std::filesystem::path& path, int64_t line) {
  return "trial list " + utf8::for_terminal(path.string()) + ":" + std::to_string(line) + ": ";
}

/// The fields of one line, split at spaces and tabs.
std::vector<std::string_view> split_fields(std::string_view text) {
  std::vector<std::string_view> fields;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    const std::size_t begin = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') ++i;
    if (i > begin) fields.push_back(text.substr(begin, i - begin));
  }
  return fields;
}

/// The index of path field `field` of a line, or -1 with its problem appended to `unknown` / `ambiguous`.
int64_t resolve_field(std::string_view field, const TrialPathIndex& index, const TrialPathRules& rules,
                      std::string& unknown, std::string& ambiguous) {
  const TrialPathIndex::Match m = index.find(field, rules);
  if (m.index >= 0) return m.index;
  const std::string name = "'" + utf8::for_terminal(field) + "'";
  if (m.ambiguous > 1) {
    std::string c;
    for (const std::string& p : m.candidates) c += (c.empty() ? "'" : ", '") + utf8::for_terminal(p) + "'";
    ambiguous += (ambiguous.empty() ? "" : "; ") + name + " matches " + std::to_string(m.ambiguous) +
                 " files of the split (" + c + (m.ambiguous > 3 ? ", ..." : "") + ")";
  } else {
    unknown += (unknown.empty() ? "" : ", ") + name;
  }
  return -1;
}

Trial parse_trial_line(std::string_view text, const std::filesystem::path& path, int64_t line,
                       const TrialPathIndex& index, const TrialPathRules& rules, TrialList& list) {
  const std::vector<std::string_view> fields = split_fields(text);
  if (fields.size() != 3)
    throw FormatError(where(path, line) + "expected 3 fields 'LABEL ENROLL TEST', found " +
                      std::to_string(fields.size()));
  if (fields[0] != "0" && fields[0] != "1")
    throw FormatError(where(path, line) + "the label must be 1 (target) or 0 (non-target), found '" +
                      utf8::for_terminal(fields[0]) + "'");
  std::string unknown, ambiguous;
  const int64_t enroll = resolve_field(fields[1], index, rules, unknown, ambiguous);
  const int64_t test = resolve_field(fields[2], index, rules, unknown, ambiguous);
  if (!unknown.empty())
    throw FormatError(where(path, line) + "unknown path " + unknown + " (not among the " +
                      std::to_string(index.files()) + " files of the split, exactly, under --trials-root, as an "
                      "absolute path or as the end of a stored path)");
  if (!ambiguous.empty())
    throw FormatError(where(path, line) + "ambiguous path " + ambiguous +
                      ": write more of the path, or give --trials-root");
  list.enroll.emplace_back(fields[1]);
  list.test.emplace_back(fields[2]);
  return {enroll, test, fields[0] == "1"};
}

}  // namespace

TrialList read_trial_list(const std::filesystem::path& path, const TrialPathIndex& index, const TrialPathRules& rules,
                          std::uintmax_t max_bytes) {
  const std::string text = read_regular_file(path, "trial list", max_bytes);
  TrialList list;
  list.path = path;
  int64_t line = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line;
    std::string_view row(text.data() + pos, end - pos);
    pos = end + 1;
    if (row.size() > kMaxTrialLineBytes)
      throw FormatError(where(path, line) + "line of " + std::to_string(row.size()) + " bytes, longer than " +
                        std::to_string(kMaxTrialLineBytes) + " (three paths)");
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    if (row.find_first_not_of(" \t") == std::string_view::npos) continue;
    list.trials.push_back(parse_trial_line(row, path, line, index, rules, list));
  }
  if (list.trials.empty()) throw FormatError("trial list " + utf8::for_terminal(path.string()) + " holds no trial");
  return list;
}

std::vector<Trial> read_trials(const std::filesystem::path& path, const std::vector<std::string>& file_paths) {
  return read_trial_list(path, TrialPathIndex(file_paths)).trials;
}

std::vector<uint8_t> trial_targets(const std::vector<Trial>& trials) {
  std::vector<uint8_t> out;
  out.reserve(trials.size());
  for (const Trial& t : trials) out.push_back(t.target ? 1 : 0);
  return out;
}

}  // namespace melforge::verification
