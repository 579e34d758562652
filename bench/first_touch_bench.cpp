// first_touch_bench: what faulting in fresh memory costs on this machine, against writing memory
// that is already mapped. Maps M MiB anonymous memory R times (in 2 MiB transparent huge pages,
// as HugePageBuffer asks for, or in 4 KiB pages), writes one byte per 4 KiB page (the first
// touch: the kernel zeroes each page, and a VM's host may back it only now), then memsets the
// whole region (already mapped), unmaps it, and prints GB/s of each pass.
//
//   first_touch_bench [--mib M] [--reps R] [--small-pages]
//
// On the test VM (PVM) the first touch ran at 0.45 GB/s in huge pages and 0.26 GB/s in 4 KiB
// pages, the memset after it at 13-17 GB/s: the merge's held buffers cost ~2 ms per MiB once per
// run (docs/benchmarks.md). A later repetition in the same process may reuse the pages just
// unmapped, and then runs at the memset's speed: the first line is the one that counts.
#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 1024;
  int reps = 3;
  bool small_pages = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--small-pages") {
      small_pages = true;
    } else {
      std::fprintf(stderr, "usage: first_touch_bench [--mib M] [--reps R] [--small-pages]\n");
      return 2;
    }
  }
  if (mib == 0 || reps < 1) {
    std::fprintf(stderr, "first_touch_bench: --mib and --reps must be positive\n");
    return 2;
  }
  const std::size_t bytes = mib << 20;
  for (int r = 0; r < reps; ++r) {
    void* mapped =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
      std::perror("first_touch_bench: mmap");
      return 1;
    }
    auto* p = static_cast<volatile char*>(mapped);
#ifdef MADV_HUGEPAGE
    if (!small_pages) (void)::madvise(mapped, bytes, MADV_HUGEPAGE);
#endif
    auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
    const double first = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::memset(mapped, 2, bytes);
    const double again = seconds_since(t0);
    std::printf("rep %d: %zu MiB in %s pages: first touch %.2f GB/s, memset after %.2f GB/s\n", r,
                mib, small_pages ? "4 KiB" : "huge", bytes / first / 1e9, bytes / again / 1e9);
    ::munmap(mapped, bytes);
  }
  return 0;
}
