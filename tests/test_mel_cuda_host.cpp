// CPU tests of the CUDA engine's CUDA-free parts (mel_cuda.h, mel_cuda_host.cpp): buffer sizes and launch limits of
// batches past 2^31 FFT elements, the captured graph's verdict, the messages naming the compiled architectures, and
// the device query on this machine (no driver here: the error path; a GPU machine: the success path).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "mel/mel_cuda.h"
#include "mel/mel_engine.h"
#include "melforge/common/errors.h"

namespace melforge_test_mel_cuda_host {

using namespace melforge;
using namespace melforge::mel;
using namespace melforge::mel::cuda;

namespace {

/// 16 kHz, n_fft `n_fft`, hop 160, centred: 101 frames per 16000-sample segment, 64 mels.
MelLayout layout_for(int n_fft) {
  EngineConfig c;
  c.mel.sample_rate = 16000;
  c.mel.n_fft = n_fft;
  c.mel.hop_length = 160;
  c.segment_samples = 16000;
  return make_layout(c);
}

constexpr int64_t kTwoTo31 = int64_t{1} << 31;

}  // namespace

TEST_CASE("cuda_buffer_sizes: a batch of more than 2^31 FFT elements is sized in 64 bits and accepted",
          "[mel][cuda_host]") {
  const int n_fft = GENERATE(1024, 400, 512);
  const int64_t batch = GENERATE(int64_t{65536}, int64_t{100000}, int64_t{1} << 20);
  CAPTURE(n_fft, batch);
  const MelLayout layout = layout_for(n_fft);
  REQUIRE(layout.n_frames == 101);
  const CudaBufferSizes s = cuda_buffer_sizes(layout, n_fft, batch, 1000);
  CHECK(s.frame_rows == batch * 101);
  CHECK(s.frame_floats > kTwoTo31);
  CHECK(s.frame_floats % n_fft == 0);
  CHECK(s.frame_floats / n_fft == s.frame_rows);
  CHECK(s.frame_bytes() == 4 * s.frame_floats);
  CHECK(s.spectrum_complex / layout.n_freqs == s.frame_rows);
  CHECK(s.spectrum_bytes() == 8 * s.spectrum_complex);
  CHECK(s.input_floats == batch * 16000);
  CHECK(s.output_elems == batch * 64 * 101);
  CHECK(s.slot_device_bytes() == s.input_bytes() + s.frame_bytes() + s.spectrum_bytes() + s.output_bytes());
  CHECK(s.slot_device_bytes() > s.frame_bytes());
  CHECK_NOTHROW(check_launch_limits(s, n_fft));
}

TEST_CASE("check_launch_limits rejects grids past 2^31 - 1 blocks and huge FFTs of large-prime sizes",
          "[mel][cuda_host]") {
  SECTION("frame rows past the gather grid") {
    const MelLayout layout = layout_for(512);
    const int64_t batch = kMaxGridBlocks / 101 + 1;
    const CudaBufferSizes s = cuda_buffer_sizes(layout, 512, batch, 1000);
    REQUIRE(s.frame_rows > kMaxGridBlocks);
    CHECK(s.frame_floats == s.frame_rows * 512);
    CHECK_THROWS_AS(check_launch_limits(s, 512), InvalidArgument);
    CHECK_THROWS_WITH(check_launch_limits(s, 512), Catch::Contains("device_batch " + std::to_string(batch)) &&
                                                       Catch::Contains("grid limit of 2147483647"));
    const CudaBufferSizes just = cuda_buffer_sizes(layout, 512, kMaxGridBlocks / 101, 1000);
    CHECK_NOTHROW(check_launch_limits(just, 512));
  }
  SECTION("n_fft with a prime factor above 127 past 2^32 elements") {
    const int n_fft = 1018;
    REQUIRE(largest_prime_factor(n_fft) == 509);
    const MelLayout layout = layout_for(n_fft);
    const CudaBufferSizes over = cuda_buffer_sizes(layout, n_fft, 50000, 1000);
    REQUIRE(over.frame_floats > kLargeFftElements);
    CHECK_THROWS_WITH(check_launch_limits(over, n_fft), Catch::Contains("primes <= 127"));
    const CudaBufferSizes under = cuda_buffer_sizes(layout, n_fft, 30000, 1000);
    REQUIRE(under.frame_floats > kTwoTo31);
    REQUIRE(under.frame_floats < kLargeFftElements);
    CHECK_NOTHROW(check_launch_limits(under, n_fft));
  }
  CHECK(largest_prime_factor(1) == 1);
  CHECK(largest_prime_factor(1024) == 2);
  CHECK(largest_prime_factor(400) == 5);
  CHECK(largest_prime_factor(127) == 127);
  CHECK(largest_prime_factor(2 * 131) == 131);
}

TEST_CASE("graph_problem accepts kernels inside child graphs and names every count when it rejects",
          "[mel][cuda_host]") {
  GraphNodeSummary child;
  child.top_level_nodes = 7;
  child.kernels = 3;
  child.child_graphs = 1;
  child.copies = 2;
  child.events = 4;
  CHECK(graph_problem(child).empty());
  CHECK(describe(child) ==
        "7 top-level nodes, 3 kernels (incl. child graphs), 1 child graphs, 2 copies, 0 memsets, 4 event records");

  GraphNodeSummary flat;
  flat.top_level_nodes = 11;
  flat.kernels = 5;
  flat.copies = 3;
  flat.memsets = 1;
  flat.events = 4;
  CHECK(graph_problem(flat).empty());

  GraphNodeSummary two_kernels = flat;
  two_kernels.kernels = 2;
  const std::string why = graph_problem(two_kernels);
  CHECK_THAT(why, Catch::Contains("incomplete") && Catch::Contains("2 kernels") &&
                      Catch::Contains("11 top-level nodes") && Catch::Contains("3 copies") &&
                      Catch::Contains("1 memsets") && Catch::Contains("expected >= 3 kernels"));
  GraphNodeSummary one_copy = flat;
  one_copy.copies = 1;
  CHECK_FALSE(graph_problem(one_copy).empty());
  GraphNodeSummary five_events = flat;
  five_events.events = 5;
  CHECK_FALSE(graph_problem(five_events).empty());
  CHECK_FALSE(graph_problem(GraphNodeSummary{}).empty());
}

TEST_CASE("the compiled architectures and the no-kernel-image message", "[mel][cuda_host]") {
  CHECK(describe_cuda_architectures("75-real,80-real,86-real,89-real,90-real,100-real,120-real,120-virtual") ==
        "sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 and PTX for compute_120");
  CHECK(describe_cuda_architectures("80,90-virtual") == "sm_80 and PTX for compute_80, compute_90");
  CHECK(describe_cuda_architectures("90-virtual") == "PTX for compute_90");
  CHECK(describe_cuda_architectures("all") == "all");
  CHECK(describe_cuda_architectures("80-real,native") == "sm_80; native");
  CHECK(describe_cuda_architectures("") == "no CUDA architecture");
  CHECK(no_kernel_image_message(11, 0, "75-real,120-real,120-virtual") ==
        "no kernel image for compute capability 11.0 in this build; built for sm_75, sm_120 and PTX for compute_120; "
        "rebuild with -DCMAKE_CUDA_ARCHITECTURES including 110-real");
#if defined(MELFORGE_HAVE_CUDA)
  CHECK(cuda_architectures() == MELFORGE_TEST_CUDA_ARCHITECTURES);
  CHECK_FALSE(cuda_architectures().empty());
#else
  CHECK(cuda_architectures().empty());
#endif
}

TEST_CASE("CudaDeviceQuery::describe names the error, the driver and the runtime", "[mel][cuda_host]") {
  CudaDeviceQuery q;
  CHECK(q.describe() == "built without CUDA (MELFORGE_CUDA=OFF)");
  q.built_with_cuda = true;
  q.error_code = 35;
  q.error_name = "cudaErrorInsufficientDriver";
  q.error_message = "CUDA driver version is insufficient for CUDA runtime version";
  q.runtime_version = 13000;
  CHECK(q.describe() ==
        "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime "
        "version (driver: none installed; runtime: CUDA 13.0)");
  q.driver_version = 12040;
  CHECK_THAT(q.describe(), Catch::EndsWith("(driver: CUDA 12.4; runtime: CUDA 13.0)"));
  q = CudaDeviceQuery{};
  q.built_with_cuda = true;
  q.count = 2;
  q.driver_version = 13000;
  q.runtime_version = 13000;
  CHECK(q.usable());
  CHECK(q.describe() == "2 CUDA devices (driver: CUDA 13.0; runtime: CUDA 13.0)");
}

TEST_CASE("the device query on this machine keeps its error, and a CUDA engine names it", "[mel][cuda_host]") {
  const CudaDeviceQuery q = query_cuda_devices();
  INFO("device query: " << q.describe());
#if defined(MELFORGE_HAVE_CUDA)
  CHECK(q.built_with_cuda);
  CHECK(q.runtime_version >= 13000);
#else
  CHECK_FALSE(q.built_with_cuda);
  CHECK_FALSE(cuda_device_support(0).supported());
#endif
  CHECK(q.count >= 0);
  EngineConfig config;
  config.segment_samples = 4000;
  config.device_batch = 4;
  if (q.usable()) {
    CHECK(q.error_code == 0);
    CHECK(q.error_name.empty());
    for (int d = 0; d < q.count; ++d) {
      const CudaDeviceSupport s = cuda_device_support(d);
      INFO("device " << d << ": " << s.name << ", problem: " << s.problem);
      CHECK(s.device == d);
      CHECK(s.cc_major >= 7);
      CHECK_FALSE(s.name.empty());
    }
    return;
  }
  if (q.built_with_cuda) {
    CHECK(q.error_code != 0);
    CHECK_THAT(q.error_name, Catch::StartsWith("cudaError"));
    CHECK_FALSE(q.error_message.empty());
    CHECK_THAT(q.describe(), Catch::Contains(q.error_name + ": " + q.error_message));
  }
  CHECK_THROWS_AS(make_cuda_engine(config), CudaError);
  CHECK_THROWS_WITH(make_cuda_engine(config),
                    Catch::Contains(q.built_with_cuda ? q.error_name : std::string("built without CUDA")));
  CHECK_FALSE(cuda_available());
  CHECK(cuda_device_count() == 0);
}

}  // namespace melforge_test_mel_cuda_host
