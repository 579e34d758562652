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

std::uint64_t cached_bytes(const File& file) {
  const std::uint64_t size = file.size();
  if (size == 0) return 0;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const Mapping mapping(file, static_cast<std::size_t>(size));
  std::vector<unsigned char> resident(static_cast<std::size_t>((size + page - 1) / page));
  if (::mincore(mapping.address(), static_cast<std::size_t>(size), resident.data()) != 0)
    throw IoError(file.path() + ": mincore failed: " + std::strerror(errno));
  std::uint64_t pages = 0;
  for (unsigned char r : resident) pages += r & 1;
  return pages * page;
}

}  // namespace mergepipe::io
