#include "protocol/cv_splits.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"

namespace fs = std::filesystem;

namespace melforge::data {

std::vector<int64_t> FoldPool::fold_counts() const {
  std::vector<int64_t> counts(static_cast<std::size_t>(num_folds + 1), 0);
  for (const int32_t f : fold) ++counts[static_cast<std::size_t>(f)];
  return counts;
}

FoldPool pool_folds(const std::vector<const SplitInfo*>& splits, const fs::path& dir) {
  if (splits.size() != kSplitNames.size()) throw InvalidArgument("pool_folds: expected the train, val and test splits");
  FoldPool pool;
  pool.dir = dir;
  for (std::size_t i = 0; i < splits.size(); ++i) {
    const SplitInfo& s = *splits[i];
    if (!s.has_folds() && s.files() > 0)
      throw FormatError("the dataset " + utf8::for_terminal(dir.string()) + " has no folds (" +
                        utf8::for_terminal(s.path.string()) + " holds no fold dataset): cross-validation needs " +
                        "each file's fold; build it with `melforge-build --folds K` (grouped, stratified folds), " +
                        "a manifest's fold column (--columns ...,fold=COL) or a `--layout` with folds (esc50, " +
                        "urbansound8k)");
    if (s.has_folds() && pool.num_folds != 0 && s.num_folds != pool.num_folds)
      throw FormatError(utf8::for_terminal(s.path.string()) + " declares folds = " + std::to_string(s.num_folds) +
                        " but another split of " + utf8::for_terminal(dir.string()) + " declares " +
                        std::to_string(pool.num_folds) + "; every split of a dataset comes from one build");
    if (s.has_folds()) pool.num_folds = s.num_folds;
    if (pool.build_id.empty()) pool.build_id = s.build_id;
    for (int64_t r = 0; r < s.files(); ++r) {
      const auto u = static_cast<std::size_t>(r);
      pool.split.push_back(static_cast<int>(i));
      pool.row.push_back(r);
      pool.fold.push_back(s.folds[u]);
      pool.label.push_back(s.labels[u]);
      pool.group.push_back(s.groups.empty() ? std::string() : s.groups[u]);
    }
  }
  if (pool.num_folds == 0)
    throw FormatError("the dataset " + utf8::for_terminal(dir.string()) + " has no files with folds; build it with " +
                      "`melforge-build --folds K` or a `--layout` with folds");
  return pool;
}

FoldPool read_fold_pool(const fs::path& dir) {
  std::vector<SplitInfo> infos;
  for (const auto& name : kSplitNames) infos.push_back(read_split_info(split_file(dir, name), name));
  return pool_folds({&infos[0], &infos[1], &infos[2]}, dir);
}

void CvOptions::validate() const {
  if (val != "fold-offset" && val != "ratio")
    throw InvalidArgument("--val '" + utf8::for_terminal(val, 80) + "': use fold-offset, ratio or ratio:R");
  if (val == "ratio" && !(val_ratio > 0 && val_ratio <= 0.5))
    throw InvalidArgument("--val ratio:" + std::to_string(val_ratio) + ": the share must be in (0, 0.5]");
  for (std::size_t i = 0; i < folds.size(); ++i)
    if (folds[i] < 1 || folds[i] > kMaxFolds || (i > 0 && folds[i] <= folds[i - 1]))
      throw InvalidArgument("--folds: fold numbers are in [1, " + std::to_string(kMaxFolds) +
                            "], listed once each");
}

std::string CvOptions::val_text() const {
  if (val != "ratio") return val;
  std::ostringstream s;
  s << "ratio:" << val_ratio;
  return s.str();
}

void parse_val_option(const std::string& text, CvOptions& options) {
  if (text == "fold-offset" || text == "ratio") {
    options.val = text;
    return;
  }
  if (text.rfind("ratio:", 0) == 0) {
    const std::string number = text.substr(6);
    std::size_t used = 0;
    double r = 0;
    try {
      r = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != number.size())
      throw InvalidArgument("--val '" + utf8::for_terminal(text, 80) + "': the share after ratio: is not a number");
    options.val = "ratio";
    options.val_ratio = r;
    options.validate();
    return;
  }
  throw InvalidArgument("--val '" + utf8::for_terminal(text, 80) + "': use fold-offset, ratio or ratio:R");
}

std::vector<int64_t> parse_fold_list(const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 1 || v > kMaxFolds)
      throw InvalidArgument("--folds '" + utf8::for_terminal(text, 80) + "': '" + utf8::for_terminal(item, 40) +
                            "' is not a fold number in [1, " + std::to_string(kMaxFolds) + "]");
    out.push_back(v);
  }
  if (out.empty()) throw InvalidArgument("--folds '" + utf8::for_terminal(text, 80) + "': no fold listed");
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw InvalidArgument("--folds '" + utf8::for_terminal(text, 80) + "': a fold is listed twice");
  return out;
}

