// libFuzzer target: the zip layer of the checkpoint reader (trainer/train/torch_zip.h, torch-free): the central
// directory (zip64 included), every entry's local header and CRC-32, each read bounded by the input. The rest of the
// reader (LibTorch's unpickler and the tensor metadata checks of train/checkpoint.cpp) needs LibTorch, which the
// fuzzing build does not link; tools/make_hostile_checkpoints.py and the [untrusted] tests cover it. Checks, besides
// crashes and sanitizer reports: the only error is FormatError, and it names the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "melforge/common/errors.h"
#include "train/torch_zip.h"

using melforge::fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    melforge::trainer::verify_zip_crcs(bytes, "fuzz.pt");
  } catch (const melforge::FormatError& e) {
    require(std::string(e.what()).find("'fuzz.pt'") != std::string::npos, "the error does not name the file");
  }
  return 0;
}
