// Folds on the reading side and cross-validation membership (issue 30, data/protocol/cv_splits): the optional
// `fold`/`group` datasets and `folds` attribute read as untrusted, the three splits pooled and re-partitioned per
// test fold (fold-offset and grouped ratio val), and the refusals before any work.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "build_fixture.h"
#include "fold_fixture.h"
#include "melforge/common/errors.h"
#include "melforge/common/h5.h"
#include "pipeline.h"
#include "protocol/cv_splits.h"
#include "test_util.h"

namespace melforge_test_cv_splits {

using namespace melforge;
using melforge::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A tone dataset of 3 classes x 10 files (+ a stereo file each: 33 files) with 5 folds written by add_folds.
fs::path folded_dataset(const TempDir& tmp, bool groups = true) {
  test::write_tone_corpus(tmp / "in", 3, 10);
  builder::run_build(test::tone_build_config(tmp / "in", tmp / "data"));
  test::add_folds(tmp / "data", 5, groups);
  return tmp / "data";
}

/// Every pool index exactly once over train, val and test, and the three disjoint.
void require_partition(const data::FoldPool& pool, const data::CvFold& f) {
  std::vector<int> seen(static_cast<std::size_t>(pool.size()), 0);
  for (const auto* part : {&f.train, &f.val, &f.test})
    for (const int64_t i : *part) ++seen[static_cast<std::size_t>(i)];
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

/// The groups (unique per file when empty) of the pool indices `part`.
std::set<std::string> groups_of(const data::FoldPool& pool, const std::vector<int64_t>& part) {
  std::set<std::string> out;
  for (const int64_t i : part) {
    const auto& g = pool.group[static_cast<std::size_t>(i)];
    out.insert(g.empty() ? "#" + std::to_string(i) : g);
  }
  return out;
}

/// A pool of `files` files in memory: random folds in [1, k], labels in [0, classes) and groups drawn from
/// `groups` names (a group keeps one fold and one class, as a build gives it); some files without a group.
data::FoldPool random_pool(uint64_t seed, int64_t files, int32_t k, int classes, int groups) {
  std::mt19937_64 rng(seed);
  data::FoldPool pool;
  pool.num_folds = k;
  std::vector<int32_t> group_fold(static_cast<std::size_t>(groups));
  std::vector<int64_t> group_label(static_cast<std::size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    group_fold[static_cast<std::size_t>(g)] = static_cast<int32_t>(rng() % static_cast<uint64_t>(k)) + 1;
    group_label[static_cast<std::size_t>(g)] = static_cast<int64_t>(rng() % static_cast<uint64_t>(classes));
  }
  for (int64_t i = 0; i < files; ++i) {
    const auto g = static_cast<std::size_t>(rng() % static_cast<uint64_t>(groups));
    const bool alone = rng() % 5 == 0;
    pool.split.push_back(static_cast<int>(i % 3));
    pool.row.push_back(i / 3);
    pool.fold.push_back(alone ? static_cast<int32_t>(rng() % static_cast<uint64_t>(k)) + 1 : group_fold[g]);
    pool.label.push_back(alone ? static_cast<int64_t>(rng() % static_cast<uint64_t>(classes)) : group_label[g]);
    pool.group.push_back(alone ? "" : "g" + std::to_string(g));
  }
  return pool;
}

}  // namespace

TEST_CASE("folds and groups are read from each split and pooled across the three", "[cv]") {
  TempDir tmp;
  const fs::path dir = folded_dataset(tmp);
  const auto info = data::read_split_info(dir / "train.h5", "train");
  CHECK(info.num_folds == 5);
  REQUIRE(info.folds.size() == static_cast<std::size_t>(info.files()));
  REQUIRE(info.groups.size() == static_cast<std::size_t>(info.files()));
  const data::FoldPool pool = data::read_fold_pool(dir);
  CHECK(pool.size() == 33);
  CHECK(pool.num_folds == 5);
  const auto counts = pool.fold_counts();
  for (int f = 1; f <= 5; ++f) CHECK(counts[static_cast<std::size_t>(f)] >= 6);
  std::set<int> splits(pool.split.begin(), pool.split.end());
  CHECK(splits == std::set<int>{0, 1, 2});
}

TEST_CASE("fold-offset: test is fold f, val the next fold (K wraps to 1), train the rest", "[cv]") {
  TempDir tmp;
  const data::FoldPool pool = data::read_fold_pool(folded_dataset(tmp));
  const auto folds = data::cv_splits(pool, {});
  REQUIRE(folds.size() == 5);
  for (const auto& f : folds) {
    INFO("fold " << f.fold);
    CHECK(f.val_fold == f.fold % 5 + 1);
    require_partition(pool, f);
    for (const int64_t i : f.test) CHECK(pool.fold[static_cast<std::size_t>(i)] == f.fold);
    for (const int64_t i : f.val) CHECK(pool.fold[static_cast<std::size_t>(i)] == f.val_fold);
    for (const int64_t i : f.train) {
      CHECK(pool.fold[static_cast<std::size_t>(i)] != f.fold);
      CHECK(pool.fold[static_cast<std::size_t>(i)] != f.val_fold);
    }
  }
  data::CvOptions some;
  some.folds = data::parse_fold_list("4,2");
  const auto two = data::cv_splits(pool, some);
  REQUIRE(two.size() == 2);
  CHECK(two[0].fold == 2);
  CHECK(two[1].fold == 4);
  CHECK(two[1].test == folds[3].test);
  const auto j = data::cv_fold_json(pool, folds[0]);
  CHECK(j["test"].size() == folds[0].test.size());
  CHECK(j["test"][0][0].is_string());
}

TEST_CASE("ratio val: whole groups of the training folds, stratified, seeded, never the test fold", "[cv]") {
  const bool groups = GENERATE(true, false);
  TempDir tmp;
  const data::FoldPool pool = data::read_fold_pool(folded_dataset(tmp, groups));
  data::CvOptions o;
  data::parse_val_option(GENERATE(std::string("ratio"), std::string("ratio:0.25")), o);
  const auto folds = data::cv_splits(pool, o);
  REQUIRE(folds.size() == 5);
  for (const auto& f : folds) {
    INFO("fold " << f.fold << ", groups " << groups);
    require_partition(pool, f);
    CHECK(f.val_fold == 0);
    CHECK_FALSE(f.val.empty());
    for (const int64_t i : f.val) CHECK(pool.fold[static_cast<std::size_t>(i)] != f.fold);
    const auto val_groups = groups_of(pool, f.val), train_groups = groups_of(pool, f.train);
    for (const auto& g : val_groups) CHECK(train_groups.count(g) == 0);
    std::set<int64_t> val_classes;
    for (const int64_t i : f.val) val_classes.insert(pool.label[static_cast<std::size_t>(i)]);
    CHECK(val_classes.size() == 3);
  }
  CHECK(data::cv_splits(pool, o)[2].val == folds[2].val);
  o.seed = 7;
  bool differs = false;
  for (std::size_t f = 0; f < folds.size(); ++f) differs |= data::cv_splits(pool, o)[f].val != folds[f].val;
  CHECK(differs);
}

TEST_CASE("ratio val never puts one group in two splits (random groupings)", "[cv]") {
  const uint64_t seed = GENERATE(range(1, 41));
  std::mt19937_64 rng(seed);
  const auto files = static_cast<int64_t>(40 + rng() % 200);
  const auto k = static_cast<int32_t>(2 + rng() % 9);
  const auto pool = random_pool(seed, files, k, 1 + static_cast<int>(rng() % 6), 3 + static_cast<int>(rng() % 60));
  data::CvOptions o;
  o.val = "ratio";
  o.val_ratio = 0.05 + static_cast<double>(rng() % 40) / 100.0;
  o.seed = seed;
  INFO("seed " << seed << ", files " << files << ", k " << k << ", ratio " << o.val_ratio);
  std::vector<data::CvFold> folds;
  try {
    folds = data::cv_splits(pool, o);
  } catch (const InvalidArgument& e) {
    // Too few groups outside a test fold for a val share: refused, naming --val.
    CHECK(std::string(e.what()).find("--val") != std::string::npos);
    return;
  }
  for (const auto& f : folds) {
    require_partition(pool, f);
    const auto val_groups = groups_of(pool, f.val), train_groups = groups_of(pool, f.train);
    for (const auto& g : val_groups) CHECK(train_groups.count(g) == 0);
  }
}

TEST_CASE("a dataset without folds is refused, naming melforge-build --folds K and --layout", "[cv]") {
  TempDir tmp;
  test::write_tone_corpus(tmp / "in", 2, 3);
  builder::run_build(test::tone_build_config(tmp / "in", tmp / "data"));
  try {
    data::read_fold_pool(tmp / "data");
    FAIL("no error");
  } catch (const FormatError& e) {
    const std::string what = e.what();
    CHECK(what.find("melforge-build --folds K") != std::string::npos);
    CHECK(what.find("--layout") != std::string::npos);
  }
}

TEST_CASE("cv's --folds and --val are checked before any work", "[cv]") {
  const std::string bad_list = GENERATE(std::string(""), std::string("1,x"), std::string("0"), std::string("2,2"),
                                        std::string("1001"), std::string("1,,2"));
  INFO(bad_list);
  CHECK_THROWS_AS(data::parse_fold_list(bad_list), InvalidArgument);
  data::CvOptions o;
  for (const std::string bad : {"ratio:0.7", "ratio:0", "ratio:x", "fold", "ratio:0.1x"})
    CHECK_THROWS_AS(data::parse_val_option(bad, o), InvalidArgument);
  data::FoldPool pool;
  pool.dir = "DS";
  pool.num_folds = 5;
  for (int64_t i = 0; i < 30; ++i) {
    pool.split.push_back(0);
    pool.row.push_back(i);
    pool.fold.push_back(static_cast<int32_t>(i % 5) + 1);
    pool.label.push_back(i % 2);
    pool.group.emplace_back();
  }
  o = {};
  o.folds = {6};
  CHECK_THROWS_WITH(data::cv_splits(pool, o), Catch::Contains("--folds: fold 6 is not a fold of DS"));
  for (auto& f : pool.fold) f = f == 3 ? 4 : f;
  o.folds = {3};
  CHECK_THROWS_WITH(data::cv_splits(pool, o), Catch::Contains("fold 3 holds no file"));
  o.folds = {};
  const auto merged = data::cv_splits(pool, o);
  const auto two = std::find_if(merged.begin(), merged.end(), [](const data::CvFold& f) { return f.fold == 2; });
  REQUIRE(two != merged.end());
  CHECK(two->val_fold == 4);
  for (auto& f : pool.fold) f = f == 1 ? 1 : 2;
  pool.num_folds = 2;
  CHECK_THROWS_WITH(data::cv_splits(pool, o), Catch::Contains("leaves no training file"));
}

TEST_CASE("untrusted folds: out of range, a bad K, one without the other, K differing between splits", "[cv]") {
  TempDir tmp;
  const fs::path dir = folded_dataset(tmp);
  const std::string which = GENERATE(std::string("fold 0"), std::string("fold K+1"), std::string("K 1"),
                                     std::string("K 1001"), std::string("no attribute"), std::string("no dataset"),
                                     std::string("K differs"), std::string("group length"), std::string("fold float"));
  INFO(which);
  {
    const auto file = h5::open_file(dir / "val.h5", /*writable=*/true);
    auto folds = h5::read_int32(file, "fold");
    const auto rewrite = [&](const std::vector<int32_t>& v) {
      H5Ldelete(file.id(), "fold", H5P_DEFAULT);
      h5::write_int32(file, "fold", v);
    };
    if (which == "fold 0") folds[0] = 0, rewrite(folds);
    if (which == "fold K+1") folds[0] = 6, rewrite(folds);
    const auto set_k = [&](int64_t k) {
      H5Adelete(file.id(), "folds");
      h5::write_attribute_int64(file, "folds", k);
    };
    if (which == "K 1") set_k(1);
    if (which == "K 1001") set_k(1001);
    if (which == "no attribute") H5Adelete(file.id(), "folds");
    if (which == "no dataset") H5Ldelete(file.id(), "fold", H5P_DEFAULT);
    if (which == "K differs") set_k(6);
    if (which == "group length") {
      H5Ldelete(file.id(), "group", H5P_DEFAULT);
      h5::write_strings(file, "group", {"a"});
    }
    if (which == "fold float") {
      H5Ldelete(file.id(), "fold", H5P_DEFAULT);
      h5::write_float32(file, "fold", std::vector<float>(folds.size(), 1.0f));
    }
  }
  try {
    data::read_fold_pool(dir);
    FAIL("no error");
  } catch (const FormatError& e) {
    const std::string what = e.what();
    CHECK(what.find("val.h5") != std::string::npos);
    CHECK(what.find(which.rfind("group", 0) == 0 ? "group" : "fold") != std::string::npos);
  }
}

}  // namespace melforge_test_cv_splits