namespace {

/// splitmix64: the group shuffle's generator (the same numbers on every platform, unlike std::shuffle).
uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The fold after `fold` (wrapping K -> 1) that holds files, skipping `fold` itself; 0 when there is none.
int64_t next_fold(const std::vector<int64_t>& counts, int64_t fold) {
  const auto k = static_cast<int64_t>(counts.size()) - 1;
  for (int64_t step = 1; step < k; ++step) {
    const int64_t f = (fold - 1 + step) % k + 1;
    if (counts[static_cast<std::size_t>(f)] > 0) return f;
  }
  return 0;
}

/// --val ratio: a share of `pool` indices `candidates` (the training folds), whole groups at a time, stratified by
/// the class of each group's first file, seeded by `seed` and `fold`. Returns a flag per pool index: taken as val.
std::vector<char> ratio_val(const FoldPool& pool, const std::vector<int64_t>& candidates, double ratio, uint64_t seed,
                            int64_t fold) {
  std::map<std::string, std::size_t> group_index;
  std::vector<std::vector<int64_t>> groups;
  std::vector<int64_t> group_class;
  for (const int64_t i : candidates) {
    const std::string& g = pool.group[static_cast<std::size_t>(i)];
    std::size_t gi = groups.size();
    if (!g.empty()) gi = group_index.emplace(g, groups.size()).first->second;
    if (gi == groups.size()) {
      groups.emplace_back();
      group_class.push_back(pool.label[static_cast<std::size_t>(i)]);
    }
    groups[gi].push_back(i);
  }
  std::map<int64_t, std::vector<std::size_t>> by_class;
  std::map<int64_t, int64_t> class_files;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    by_class[group_class[g]].push_back(g);
    class_files[group_class[g]] += static_cast<int64_t>(groups[g].size());
  }
  uint64_t state = seed ^ (static_cast<uint64_t>(fold) * 0xD1B54A32D192ED03ull);
  std::vector<char> taken(static_cast<std::size_t>(pool.size()), 0);
  std::vector<std::size_t> spare;
  int64_t total = 0;
  for (auto& [cls, list] : by_class) {
    for (std::size_t i = list.size(); i > 1; --i) std::swap(list[i - 1], list[splitmix(state) % i]);
    const auto target = static_cast<int64_t>(std::llround(ratio * static_cast<double>(class_files[cls])));
    int64_t got = 0;
    for (std::size_t j = 0; j + 1 < list.size() && got < target; ++j) {
      for (const int64_t i : groups[list[j]]) taken[static_cast<std::size_t>(i)] = 1;
      got += static_cast<int64_t>(groups[list[j]].size());
    }
    total += got;
    if (list.size() > 1 && spare.empty()) spare.push_back(list[0]);
  }
  if (total == 0 && !spare.empty())
    for (const int64_t i : groups[spare[0]]) taken[static_cast<std::size_t>(i)] = 1;
  return taken;
}

/// The folds to run: those named (checked to exist and hold files) or every fold that holds files.
std::vector<int64_t> test_folds(const FoldPool& pool, const CvOptions& options,
                                const std::vector<int64_t>& counts) {
  std::vector<int64_t> folds;
  for (const int64_t f : options.folds) {
    if (f > pool.num_folds || counts[static_cast<std::size_t>(f)] == 0)
      throw InvalidArgument("--folds: fold " + std::to_string(f) + " is not a fold of " +
                            utf8::for_terminal(pool.dir.string()) + " (it has folds 1 to " +
                            std::to_string(pool.num_folds) +
                            (f > pool.num_folds ? ")" : "; fold " + std::to_string(f) + " holds no file)"));
    folds.push_back(f);
  }
  if (options.folds.empty())
    for (int64_t f = 1; f <= pool.num_folds; ++f)
      if (counts[static_cast<std::size_t>(f)] > 0) folds.push_back(f);
  return folds;
}

}  // namespace

std::vector<CvFold> cv_splits(const FoldPool& pool, const CvOptions& options) {
  options.validate();
  const std::vector<int64_t> counts = pool.fold_counts();
  std::vector<CvFold> out;
  for (const int64_t f : test_folds(pool, options, counts)) {
    CvFold c;
    c.fold = f;
    std::vector<int64_t> rest;
    for (int64_t i = 0; i < pool.size(); ++i)
      (pool.fold[static_cast<std::size_t>(i)] == f ? c.test : rest).push_back(i);
    std::vector<char> is_val(static_cast<std::size_t>(pool.size()), 0);
    if (options.val == "fold-offset") {
      c.val_fold = next_fold(counts, f);
      for (const int64_t i : rest)
        is_val[static_cast<std::size_t>(i)] = pool.fold[static_cast<std::size_t>(i)] == c.val_fold;
    } else {
      is_val = ratio_val(pool, rest, options.val_ratio, options.seed, f);
    }
    for (const int64_t i : rest) (is_val[static_cast<std::size_t>(i)] ? c.val : c.train).push_back(i);
    if (c.train.empty() || c.val.empty())
      throw InvalidArgument("--val " + options.val_text() + ": test fold " + std::to_string(f) + " of " +
                            utf8::for_terminal(pool.dir.string()) + " leaves " +
                            (c.train.empty() ? "no training file" : "no validation file") + " (" +
                            std::to_string(rest.size()) + " files outside the test fold" +
                            (options.val == "fold-offset" ? "; try --val ratio" : "; groups too few or too large") +
                            ")");
    out.push_back(std::move(c));
  }
  return out;
}

nlohmann::json cv_fold_json(const FoldPool& pool, const CvFold& fold) {
  const auto members = [&](const std::vector<int64_t>& indices) {
    nlohmann::json list = nlohmann::json::array();
    for (const int64_t i : indices) {
      const auto u = static_cast<std::size_t>(i);
      list.push_back({kSplitNames[static_cast<std::size_t>(pool.split[u])], pool.row[u]});
    }
    return list;
  };
  nlohmann::json j = {{"fold", fold.fold}, {"train", members(fold.train)}, {"val", members(fold.val)},
                      {"test", members(fold.test)}};
  if (fold.val_fold > 0) j["val_fold"] = fold.val_fold;
  return j;
}

}  // namespace melforge::data
