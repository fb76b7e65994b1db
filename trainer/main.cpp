// melforge-train: the LibTorch trainer on melforge-build datasets. Everything happens in run_cli.
#include <iostream>

#include "cli.h"
#include "options.h"

int main(int argc, char** argv) {
  melforge::trainer::configure_allocator();
  return melforge::trainer::run_cli(argc, argv, std::cout, std::cerr);
}
