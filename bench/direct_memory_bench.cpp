// direct_memory_bench: does the memory an O_DIRECT read lands in change how fast the device
// delivers it? Reads each FILE once with O_DIRECT (N threads, B-byte requests, whole file),
// alternating (ABBA) the destination between 4 KiB pages and 2 MiB transparent huge pages (the
// HugePageBuffer that the merge's direct reads and writes use), and prints GB/s per file and the
// median per kind.
//
//   direct_memory_bench [--threads N] [--request B] FILE...
//
// Give distinct files that no one has read lately (on a VM, not in the host's cache either):
// each file is read once, so the kinds see the storage alike.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mergepipe/huge_page_buffer.hpp"

namespace {

struct Fd {
  int fd = -1;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_DIRECT)) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

struct SmallPages {  // aligned for O_DIRECT, but in 4 KiB pages (no THP advice)
  std::unique_ptr<std::byte, decltype(&std::free)> data{nullptr, &std::free};
  explicit SmallPages(std::size_t n)
      : data(static_cast<std::byte*>(std::aligned_alloc(4096, n)), &std::free) {}
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "direct_memory_bench: %s\n", what.c_str());
  std::exit(1);
}

// Seconds to read `path` whole; `huge` picks the memory kind.
double read_file(const std::string& path, int threads, std::size_t request, bool huge) {
  Fd probe(path);
  if (probe.fd < 0) fail(path + ": cannot open with O_DIRECT: " + std::strerror(errno));
  const off_t size = ::lseek(probe.fd, 0, SEEK_END);
  std::atomic<off_t> next{0};
  std::atomic<bool> failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      Fd fd(path);
      mergepipe::HugePageBuffer huge_memory;
      SmallPages small_memory(huge ? 4096 : request);
      std::byte* buffer = small_memory.data.get();
      if (huge) {
        huge_memory.reserve(request);
        buffer = huge_memory.data();
      }
      std::memset(buffer, 0, request);  // faulted in before the clock matters
      for (off_t at; (at = next.fetch_add(static_cast<off_t>(request))) < size;) {
        const std::size_t n = static_cast<std::size_t>(
            std::min<off_t>(static_cast<off_t>(request), (size - at + 4095) / 4096 * 4096));
        if (::pread(fd.fd, buffer, n, at) < 0) failed = true;
      }
    });
  }
  for (auto& t : pool) t.join();
  if (failed) fail(path + ": a direct read failed");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 8;
  std::size_t request = std::size_t{4} << 20;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--request" && i + 1 < argc) {
      request = std::max<std::size_t>(4096, std::strtoull(argv[++i], nullptr, 10) / 4096 * 4096);
    } else {
      files.push_back(arg);
    }
  }
  if (files.empty()) fail("usage: direct_memory_bench [--threads N] [--request B] FILE...");
  std::vector<double> rates[2];
  for (std::size_t i = 0; i < files.size(); ++i) {
    const bool huge = (i + 1) / 2 % 2 == 1;  // 4K, huge, huge, 4K, ...: drift hits both alike
    Fd fd(files[i]);
    const double bytes = fd.fd < 0 ? 0 : static_cast<double>(::lseek(fd.fd, 0, SEEK_END));
    const double seconds = read_file(files[i], threads, request, huge);
    rates[huge].push_back(bytes / seconds / 1e9);
    std::printf("%s  %s pages  %.2f GB/s\n", files[i].c_str(), huge ? "2 MiB" : "4 KiB",
                rates[huge].back());
  }
  std::printf("median: 4 KiB pages %.2f GB/s (%zu files), 2 MiB pages %.2f GB/s (%zu files)\n",
              median(rates[0]), rates[0].size(), median(rates[1]), rates[1].size());
  return 0;
}
