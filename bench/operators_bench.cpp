// Throughput of the merge operators (lib/src/operators.cpp), one thread.
//
// K = 20 experts, one 4 MiB block of a bf16 tensor (2 Mi elements). Two access patterns:
//  - "call 2048": the executor's pattern, merge_block on 2048-element runs whose fp32 inputs
//    were just converted and are cache-resident (the same run buffers reused), i.e. the
//    operator's own compute cost;
//  - "block 4MiB": one merge_block call over the whole block with fp32 inputs in DRAM
//    (20 × 8 MiB of deltas), i.e. bound by memory bandwidth.
// GB/s counts the bf16 input equivalent: (K + 1) × 2 bytes per element (base + experts).
//
// usage: operators_bench [experts] [repetitions]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "mergepipe/dare_mask.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/operators.hpp"

using namespace mergepipe;

namespace {

constexpr std::size_t kBlockElems = (4u << 20) / 2;  // 4 MiB of bf16
constexpr std::size_t kCallElems = 2048;             // the executor's run length

struct Family {
  std::vector<float> base;
  std::vector<std::vector<float>> deltas;
  std::vector<float> thresholds;  // TIES at density 0.5, from the magnitude sketch
};

Family make_family(std::size_t experts, std::size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> w(0.0f, 0.02f), d(0.0f, 0.001f);
  Family f;
  f.base.resize(n);
  for (auto& x : f.base) x = w(rng);
  f.deltas.assign(experts, std::vector<float>(n));
  for (auto& dk : f.deltas) {
    for (auto& x : dk) x = d(rng);
    MagnitudeSketch s;
    s.add(dk.data(), dk.size());
    f.thresholds.push_back(s.threshold(0.5));
  }
  return f;
}

OperatorConfig config(MergeMethod m, std::size_t experts) {
  OperatorConfig cfg;
  cfg.method = m;
  cfg.normalize = default_normalize(m);
  cfg.lambda = 0.8;
  cfg.seed = 7;
  for (std::size_t k = 0; k < experts; ++k) {
    cfg.weights.push_back(0.5f + 0.05f * static_cast<float>(k));
    cfg.densities.push_back(uses_dare(m) ? 0.5f : 1.0f);
  }
  return cfg;
}

// Best of `reps` runs, in thread CPU seconds: the figures measure the operator's work and stay
// meaningful on a machine shared with other jobs (wall time there counts time slices lost).
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <typename F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_cpu_seconds();
    f();
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

// A whole positive number, or 0 when `text` is anything else.
long positive(const char* text) {
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && n > 0 ? n : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const long experts_arg = argc > 1 ? positive(argv[1]) : 20;
  const long reps_arg = argc > 2 ? positive(argv[2]) : 5;
  if (argc > 3 || experts_arg <= 0 || experts_arg > 256 || reps_arg <= 0) {
    std::fprintf(stderr,
                 "usage: operators_bench [EXPERTS (1-256, default 20)] [REPS (default 5)]\n");
    return 2;
  }
  const auto experts = static_cast<std::size_t>(experts_arg);
  const int reps = static_cast<int>(reps_arg);
  const Family f = make_family(experts, kBlockElems);
  const double in_bytes_per_elem = 2.0 * static_cast<double>(experts + 1);
  std::vector<float> out(kBlockElems);
  std::vector<const float*> ptrs(experts);
  const TensorContext tctx{tensor_name_key("model.layers.0.mlp.up_proj.weight"), f.thresholds};

  std::printf(
      "operators_bench: K = %zu experts, block = 4 MiB bf16 (%zu elements), one thread, best of "
      "%d (thread CPU time)\n",
      experts, kBlockElems, reps);
  std::printf("%-16s %-11s %12s %10s\n", "method", "pattern", "Melem/s", "GB/s(bf16)");
  const MergeMethod methods[] = {MergeMethod::kLinear, MergeMethod::kTaskArithmetic,
                                 MergeMethod::kTies, MergeMethod::kDareLinear,
                                 MergeMethod::kDareTies};
  float sink = 0;
  for (MergeMethod m : methods) {
    const OperatorConfig cfg = config(m, experts);
    // Executor pattern: 2048-element calls on cache-resident runs (elem_begin still advances,
    // so DARE draws fresh counters).
    const double hot = best_seconds(reps, [&] {
      for (std::size_t k = 0; k < experts; ++k) ptrs[k] = f.deltas[k].data();
      for (std::size_t begin = 0; begin < kBlockElems; begin += kCallElems) {
        merge_block(cfg, tctx, begin, kCallElems, f.base.data(), ptrs, out.data());
      }
    });
    sink += out[0];
    const double cold = best_seconds(reps, [&] {
      for (std::size_t k = 0; k < experts; ++k) ptrs[k] = f.deltas[k].data();
      merge_block(cfg, tctx, 0, kBlockElems, f.base.data(), ptrs, out.data());
    });
    sink += out[1];
    for (const auto& [pattern, secs] :
         {std::pair{"call 2048", hot}, std::pair{"block 4MiB", cold}}) {
      const double eps = static_cast<double>(kBlockElems) / secs;
      std::printf("%-16s %-11s %12.1f %10.2f\n", merge_method_name(m).data(), pattern, eps / 1e6,
                  eps * in_bytes_per_elem / 1e9);
    }
  }
  // The DARE generator alone: keep decisions per second.
  std::vector<std::uint32_t> mask(kCallElems);
  const std::uint64_t key = dare_stream_key(7, 0, 1);
  const double gen = best_seconds(reps, [&] {
    for (std::size_t begin = 0; begin < kBlockElems; begin += kCallElems) {
      dare_keep_mask(key, begin, kCallElems, dare_keep_threshold(0.5f), mask.data());
      sink += static_cast<float>(mask[0] & 1u);
    }
  });
  std::printf("dare generator: %.1f M decisions/s\n", static_cast<double>(kBlockElems) / gen / 1e6);
  // The TIES threshold scan's histogram (one expert's deltas, 2048-element runs, warm counters).
  MagnitudeSketch sketch;
  sketch.add(f.deltas[0].data(), kCallElems);
  const double scan = best_seconds(reps, [&] {
    for (std::size_t begin = 0; begin < kBlockElems; begin += kCallElems)
      sketch.add(f.deltas[0].data() + begin, kCallElems);
  });
  sink += static_cast<float>(sketch.total() & 1u);
  std::printf("magnitude sketch: %.1f M values/s\n", static_cast<double>(kBlockElems) / scan / 1e6);
  return sink == 12345.0f ? 1 : 0;  // keeps the work observable
}
