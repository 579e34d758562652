// read_files: the storage-bandwidth reference of the benchmarks, and their page-cache eviction.
//
//   read_files --evict PATH...                 drop PATH's pages from the page cache
//   read_files [--threads N] [--request B] [--direct] PATH...   read every file once, print JSON
//
// Reading: N threads (default 4) take the files' byte ranges in order, B bytes (default 16 MiB)
// per pread, into reused buffers; the result is the bandwidth a good reader gets from these files
// on this machine right now. --direct reads with O_DIRECT into 2 MiB-aligned buffers the kernel
// is asked to back with huge pages, as a merge reads the files it finds uncached.
// Eviction: sync(), then posix_fadvise(POSIX_FADV_DONTNEED) on every regular file under each
// PATH (folders are walked), so the next read comes from storage.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<std::string> regular_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) out.push_back(e.path().string());
    } else if (fs::is_regular_file(p)) {
      out.push_back(p);
    } else {
      std::fprintf(stderr, "read_files: %s: no such file or folder\n", p.c_str());
      std::exit(2);
    }
  }
  return out;
}

void evict(const std::vector<std::string>& files) {
  ::sync();
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

constexpr std::size_t kPage = 4096;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

struct Range {
  int fd;
  off_t offset;
  std::size_t length;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 4;
  std::size_t request = 16u << 20;
  bool evict_only = false;
  bool direct = false;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--request" && i + 1 < argc) {
      request = std::max<std::size_t>(4096, std::strtoull(argv[++i], nullptr, 10));
    } else if (a == "--direct") {
      direct = true;
    } else if (a == "--evict") {
      evict_only = true;
    } else {
      paths.push_back(a);
    }
  }
  const std::vector<std::string> files = regular_files(paths);
  if (evict_only) {
    evict(files);
    return 0;
  }
  if (direct) request = (request + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<Range> ranges;
  std::vector<int> fds;
  std::uint64_t total = 0;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
      std::fprintf(stderr, "read_files: %s: %s\n", f.c_str(), std::strerror(errno));
      return 2;
    }
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    fds.push_back(fd);
    const auto size = static_cast<std::uint64_t>(fs::file_size(f));
    for (std::uint64_t off = 0; off < size; off += request)
      ranges.push_back({fd, static_cast<off_t>(off),
                        static_cast<std::size_t>(std::min<std::uint64_t>(request, size - off))});
    total += size;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      const std::unique_ptr<char, decltype(&std::free)> buffer(
          static_cast<char*>(std::aligned_alloc(kHugePage, request)), &std::free);
      if (!buffer) {
        failed = true;
        return;
      }
      (void)::madvise(buffer.get(), request, MADV_HUGEPAGE);
      for (std::size_t i; (i = next++) < ranges.size();) {
        const Range& r = ranges[i];
        std::size_t done = 0;
        while (done < r.length) {
          // O_DIRECT: whole pages; the file's last page comes back short.
          const std::size_t want =
              direct ? (r.length - done + kPage - 1) / kPage * kPage : r.length - done;
          const ssize_t got =
              ::pread(r.fd, buffer.get() + done, want, r.offset + static_cast<off_t>(done));
          if (got <= 0) {
            failed = true;
            return;
          }
          done += static_cast<std::size_t>(got);
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int fd : fds) ::close(fd);
  if (failed) {
    std::fprintf(stderr, "read_files: a read failed\n");
    return 1;
  }
  std::printf("{\"files\": %zu, \"bytes\": %llu, \"seconds\": %.4f, \"bytes_per_second\": %.1f}\n",
              files.size(), static_cast<unsigned long long>(total), seconds,
              seconds > 0 ? static_cast<double>(total) / seconds : 0.0);
  return 0;
}
