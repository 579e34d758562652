// Throughput of the bulk dtype conversions (convert_to_f32 / convert_from_f32) against a loop over
// the scalar functions. GB/s counts input bytes per second (10^9), best of N runs, one thread.
// Usage: dtype_bench [--mib 64] [--reps 10]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mergepipe/dtype.hpp"

using mergepipe::DType;

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double best_seconds(int reps, F&& body) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    body();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

// Element-at-a-time conversions through the scalar API, for comparison (separate translation
// unit, so not inlined or vectorised).
void scalar_to_f32(DType src, const std::byte* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = src == DType::kBF16 ? mergepipe::bf16_to_f32(h) : mergepipe::f16_to_f32(h);
  }
}
void scalar_from_f32(DType dst, const float* in, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h =
        dst == DType::kBF16 ? mergepipe::f32_to_bf16(in[i]) : mergepipe::f32_to_f16(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 64;
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mib") == 0)
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--reps") == 0)
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: dtype_bench [--mib N] [--reps N]\n");
      return 2;
    }
  }
  const std::size_t bytes = mib << 20;

  // Weight-like values: gaussian, std 0.02, as stored checkpoints hold.
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> f32(bytes / 2);  // largest element count needed (2-byte input types)
  for (float& v : f32) v = normal(rng);

  std::printf("dtype conversion throughput: %zu MiB input buffers, best of %d, 1 thread\n", mib,
              reps);
  std::printf("%-6s %-10s %12s %12s\n", "dtype", "direction", "bulk GB/s", "scalar GB/s");
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32, DType::kF64}) {
    const std::size_t esize = mergepipe::dtype_size(dt);
    const bool half = esize == 2;

    // to_f32: `bytes` of stored input.
    {
      const std::size_t n = bytes / esize;
      std::vector<std::byte> stored(n * esize);
      mergepipe::convert_from_f32(dt, f32.data(), stored.data(), n);
      std::vector<float> out(n, 1.0f);  // touched: no page faults in the timed loop
      const double s =
          best_seconds(reps, [&] { mergepipe::convert_to_f32(dt, stored.data(), out.data(), n); });
      double scalar = 0;
      if (half)
        scalar = best_seconds(reps, [&] { scalar_to_f32(dt, stored.data(), out.data(), n); });
      std::printf("%-6s %-10s %12.2f", std::string(mergepipe::dtype_name(dt)).c_str(), "to_f32",
                  static_cast<double>(n * esize) / s / 1e9);
      if (half)
        std::printf(" %12.2f\n", static_cast<double>(n * esize) / scalar / 1e9);
      else
        std::printf(" %12s\n", "-");
    }
    // from_f32: `bytes` of fp32 input.
    {
      const std::size_t n = bytes / 4;
      std::vector<std::byte> out(n * esize, std::byte{1});
      const double s =
          best_seconds(reps, [&] { mergepipe::convert_from_f32(dt, f32.data(), out.data(), n); });
      double scalar = 0;
      if (half)
        scalar = best_seconds(reps, [&] { scalar_from_f32(dt, f32.data(), out.data(), n); });
      std::printf("%-6s %-10s %12.2f", std::string(mergepipe::dtype_name(dt)).c_str(), "from_f32",
                  static_cast<double>(n * 4) / s / 1e9);
      if (half)
        std::printf(" %12.2f\n", static_cast<double>(n * 4) / scalar / 1e9);
      else
        std::printf(" %12s\n", "-");
    }
  }
  return 0;
}
