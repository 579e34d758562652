// Throughput of the threshold scan's histogram (MagnitudeSketch::add_bf16_deltas: keys counted
// by vector compares for the sketch's 8 most frequent buckets, one by one for the rest) on a
// real family's deltas, against counting every key one by one with 1, 2, 4 and 8 counter lanes
// per bucket and against a pass that only reads the same bytes (what memory allows), run in turn
// in every repetition so the machine's drift hits all alike. Elements per second (10^9), one
// thread, 4096-element chunks as the scan feeds them; expert tensors identical to the base are
// left out (the scan counts those without the histogram). The first repetition also prints how
// concentrated the keys are.
// Usage: sketch_bench --family DIR [--experts 10] [--tensors 6] [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mergepipe/dtype.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/magnitude_sketch.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kChunk = 4096;
constexpr std::size_t kBuckets = std::size_t{1} << 16;

std::vector<std::byte> read_bytes(const std::string& path, std::uint64_t offset,
                                  std::uint64_t length) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset));
  std::vector<std::byte> bytes(length);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(length));
  if (!in) {
    std::fprintf(stderr, "sketch_bench: cannot read %llu bytes of %s\n",
                 static_cast<unsigned long long>(length), path.c_str());
    std::exit(1);
  }
  return bytes;
}

// Every key counted one by one, element i in lane i % lanes (the library's loop until 2026-12-05,
// with 2 lanes).
template <std::size_t lanes>
void count_deltas(std::uint32_t* counters, const std::byte* expert, const float* base,
                  std::size_t n) {
  auto key = [&](std::size_t i) {
    std::uint16_t h;
    std::memcpy(&h, expert + 2 * i, 2);
    const std::uint32_t bits = std::uint32_t{h} << 16;  // bf16 -> f32, inline as in the library
    float value;
    std::memcpy(&value, &bits, 4);
    return mergepipe::magnitude_bucket(value - base[i]);
  };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t lane = 0; lane < lanes; ++lane) ++counters[lanes * key(i + lane) + lane];
  for (; i < n; ++i) ++counters[lanes * key(i) + i % lanes];
}

// The memory bound: reads the same bytes and does nothing else (a vectorised sum).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) std::uint32_t read_only(
    const std::byte* expert, const float* base, std::size_t n) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, expert + 2 * i, 2);
    std::uint32_t b;
    std::memcpy(&b, base + i, 4);
    sum += h ^ b;
  }
  return sum;
}

struct Pair {
  const std::vector<float>* base;
  std::vector<std::byte> expert;
};

}  // namespace

