#pragma once
/// Small helpers shared by the trainer's folders: shape, CSV, printf-style and list text, and an autocast scope.
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "melforge/common/csv.h"
#include "melforge/common/errors.h"

namespace melforge::trainer {

/// "[d0, d1, ...]".
inline std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// `printf(f, ...)` into a string.
[[gnu::format(printf, 1, 2)]] inline std::string fmt(const char* f, ...) {
  std::va_list args, copy;
  va_start(args, f);
  va_copy(copy, args);
  std::string s(static_cast<std::size_t>(std::vsnprintf(nullptr, 0, f, copy)), '\0');
  va_end(copy);
  std::vsnprintf(s.data(), s.size() + 1, f, args);
  va_end(args);
  return s;
}

/// "a, b, c".
inline std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Enables autocast to `dtype` (at::kBFloat16 or at::kHalf) on `device_type` for its scope, nothing for
/// at::kFloat, and restores the previous autocast state at the end. Throws InvalidArgument for another dtype.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, at::ScalarType dtype) : type_(device_type), active_(dtype != at::kFloat) {
    if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
      throw InvalidArgument(std::string("autocast: unsupported dtype ") + c10::toString(dtype) +
                            " (float, bfloat16 or half)");
    if (!active_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType type_;
  bool active_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

}  // namespace melforge::trainer
