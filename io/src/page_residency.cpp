#include "mergepipe/io/page_residency.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe::io {

namespace {
class Mapping {
 public:
  Mapping(const File& file, std::size_t length) : length_(length) {
    address_ = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (address_ == MAP_FAILED)
      throw IoError(file.path() + ": cannot map to probe the page cache: " + std::strerror(errno));
  }
  ~Mapping() { ::munmap(address_, length_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* address() const noexcept { return address_; }

 private:
  void* address_ = nullptr;
  std::size_t length_ = 0;
};
}  // namespace

namespace {
std::uint64_t page_size() {
  return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}
}  // namespace

std::uint64_t cached_bytes(const File& file) {
  const std::uint64_t size = file.size();
  if (size == 0) return 0;
  const std::uint64_t page = page_size();
  const Mapping mapping(file, static_cast<std::size_t>(size));
  std::vector<unsigned char> resident(static_cast<std::size_t>((size + page - 1) / page));
  if (::mincore(mapping.address(), static_cast<std::size_t>(size), resident.data()) != 0)
    throw IoError(file.path() + ": mincore failed: " + std::strerror(errno));
  std::uint64_t pages = 0;
  for (unsigned char r : resident) pages += r & 1;
  return pages * page;
}

namespace {
// How many of `samples` pages, the middle page of each of `samples` equal stretches of the
// file, are in the page cache.
int resident_samples(const File& file, int samples) {
  const std::uint64_t size = file.size();
  if (size == 0 || samples < 1) return 0;
  const std::uint64_t page = page_size();
  const std::uint64_t pages = (size + page - 1) / page;
  const Mapping mapping(file, static_cast<std::size_t>(size));
  int resident = 0;
  for (int i = 0; i < samples; ++i) {
    const std::uint64_t index =
        (2 * static_cast<std::uint64_t>(i) + 1) * pages / (2 * static_cast<std::uint64_t>(samples));
    unsigned char r = 0;
    if (::mincore(static_cast<char*>(mapping.address()) + index * page, 1, &r) != 0)
      throw IoError(file.path() + ": mincore failed: " + std::strerror(errno));
    resident += r & 1;
  }
  return resident;
}
}  // namespace

bool mostly_cached(const File& file, int samples) {
  return samples >= 1 && 2 * resident_samples(file, samples) >= samples;
}

bool fully_cached(const File& file, int samples) {
  return samples >= 1 && resident_samples(file, samples) == samples;
}

}  // namespace mergepipe::io
