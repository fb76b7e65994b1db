#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "split.h"

namespace melforge_test_split {

using namespace melforge::builder;

namespace {

std::vector<InputFile> corpus(int classes, int per_class) {
  std::vector<InputFile> files;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < per_class + c; ++i)
      files.push_back({{}, "c" + std::to_string(c) + "/f" + std::to_string(i) + ".wav", "c" + std::to_string(c), -1, {},
                       0, {}});
  return files;
}

std::map<std::string, int> assignment(const std::vector<InputFile>& files) {
  std::map<std::string, int> m;
  for (const auto& f : files) m[f.rel_path] = f.split;
  return m;
}

}  // namespace

TEST_CASE("split assignment does not depend on file order", "[split]") {
  const uint64_t seed = GENERATE(0u, 1u, 12345u);
  auto files = corpus(4, 50);
  auto shuffled = files;
  std::mt19937 rng(static_cast<unsigned>(seed) + 99);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::reverse(files.begin(), files.end());
  assign_splits(files, {0.8, 0.1, 0.1}, seed);
  assign_splits(shuffled, {0.8, 0.1, 0.1}, seed);
  CHECK(assignment(files) == assignment(shuffled));
}

TEST_CASE("splits are stratified by class with the requested ratios", "[split]") {
  // Ratios as exact fractions num/den, so that the expected counts come from integer arithmetic: round(n*num/den)
  // half away from zero is (2*n*num + den) / (2*den). Binary fractions make n*ratio exact in double, halves included.
  struct Ratios {
    int64_t train, val, den;
  };
  const Ratios r = GENERATE(Ratios{4, 1, 5}, Ratios{3, 1, 4}, Ratios{1, 1, 2}, Ratios{5, 3, 8}, Ratios{1, 1, 4});
  const int classes = GENERATE(1, 3);
  const int per_class = GENERATE(1, 2, 7, 100);
  const int presplit_every = GENERATE(0, 5);
  const uint64_t seed = GENERATE(7u, 8u);
  CAPTURE(r.train, r.val, r.den, classes, per_class, presplit_every, seed);
  const auto rounded = [&r](int64_t n, int64_t num) { return (2 * n * num + r.den) / (2 * r.den); };

  auto files = corpus(classes, per_class);
  std::map<std::string, int64_t> to_assign;
  std::map<std::string, int> presplit;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (presplit_every > 0 && i % presplit_every == 0) {
      files[i].split = static_cast<int>(i % 3);
      presplit[files[i].rel_path] = files[i].split;
    } else {
      ++to_assign[files[i].label];
    }
  }
  const auto before = files;
  const double den = static_cast<double>(r.den);
  assign_splits(files, {r.train / den, r.val / den, (r.den - r.train - r.val) / den}, seed);

  REQUIRE(files.size() == before.size());
  std::map<std::string, std::array<int64_t, 3>> counts;
  std::map<std::string, std::array<std::vector<uint64_t>, 3>> keys;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    CAPTURE(f.rel_path);
    REQUIRE(f.rel_path == before[i].rel_path);
    REQUIRE(f.label == before[i].label);
    REQUIRE((f.split == 0 || f.split == 1 || f.split == 2));
    if (presplit.count(f.rel_path) != 0) {
      CHECK(f.split == presplit.at(f.rel_path));
      continue;
    }
    counts[f.label][f.split]++;
    keys[f.label][f.split].push_back(split_key(f.rel_path, seed));
  }
  for (const auto& [label, n] : to_assign) {
    CAPTURE(label, n);
    const int64_t train = std::min(n, rounded(n, r.train));
    const int64_t val = std::min(n - train, rounded(n, r.val));
    const auto& c = counts[label];
    CHECK(c[0] == train);
    CHECK(c[1] == val);
    CHECK(c[2] == n - train - val);
    // Documented order: train takes the smallest keyed hashes, then val, then test.
    const auto& k = keys[label];
    for (int a = 0; a < 2; ++a) {
      for (int b = a + 1; b < 3; ++b) {
        if (!k[a].empty() && !k[b].empty()) CHECK(*std::max_element(k[a].begin(), k[a].end()) <
                                                  *std::min_element(k[b].begin(), k[b].end()));
      }
    }
  }
}

TEST_CASE("different seeds give different assignments, and presplit files keep theirs", "[split]") {
  auto a = corpus(2, 40);
  auto b = a;
  a[0].split = 2;
  b[0].split = 2;
  assign_splits(a, {0.5, 0.25, 0.25}, 1);
  assign_splits(b, {0.5, 0.25, 0.25}, 2);
  CHECK(a[0].split == 2);
  CHECK(b[0].split == 2);
  CHECK(assignment(a) != assignment(b));
}

TEST_CASE("two ratios leave test empty", "[split]") {
  auto files = corpus(2, 10);
  assign_splits(files, {0.5, 0.5, 0.0}, 3);
  for (const auto& f : files) CHECK(f.split != 2);
}

}  // namespace melforge_test_split
