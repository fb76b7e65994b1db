#pragma once
/// Catch2 for the trainer's tests, which also include LibTorch. c10's logging header defines a glog-style
/// CHECK(condition) that aborts the process, and catch.hpp defines Catch's CHECK(...): whichever comes last wins,
/// and in a unity build (trainer/CMakeLists.txt) the order is that of the whole batch. This header includes c10's
/// first, then Catch2, and restores Catch's CHECK, so that a failing CHECK is reported by Catch in any include order.
#include <c10/util/Logging.h>

#include <catch2/catch.hpp>

#undef CHECK
#define CHECK(...) INTERNAL_CATCH_TEST("CHECK", Catch::ResultDisposition::ContinueOnFailure, __VA_ARGS__)
