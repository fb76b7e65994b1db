# melforge_add_test_paths(<test executable>): the absolute paths a test executable needs (the source tree, tests/data,
# tools/, melforge-build, melforge-train, ctest) are compiled into one small object of its own
# (tests/melforge_test_paths.cpp) and reached through tests/melforge_test_paths.h. They are not compile definitions of
# the test files themselves: a path on every test file's command line would make each of them a different translation
# unit in every clone, and a compiler cache would never serve CI's clean clone (docs/RELIABILITY.md, "CI time").
# Only this one small file is compiled anew.
function(melforge_add_test_paths target)
  set(paths ${target}_paths)
  add_library(${paths} OBJECT ${PROJECT_SOURCE_DIR}/tests/melforge_test_paths.cpp)
  target_include_directories(${paths} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${paths} PRIVATE melforge_warnings)
  target_compile_definitions(${paths} PRIVATE
    MELFORGE_PATH_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    MELFORGE_PATH_BINARY_DIR="${PROJECT_BINARY_DIR}"
    MELFORGE_PATH_CTEST_COMMAND="${CMAKE_CTEST_COMMAND}")
  if(TARGET melforge-build)
    target_compile_definitions(${paths} PRIVATE MELFORGE_PATH_BUILD_EXE="$<TARGET_FILE:melforge-build>")
    add_dependencies(${target} melforge-build)
  endif()
  if(TARGET melforge-train)
    target_compile_definitions(${paths} PRIVATE MELFORGE_PATH_TRAIN_EXE="$<TARGET_FILE:melforge-train>")
    add_dependencies(${target} melforge-train)
  endif()
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:${paths}>)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
endfunction()
