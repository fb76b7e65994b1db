#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "split.h"

using namespace melforge::builder;

namespace {

std::vector<InputFile> corpus(int classes, int per_class) {
  std::vector<InputFile> files;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < per_class + c; ++i)
      files.push_back({{}, "c" + std::to_string(c) + "/f" + std::to_string(i) + ".wav", "c" + std::to_string(c), -1});
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
  auto files = corpus(3, 100);
  assign_splits(files, {0.8, 0.1, 0.1}, 7);
  std::map<std::string, std::array<int, 3>> counts;
  for (const auto& f : files) counts[f.label][f.split]++;
  for (const auto& [label, c] : counts) {
    const int n = c[0] + c[1] + c[2];
    CHECK(c[0] == static_cast<int>(std::llround(n * 0.8)));
    CHECK(c[1] == static_cast<int>(std::llround(n * 0.1)));
    CHECK(c[2] == n - c[0] - c[1]);
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
