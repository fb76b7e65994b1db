#include "split.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <istream>
#include <map>
#include <set>
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

/// Every label of `f` (its labels, or its one label).
std::vector<std::string> labels_of(const InputFile& f) {
  return f.labels.empty() ? std::vector<std::string>{f.label} : f.labels;
}

/// The files of one group (or one file without a group), for grouped assignment.
struct Unit {
  /// "g" + group, or "f" + rel_path for a file without a group.
  std::string key;
  /// Its files.
  std::vector<InputFile*> files;
  /// Files per class, every label counted.
  std::map<std::string, int64_t> classes;
  /// The lowest split or fold given to one of its files; `none` when none was.
  int given = 0;
};

/// The units of `files`; `given` reads a file's given bin (`none` when not given).
std::vector<Unit> make_units(std::vector<InputFile>& files, int InputFile::*given, int none) {
  std::map<std::string, Unit> units;
  for (auto& f : files) {
    const std::string key = f.group.empty() ? "f" + f.rel_path : "g" + f.group;
    Unit& u = units.try_emplace(key, Unit{key, {}, {}, none}).first->second;
    u.files.push_back(&f);
    for (const auto& l : labels_of(f)) ++u.classes[l];
    if (f.*given != none && (u.given == none || f.*given < u.given)) u.given = f.*given;
  }
  std::vector<Unit> out;
  for (auto& [key, u] : units) out.push_back(std::move(u));
  return out;
}

/// Bins of a grouped assignment (splits or folds) and what they hold so far.
struct Bins {
  /// Share of each bin (ratios; 1/K for folds); a bin of weight 0 gets nothing.
  std::vector<double> weights;
  /// [bin] class -> files put there (given ones too, for folds).
  std::vector<std::map<std::string, double>> count;
  /// [bin] files put there.
  std::vector<double> files;
  /// Class -> files to place (the denominators T_c).
  std::map<std::string, double> total;
  /// Files to place.
  double all = 0;

  /// Counts `u` into bin `b`.
  void add(const Unit& u, std::size_t b) {
    for (const auto& [c, n] : u.classes) count[b][c] += static_cast<double>(n);
    files[b] += static_cast<double>(u.files.size());
  }
  /// The bin `u` goes to: lowest weighted fill of its classes, then lowest overall fill, then lowest index.
  std::size_t choose(const Unit& u) const {
    std::size_t best = weights.size();
    std::pair<double, double> best_score{0, 0};
    for (std::size_t b = 0; b < weights.size(); ++b) {
      if (!(weights[b] > 0)) continue;
      double fill = 0;
      for (const auto& [c, n] : u.classes) {
        const auto it = count[b].find(c);
        const double have = it == count[b].end() ? 0.0 : it->second;
        fill += static_cast<double>(n) * (have + 0.5 * static_cast<double>(n)) / (weights[b] * total.at(c));
      }
      const double overall = (files[b] + 0.5 * static_cast<double>(u.files.size())) / (weights[b] * all);
      const std::pair<double, double> score{fill, overall};
      if (best == weights.size() || score < best_score) {
        best = b;
        best_score = score;
      }
    }
    return best;
  }
};

/// `units` in the order of a grouped assignment: largest first, then split_key(key, seed), then key.
void order_units(std::vector<Unit*>& units, uint64_t seed) {
  std::vector<std::pair<uint64_t, Unit*>> keyed;
  for (Unit* u : units) keyed.emplace_back(split_key(u->key, seed), u);
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    if (a.second->files.size() != b.second->files.size()) return a.second->files.size() > b.second->files.size();
    return a.first != b.first ? a.first < b.first : a.second->key < b.second->key;
  });
  for (std::size_t i = 0; i < keyed.size(); ++i) units[i] = keyed[i].second;
}

/// Fills `bins` with the `free` units in order_units order; `put` records unit -> bin.
void fill_bins(std::vector<Unit*>& free, Bins& bins, uint64_t seed,
               const std::function<void(Unit&, std::size_t)>& put) {
  for (Unit* u : free) {
    for (const auto& [c, n] : u->classes) bins.total[c] += static_cast<double>(n);
    bins.all += static_cast<double>(u->files.size());
  }
  order_units(free, seed);
  for (Unit* u : free) {
    const std::size_t b = bins.choose(*u);
    bins.add(*u, b);
    put(*u, b);
  }
}

