#pragma once
/// Stratified, seeded, order-independent split assignment.
#include <cstdint>
#include <string>
#include <vector>

#include "scan.h"

namespace melforge::builder {

/// Assigns a split to every file whose split is -1. Within each class, the files still to assign are ordered by a
/// keyed hash of (seed, rel_path) and the first round(n*ratios[0]) go to train, the next round(n*ratios[1]) to val,
/// the rest to test. The result depends only on the set of (rel_path, label) pairs, the seed and the ratios: not on
/// the order of `files` nor on any thread count. Files that already have a split keep it.
void assign_splits(std::vector<InputFile>& files, const std::vector<double>& ratios, uint64_t seed);

/// The keyed hash used to order files: SplitMix64 over FNV-1a of `rel_path` mixed with `seed`.
uint64_t split_key(const std::string& rel_path, uint64_t seed);

}  // namespace melforge::builder