int main(int argc, char** argv) {
  std::string family;
  int experts = 10, tensors = 6, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--family")
      family = argv[i + 1];
    else if (flag == "--experts")
      experts = std::atoi(argv[i + 1]);
    else if (flag == "--tensors")
      tensors = std::atoi(argv[i + 1]);
    else if (flag == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "sketch_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (family.empty() || experts < 1 || tensors < 1 || reps < 1) {
    std::fprintf(stderr,
                 "usage: sketch_bench --family DIR [--experts 10] [--tensors 6] [--reps 5]\n");
    return 2;
  }
  const auto base_header =
      mergepipe::io::read_safetensors_header(family + "/base/model.safetensors");
  std::vector<mergepipe::StoredTensor> chosen;
  for (const auto& t : base_header.tensors)
    if (t.info.dtype == mergepipe::DType::kBF16 && t.info.numel() >= (1u << 20) &&
        t.info.name.find("layers.") != std::string::npos)
      chosen.push_back(t);
  const std::size_t stride = std::max<std::size_t>(1, chosen.size() / tensors);
  std::vector<std::vector<float>> bases;
  bases.reserve(chosen.size());
  std::vector<Pair> pairs;
  std::uint64_t elements = 0, zeros = 0;
  for (std::size_t c = 0; c < chosen.size() && bases.size() < std::size_t(tensors); c += stride) {
    const auto& t = chosen[c];
    const auto base_bytes = read_bytes(t.file, t.offset, t.length);
    auto& base = bases.emplace_back(t.info.numel());
    mergepipe::convert_to_f32(mergepipe::DType::kBF16, base_bytes.data(), base.data(), base.size());
    for (int k = 0; k < experts; ++k) {
      char name[48];
      std::snprintf(name, sizeof name, "/expert%02d/model.safetensors", k);
      const auto header = mergepipe::io::read_safetensors_header(family + name);
      const auto it = std::find_if(header.tensors.begin(), header.tensors.end(),
                                   [&](const auto& e) { return e.info.name == t.info.name; });
      if (it == header.tensors.end()) continue;
      auto bytes = read_bytes(it->file, it->offset, it->length);
      if (bytes == base_bytes) continue;
      std::vector<float> delta(base.size());
      mergepipe::convert_delta_to_f32(mergepipe::DType::kBF16, bytes.data(), base.data(),
                                      delta.data(), delta.size());
      elements += delta.size();
      zeros += static_cast<std::uint64_t>(std::count(delta.begin(), delta.end(), 0.0f));
      pairs.push_back({&base, std::move(bytes)});
    }
  }
  if (pairs.empty()) {
    std::fprintf(stderr, "sketch_bench: no expert tensor of %s differs from the base\n",
                 family.c_str());
    return 1;
  }
  std::printf("%zu changed (expert, tensor) pairs, %.1f M elements, %.1f%% of deltas zero\n",
              pairs.size(), elements / 1e6, 100.0 * zeros / elements);

  std::vector<std::uint32_t> counters(kBuckets * 8);
  auto run = [&](auto&& count) {
    std::fill(counters.begin(), counters.end(), 0u);
    const auto t0 = Clock::now();
    for (const Pair& p : pairs)
      for (std::size_t first = 0; first < p.base->size(); first += kChunk)
        count(p.expert.data() + 2 * first, p.base->data() + first,
              std::min(kChunk, p.base->size() - first));
    return elements / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  };
  const char* names[] = {"library (MagnitudeSketch)", "1 lane", "2 lanes", "4 lanes", "8 lanes",
                         "read only (memory bound)"};
  std::vector<std::vector<double>> rates(std::size(names));
  for (int r = 0; r < reps; ++r) {
    mergepipe::MagnitudeSketch sketch;
    rates[0].push_back(run([&](const std::byte* e, const float* b, std::size_t n) {
      sketch.add_bf16_deltas(e, b, n);
    }));
    rates[1].push_back(run([&](auto... a) { count_deltas<1>(counters.data(), a...); }));
    rates[2].push_back(run([&](auto... a) { count_deltas<2>(counters.data(), a...); }));
    rates[3].push_back(run([&](auto... a) { count_deltas<4>(counters.data(), a...); }));
    rates[4].push_back(run([&](auto... a) { count_deltas<8>(counters.data(), a...); }));
    std::uint32_t sink = 0;
    rates[5].push_back(run(
        [&](const std::byte* e, const float* b, std::size_t n) { sink += read_only(e, b, n); }));
    if (sink == 1) std::printf(" ");
    if (r == 0) {
      sketch.compact();
      auto c = sketch.counts();
      std::sort(c.rbegin(), c.rend());
      std::uint64_t acc = 0;
      std::size_t n50 = 0, n90 = 0, n99 = 0;
      for (std::size_t j = 0; j < c.size(); ++j) {
        acc += c[j];
        if (!n50 && acc * 2 >= elements) n50 = j + 1;
        if (!n90 && acc * 10 >= elements * 9) n90 = j + 1;
        if (!n99 && acc * 100 >= elements * 99) n99 = j + 1;
      }
      // Deltas of bf16 weights are mostly multiples of the base's unit in the last place: a few
      // buckets take most increments.
      std::printf(
          "%zu buckets in use; the largest holds %.1f%% of the deltas, the %zu largest "
          "50%%, %zu 90%%, %zu 99%%\n",
          c.size(), 100.0 * double(c[0]) / elements, n50, n90, n99);
    }
    if (sketch.total() != elements) {
      std::fprintf(stderr, "sketch_bench: the sketch counted %llu of %llu elements\n",
                   static_cast<unsigned long long>(sketch.total()),
                   static_cast<unsigned long long>(elements));
      return 1;
    }
  }
  std::printf("%-28s %10s %10s\n", "histogram", "median", "best");
  for (std::size_t v = 0; v < rates.size(); ++v) {
    std::sort(rates[v].begin(), rates[v].end());
    std::printf("%-28s %10.2f %10.2f  G elem/s\n", names[v], rates[v][rates[v].size() / 2],
                rates[v].back());
  }
  return 0;
}
