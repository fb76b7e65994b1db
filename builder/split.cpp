#include "split.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <istream>
#include <map>
#include <ostream>

#include "build_options.h"
#include "melforge/common/errors.h"
#include "melforge/common/flags.h"
#include "melforge/common/splitmix.h"

namespace melforge::builder {

namespace {

/// The files of one class, and the splits its files were given.
struct ClassFiles {
  /// Every file of the class.
  std::vector<InputFile*> files;
  /// [split]: the given file of that split with the smallest rel_path (to name it), or nullptr.
  std::array<const InputFile*, 3> given{};
};

/// Throws InvalidArgument for a class whose files were given two different splits.
void require_one_given_split(const std::string& label, const ClassFiles& c) {
  std::vector<std::size_t> splits;
  for (std::size_t s = 0; s < 3; ++s)
    if (c.given[s] != nullptr) splits.push_back(s);
  if (splits.size() < 2) return;
  const InputFile& a = *c.given[splits[0]];
  const InputFile& b = *c.given[splits[1]];
  throw InvalidArgument("--split-by class: class '" + label + "' is in two splits: " + kSplitNames[splits[0]] +
                        " (" + a.rel_path + ") and " + kSplitNames[splits[1]] + " (" + b.rel_path +
                        "); each class must lie in one split (use --split-by file, or move its files)");
}

/// The files of `files` grouped by class, with their given splits checked.
std::map<std::string, ClassFiles> group_classes(std::vector<InputFile>& files) {
  std::map<std::string, ClassFiles> classes;
  for (auto& f : files) {
    if (f.labels.size() > 1)
      throw InvalidArgument("--split-by class: " + f.rel_path + " has several labels; a class split needs one "
                            "label per file (use --split-by file)");
    ClassFiles& c = classes[f.label];
    c.files.push_back(&f);
    if (f.split < 0) continue;
    const InputFile*& g = c.given[static_cast<std::size_t>(f.split)];
    if (g == nullptr || f.rel_path < g->rel_path) g = &f;
  }
  for (const auto& [label, c] : classes) require_one_given_split(label, c);
  return classes;
}

/// Sets the split of every file of `c` to `split`.
void put_class(ClassFiles& c, int split) {
  for (InputFile* f : c.files) f->split = split;
}

/// Split of the i-th class of a draw's order, for split sizes k0 (train) and k1 (val).
int split_of_rank(std::size_t i, int64_t k0, int64_t k1) {
  const auto r = static_cast<int64_t>(i);
  return r < k0 ? 0 : (r < k0 + k1 ? 1 : 2);
}

/// The order of `free` (class name, file count) in draw `draw`.
std::vector<std::size_t> draw_order(const std::vector<std::pair<std::string, int64_t>>& free, uint64_t seed,
                                    int draw) {
  std::vector<std::pair<uint64_t, std::size_t>> keyed;
  for (std::size_t i = 0; i < free.size(); ++i) keyed.emplace_back(class_split_key(free[i].first, seed, draw), i);
  std::sort(keyed.begin(), keyed.end(), [&free](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : free[a.second].first < free[b.second].first;
  });
  std::vector<std::size_t> order;
  for (const auto& k : keyed) order.push_back(k.second);
  return order;
}

}  // namespace

std::string to_string(SplitBy by) { return by == SplitBy::file ? "file" : "class"; }

SplitBy parse_split_by(const std::string& text) {
  const std::string lower = ascii_lower(text);
  if (lower == "file") return SplitBy::file;
  if (lower == "class") return SplitBy::class_;
  throw InvalidArgument("--split-by: '" + text + "' is not one of file, class");
}

std::istream& operator>>(std::istream& in, SplitBy& by) {
  std::string token;
  if (in >> token) by = parse_split_by(token);
  return in;
}

std::ostream& operator<<(std::ostream& out, SplitBy by) { return out << to_string(by); }

uint64_t split_key(const std::string& rel_path, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : rel_path) {
    h ^= c;
    h *= 0x100000001B3ULL;
  }
  return splitmix64(h ^ splitmix64(seed));
}

uint64_t class_split_key(const std::string& class_name, uint64_t seed, int draw) {
  return split_key(class_name, splitmix64(seed) + static_cast<uint64_t>(draw));
}

void assign_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed, SplitBy by) {
  if (by == SplitBy::class_) {
    assign_class_splits(files, ratios, seed);
    return;
  }
  std::map<std::string, std::vector<InputFile*>> by_class;
  for (auto& f : files)
    if (f.split < 0) by_class[f.label].push_back(&f);
  for (auto& [label, members] : by_class) {
    std::sort(members.begin(), members.end(), [seed](const InputFile* a, const InputFile* b) {
      const uint64_t ka = split_key(a->rel_path, seed);
      const uint64_t kb = split_key(b->rel_path, seed);
      return ka != kb ? ka < kb : a->rel_path < b->rel_path;
    });
    const auto n = static_cast<int64_t>(members.size());
    const int64_t n_train = std::min<int64_t>(n, std::llround(static_cast<double>(n) * ratios[0]));
    const int64_t n_val = std::min<int64_t>(n - n_train, std::llround(static_cast<double>(n) * ratios[1]));
    for (int64_t i = 0; i < n; ++i) members[i]->split = i < n_train ? 0 : (i < n_train + n_val ? 1 : 2);
  }
}

void assign_class_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed) {
  std::map<std::string, ClassFiles> classes = group_classes(files);
  std::vector<std::pair<std::string, int64_t>> free;
  int64_t free_files = 0;
  for (auto& [label, c] : classes) {
    const auto given = std::find_if(c.given.begin(), c.given.end(), [](const InputFile* g) { return g != nullptr; });
    if (given != c.given.end()) {
      put_class(c, static_cast<int>(given - c.given.begin()));
      continue;
    }
    free.emplace_back(label, static_cast<int64_t>(c.files.size()));
    free_files += static_cast<int64_t>(c.files.size());
  }
  const auto n = static_cast<int64_t>(free.size());
  const int64_t k0 = std::min<int64_t>(n, std::llround(static_cast<double>(n) * ratios[0]));
  const int64_t k1 = std::min<int64_t>(n - k0, std::llround(static_cast<double>(n) * ratios[1]));
  std::vector<std::size_t> best;
  double best_cost = 0;
  for (int d = 0; d < kClassSplitDraws; ++d) {
    std::vector<std::size_t> order = draw_order(free, seed, d);
    std::array<int64_t, 3> per_split{};
    for (std::size_t i = 0; i < order.size(); ++i)
      per_split[static_cast<std::size_t>(split_of_rank(i, k0, k1))] += free[order[i]].second;
    double cost = 0;
    for (std::size_t s = 0; s < 3; ++s)
      cost += std::fabs(static_cast<double>(per_split[s]) - static_cast<double>(free_files) * ratios[s]);
    if (d == 0 || cost < best_cost) {
      best = std::move(order);
      best_cost = cost;
    }
  }
  for (std::size_t i = 0; i < best.size(); ++i) put_class(classes.at(free[best[i]].first), split_of_rank(i, k0, k1));
}

}  // namespace melforge::builder
