#pragma once
// Memory in whole 2 MiB pages, 2 MiB aligned, that the kernel is asked to back with transparent
// huge pages (madvise; where THP is off it gets 4 KiB pages, which is only slower). Two reasons:
// - O_DIRECT transfers: a direct request carries one segment per physically contiguous piece
//   of memory, so a 128 KiB read into 4 KiB pages is 32 segments and a 4 MiB one is split at
//   the device's segment limit (254 on the test VM's virtio disk). There, cold O_DIRECT reads
//   of expert files by 8 threads in 4 MiB requests ran at 1.65-2.85 GB/s into 4 KiB pages and
//   at 3.27-7.05 GB/s into huge pages (bench/direct_memory_bench, docs/benchmarks.md).
// - Data scanned from memory: a VM's nested page walks make TLB misses expensive, and a 2 MiB
//   page covers 512 times the bytes of a 4 KiB one (docs/benchmarks.md, the retained windows).
// It keeps its capacity, so a user allocates (and faults in) its memory once.
#include <cstddef>
#include <memory>

namespace mergepipe {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

class HugePageBuffer {
 public:
  std::byte* data() noexcept { return data_.get(); }
  const std::byte* data() const noexcept { return data_.get(); }
  std::size_t capacity() const noexcept { return capacity_; }
  // At least n bytes, in whole huge pages; the contents are unspecified afterwards. The old
  // memory is released before the new is allocated. Throws std::bad_alloc.
  void reserve(std::size_t n);

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t capacity_ = 0;
};

}  // namespace mergepipe