/// Adds a leak warning of `kind` (split, fold) for the group of `files` (one file per bin, by bin) to `out`.
void leak_warnings(const std::map<std::string, std::map<int, const InputFile*>>& bins, const std::string& kind,
                   const std::function<std::string(int)>& name, std::size_t max_warnings,
                   std::vector<std::string>& out) {
  std::size_t found = 0;
  for (const auto& [group, per_bin] : bins) {
    if (per_bin.size() < 2) continue;
    if (++found > max_warnings) continue;
    std::string where;
    for (const auto& [bin, file] : per_bin)
      where += (where.empty() ? "" : ", ") + name(bin) + " (" + file->rel_path + ")";
    out.push_back("group '" + group + "' lies in " + std::to_string(per_bin.size()) + " " + kind + "s: " + where +
                  ": its files leak across " + kind + "s");
  }
  if (found > max_warnings)
    out.push_back(std::to_string(found - max_warnings) + " more groups lie in several " + kind + "s");
}

}  // namespace

void assign_group_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed) {
  std::vector<Unit> units = make_units(files, &InputFile::split, -1);
  std::vector<Unit*> free;
  for (Unit& u : units) {
    if (u.given < 0) free.push_back(&u);
    else
      for (InputFile* f : u.files)
        if (f->split < 0) f->split = u.given;
  }
  Bins bins{ratios, std::vector<std::map<std::string, double>>(3), std::vector<double>(3, 0.0), {}, 0};
  fill_bins(free, bins, seed, [](Unit& u, std::size_t b) {
    for (InputFile* f : u.files) f->split = static_cast<int>(b);
  });
}

void assign_folds(std::vector<InputFile>& files, int folds, uint64_t seed) {
  for (const auto& f : files)
    if (f.fold > folds)
      throw InvalidArgument("--folds " + std::to_string(folds) + ": " + f.rel_path + " already has fold " +
                            std::to_string(f.fold) + "; give --folds at least the largest fold of the corpus");
  std::vector<Unit> units = make_units(files, &InputFile::fold, 0);
  const auto k = static_cast<std::size_t>(folds);
  Bins bins{std::vector<double>(k, 1.0 / folds), std::vector<std::map<std::string, double>>(k),
            std::vector<double>(k, 0.0), {}, 0};
  std::vector<Unit*> free;
  for (Unit& u : units) {
    if (u.given == 0) {
      free.push_back(&u);
      continue;
    }
    for (InputFile* f : u.files)
      if (f->fold == 0) f->fold = u.given;
    bins.add(u, static_cast<std::size_t>(u.given - 1));
    for (const auto& [c, n] : u.classes) bins.total[c] += static_cast<double>(n);
    bins.all += static_cast<double>(u.files.size());
  }
  fill_bins(free, bins, seed, [](Unit& u, std::size_t b) {
    for (InputFile* f : u.files) f->fold = static_cast<int>(b) + 1;
  });
}

int64_t splits_from_folds(std::vector<InputFile>& files, int folds) {
  int64_t n = 0;
  for (auto& f : files) {
    if (f.fold <= 0 || f.split >= 0) continue;
    f.split = f.fold == folds ? 2 : (f.fold == folds - 1 && folds > 2 ? 1 : 0);
    ++n;
  }
  return n;
}

std::vector<std::string> group_leaks(const std::vector<InputFile>& files, std::size_t max_warnings) {
  std::map<std::string, std::map<int, const InputFile*>> splits, folds;
  for (const auto& f : files) {
    if (f.group.empty()) continue;
    if (f.split >= 0) splits[f.group].emplace(f.split, &f);
    if (f.fold > 0) folds[f.group].emplace(f.fold, &f);
  }
  std::vector<std::string> out;
  leak_warnings(splits, "split", [](int s) { return kSplitNames[static_cast<std::size_t>(s)]; }, max_warnings, out);
  leak_warnings(folds, "fold", [](int k) { return "fold " + std::to_string(k); }, max_warnings, out);
  return out;
}

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
  if (std::any_of(files.begin(), files.end(), [](const InputFile& f) { return !f.group.empty(); })) {
    assign_group_splits(files, ratios, seed);
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
