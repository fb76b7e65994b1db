// The absolute paths of tests/melforge_test_paths.h, from the definitions that cmake/MelforgeTestPaths.cmake gives
// this file alone.
#include "melforge_test_paths.h"

#ifndef MELFORGE_PATH_BUILD_EXE
#define MELFORGE_PATH_BUILD_EXE ""
#endif
#ifndef MELFORGE_PATH_TRAIN_EXE
#define MELFORGE_PATH_TRAIN_EXE ""
#endif

namespace melforge::test_paths {
const char* source_dir() { return MELFORGE_PATH_SOURCE_DIR; }
const char* binary_dir() { return MELFORGE_PATH_BINARY_DIR; }
const char* test_data_dir() { return MELFORGE_PATH_SOURCE_DIR "/tests/data"; }
const char* tools_dir() { return MELFORGE_PATH_SOURCE_DIR "/tools"; }
const char* build_exe() { return MELFORGE_PATH_BUILD_EXE; }
const char* train_exe() { return MELFORGE_PATH_TRAIN_EXE; }
const char* ctest_command() { return MELFORGE_PATH_CTEST_COMMAND; }
}  // namespace melforge::test_paths
