// The FFTW plan choice of the CPU mel engine (kernels/mel/mel_cpu.cpp, R2cPlan), measured alone: one batched r2c
// plan of `howmany` contiguous frames of n_fft floats (the engine's layout and aligned buffers), made with
// FFTW_ESTIMATE (the engine's), FFTW_MEASURE and FFTW_PATIENT, each executed on the same data; the least CPU time of
// the calling thread per frame over 7 rounds (steady on a loaded machine, unlike wall time). Then a hash of the
// output and of the plan's description, so that running it several times shows whether a flag gives the same bits in
// every process (ESTIMATE does; MEASURE may not: its choice depends on timings; a plan imported from wisdom does).
// Build and run (docs/PERFORMANCE.md, "Python front-ends (issue 31)"):
//   gcc -O2 tools/bench/fftw_plans.c -o /tmp/fftw_plans -lfftw3f && /tmp/fftw_plans 512 64
#include <fftw3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t fnv1a(const void* data, size_t bytes) {
  const unsigned char* b = data;
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s N_FFT HOWMANY\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]), howmany = atoi(argv[2]);
  if (n < 2 || howmany < 1) {
    fprintf(stderr, "N_FFT must be >= 2 and HOWMANY >= 1\n");
    return 2;
  }
  const int n_freqs = n / 2 + 1;
  float* in = fftwf_malloc(sizeof(float) * (size_t)n * howmany);
  fftwf_complex* out = fftwf_malloc(sizeof(fftwf_complex) * (size_t)n_freqs * howmany);
  const char* names[] = {"ESTIMATE", "MEASURE", "PATIENT"};
  const unsigned flags[] = {FFTW_ESTIMATE, FFTW_MEASURE, FFTW_PATIENT};
  for (int k = 0; k < 3; ++k) {
    double start = cpu_seconds();
    fftwf_plan plan = fftwf_plan_many_dft_r2c(1, &n, howmany, in, NULL, 1, n, out, NULL, 1, n_freqs, flags[k]);
    const double plan_s = cpu_seconds() - start;
    srand(1);
    for (int i = 0; i < n * howmany; ++i) in[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    fftwf_execute_dft_r2c(plan, in, out);
    const uint64_t out_hash = fnv1a(out, sizeof(fftwf_complex) * (size_t)n_freqs * howmany);
    char* text = fftwf_sprint_plan(plan);
    const uint64_t plan_hash = fnv1a(text, strlen(text));
    free(text);
    const int reps = 1 + 40000 / howmany;
    double best = 1e30;
    for (int round = 0; round < 7; ++round) {
      start = cpu_seconds();
      for (int r = 0; r < reps; ++r) fftwf_execute_dft_r2c(plan, in, out);
      const double t = (cpu_seconds() - start) / reps / howmany;
      if (t < best) best = t;
    }
    printf("n_fft %d howmany %d %-8s: %.3f us per frame (planning %.1f ms); output %016llx plan %016llx\n", n,
           howmany, names[k], 1e6 * best, 1e3 * plan_s, (unsigned long long)out_hash, (unsigned long long)plan_hash);
    fftwf_destroy_plan(plan);
  }
  fftwf_free(in);
  fftwf_free(out);
  return 0;
}
