#pragma once
// Cross-validation folds written into a built dataset, for the tests of data/protocol/cv_splits and melforge-train cv
// (issue 30). A stand-in for `melforge-build --folds K` until the builder writes the `fold` and `group` datasets:
// replace add_folds by that flag once it lands.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "melforge/common/h5.h"

namespace melforge::test {

/// Writes folds into `dir`'s train.h5, val.h5 and test.h5 (each file's split unchanged): the files of each class,
/// sorted by path, form groups of two consecutive files ("c<label>-g<j>"), and group j of a class goes to fold
/// j % k + 1; root attribute folds = k; the `group` dataset only with `groups`. Returns the fold of each path.
inline std::map<std::string, int32_t> add_folds(const std::filesystem::path& dir, int32_t k, bool groups = true) {
  struct Row {
    std::string path;
    int32_t label;
    std::size_t split, row;
  };
  const std::vector<std::string> splits = {"train", "val", "test"};
  std::vector<Row> rows;
  std::vector<std::size_t> sizes;
  for (std::size_t s = 0; s < splits.size(); ++s) {
    const auto file = h5::open_file(dir / (splits[s] + ".h5"));
    const auto labels = h5::read_int32(file, "label");
    const auto paths = h5::read_strings(file, "path");
    for (std::size_t r = 0; r < paths.size(); ++r) rows.push_back({paths[r], labels[r], s, r});
    sizes.push_back(paths.size());
  }
  std::sort(rows.begin(), rows.end(),
            [](const Row& a, const Row& b) { return std::tie(a.label, a.path) < std::tie(b.label, b.path); });
  std::vector<std::vector<int32_t>> folds(splits.size());
  std::vector<std::vector<std::string>> group_names(splits.size());
  for (std::size_t s = 0; s < splits.size(); ++s) {
    folds[s].resize(sizes[s]);
    group_names[s].resize(sizes[s]);
  }
  std::map<std::string, int32_t> by_path;
  for (std::size_t i = 0, j = 0; i < rows.size(); ++i, ++j) {
    if (i > 0 && rows[i].label != rows[i - 1].label) j = 0;
    const auto group = static_cast<int32_t>(j / 2);
    folds[rows[i].split][rows[i].row] = group % k + 1;
    group_names[rows[i].split][rows[i].row] = "c" + std::to_string(rows[i].label) + "-g" + std::to_string(group);
    by_path[rows[i].path] = group % k + 1;
  }
  for (std::size_t s = 0; s < splits.size(); ++s) {
    const auto file = h5::open_file(dir / (splits[s] + ".h5"), /*writable=*/true);
    h5::write_int32(file, "fold", folds[s]);
    if (groups) h5::write_strings(file, "group", group_names[s]);
    h5::write_attribute_int64(file, "folds", k);
  }
  return by_path;
}

}  // namespace melforge::test
