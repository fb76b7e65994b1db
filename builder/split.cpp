#include "split.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "melforge/common/splitmix.h"

namespace melforge::builder {

uint64_t split_key(const std::string& rel_path, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : rel_path) {
    h ^= c;
    h *= 0x100000001B3ULL;
  }
  return splitmix64(h ^ splitmix64(seed));
}

void assign_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed) {
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

}  // namespace melforge::builder
