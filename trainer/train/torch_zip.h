#pragma once
/// The zip layer of a torch.save archive (a checkpoint, an export), without LibTorch: the central directory (zip64
/// included) and every entry's CRC-32, each read bounded by the bytes given. Separate from train/checkpoint.cpp so
/// that the libFuzzer target tests/fuzz/fuzz_checkpoint.cpp can run it without LibTorch.
#include <filesystem>
#include <string>

namespace melforge::trainer {

/// Checks the CRC-32 of every entry of the zip archive `bytes` (a torch archive: its entries are stored, not
/// compressed). Throws FormatError naming `path` and the first entry that fails, or saying where the directory is
/// broken (an offset or length past the end of `bytes`, a missing signature, a compressed entry); never reads
/// outside `bytes`.
void verify_zip_crcs(const std::string& bytes, const std::filesystem::path& path);

}  // namespace melforge::trainer
