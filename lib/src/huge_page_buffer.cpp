#include "mergepipe/huge_page_buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace mergepipe {

void HugePageBuffer::Free::operator()(std::byte* p) const noexcept {
  std::free(p);
}

void HugePageBuffer::reserve(std::size_t n) {
  if (n <= capacity_) return;
  data_.reset();
  capacity_ = 0;
  const std::size_t rounded = (n + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kHugePageBytes, rounded));
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  (void)::madvise(p, rounded, MADV_HUGEPAGE);  // a refusal only costs speed
#endif
  data_.reset(p);
  capacity_ = rounded;
}

}  // namespace mergepipe
