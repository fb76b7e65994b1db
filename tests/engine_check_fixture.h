#pragma once
// What the engine check's tests share (test_engine_check.cpp on the CPU, test_engine_check_cuda.cpp on a GPU).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "build_fixture.h"

namespace melforge::test {

/// Checks that the builds in folders `a` and `b` wrote the same rows (paths, in order), the same clip layout and the
/// same frame values in every split.
inline void require_same_splits(const std::filesystem::path& a, const std::filesystem::path& b) {
  for (const std::string split : {"train", "val", "test"}) {
    INFO(split);
    const SplitData x = read_split(a / (split + ".h5"));
    const SplitData y = read_split(b / (split + ".h5"));
    REQUIRE(x.path == y.path);
    REQUIRE(x.clips.frame_offset == y.clips.frame_offset);
    REQUIRE(x.frames == y.frames);
  }
}

}  // namespace melforge::test
