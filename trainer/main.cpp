// melforge-train: the LibTorch trainer on melforge-build datasets. Everything happens in run_cli.
#include <iostream>

#include "cli.h"

int main(int argc, char** argv) { return melforge::trainer::run_cli(argc, argv, std::cout, std::cerr); }
