#pragma once
// The absolute paths a test needs, compiled into tests/melforge_test_paths.cpp alone (cmake/MelforgeTestPaths.cmake
// says why they are not compile definitions of every test file). The macros keep the names the tests have always
// used; each is a `const char*` (not a string literal: concatenate with std::string).

namespace melforge::test_paths {
/// The source tree's root (the folder of the top-level CMakeLists.txt).
const char* source_dir();
/// The build folder's root.
const char* binary_dir();
/// tests/data of the source tree.
const char* test_data_dir();
/// tools/ of the source tree.
const char* tools_dir();
/// The built melforge-build; empty when the test executable was built without it.
const char* build_exe();
/// The built melforge-train; empty when the test executable was built without it (no trainer).
const char* train_exe();
/// The ctest that CMake configured the build with.
const char* ctest_command();
}  // namespace melforge::test_paths

#define MELFORGE_SOURCE_DIR (::melforge::test_paths::source_dir())
#define MELFORGE_BINARY_DIR (::melforge::test_paths::binary_dir())
#define MELFORGE_TEST_DATA_DIR (::melforge::test_paths::test_data_dir())
#define MELFORGE_TOOLS_DIR (::melforge::test_paths::tools_dir())
#define MELFORGE_BUILD_EXE (::melforge::test_paths::build_exe())
#define MELFORGE_TRAIN_EXE (::melforge::test_paths::train_exe())
#define MELFORGE_CTEST_COMMAND (::melforge::test_paths::ctest_command())
