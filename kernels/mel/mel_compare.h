#pragma once
/// The bound within which two mel engines' outputs agree (docs/FORMAT.md, "Engines and bytes"), as one function that
/// the builder's engine check (builder/engine_check.h) and the tests use: the CUDA engine against the CPU engine,
/// element by element. No CUDA here.
#include <cstdint>
#include <string>

#include "mel/mel_args.h"

namespace melforge::mel {

/// Power difference, relative to the power of the loudest band of the element's frame, under which an element agrees
/// whatever its log difference (FFT rounding is relative to the frame's energy, so a band far below its frame's peak
/// can differ by more in dB).
inline constexpr double kFramePowerTolerance = 1e-6;

/// The documented tolerance of one comparison: an element agrees when |device - cpu| <= rel * |cpu| + abs, or when
/// their powers (the stored values with the log undone) differ by at most frame_power times the CPU power of the
/// loudest band of the element's frame.
struct MelTolerance {
  /// 2e-3 for float16 (2 to 4 float16 ulps), 2e-4 for float32.
  double rel = 0;
  /// 5e-3 (dB or ln units) with log db or ln; with log none, 1e-5 times the largest |cpu| of the comparison.
  double abs = 0;
  /// kFramePowerTolerance.
  double frame_power = kFramePowerTolerance;
  /// The bound in words, e.g. "|device - cpu| <= 0.002 |cpu| + 0.005, or power within 1e-06 of the frame's loudest
  /// band".
  std::string text() const;
};

/// The tolerance for outputs of `dtype` under log mode `log`; `max_abs_cpu` is the largest |cpu| value compared (used
/// with log none only).
MelTolerance mel_tolerance(DType dtype, LogMode log, double max_abs_cpu);

/// |device - cpu|: 0 when equal (two NaNs and two equal infinities included), +infinity when only one side is NaN or
/// infinite.
double element_diff(float cpu, float device);

/// The element a comparison reports: the largest difference among the elements outside the tolerance, or among all
/// elements when none is. Every element compared is offered in turn.
struct WorstElement {
  /// Its index; -1 before any offer.
  int64_t index = -1;
  /// The CPU and the device value.
  float cpu = 0;
  float device = 0;
  /// element_diff of the two, and the bound it was held to.
  double diff = -1;
  double bound = 0;
  /// True when it is outside the bound.
  bool outside = false;
  /// Takes element `i` when it is worse: outside where the current one is not, or as far outside (or inside) and a
  /// larger difference. Returns whether it was taken.
  bool offer(int64_t i, float cpu_value, float device_value, double difference, double limit,
             bool is_outside);
};

/// What compare_mel found.
struct MelDiff {
  /// Elements compared.
  int64_t elements = 0;
  /// Elements outside the tolerance.
  int64_t outside = 0;
  /// Largest |device - cpu| over all elements (+infinity when one side is NaN or infinite and the other not).
  double max_abs_diff = 0;
  /// The element reported (flat index into the spectrograms); `bound` is rel * |cpu| + abs there.
  WorstElement worst;
  /// The tolerance applied.
  MelTolerance tolerance;
  /// True when no element is outside the tolerance.
  bool passed() const { return outside == 0; }
};

/// Compares `device` with `cpu`, `segments` spectrograms of [n_mels][n_frames] elements of `dtype` each (float16 as
/// IEEE half bits), computed with `args`, at mel_tolerance(dtype, args.log, largest |cpu|). Equal values (also two
/// NaNs or two equal infinities) agree; a NaN or infinity on one side only is outside. Throws InvalidArgument for
/// non-positive n_mels or n_frames, or a negative `segments`.
MelDiff compare_mel(const void* cpu, const void* device, int64_t segments, int n_mels, int n_frames, DType dtype,
                    const MelArgs& args);

}  // namespace melforge::mel
