// Main for `[cuda]` test executables: exits with 77 (CTest: skipped) when no CUDA device can be used.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string_view>

#include "mel/mel_engine.h"

int main(int argc, char* argv[]) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--list")) listing = true;
  }
  if (!listing && !melforge::mel::cuda_available()) {
    std::puts("no CUDA device: [cuda] tests skipped");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
