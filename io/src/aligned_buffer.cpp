#include "mergepipe/io/aligned_buffer.hpp"

#include <new>

namespace mergepipe::io {

void AlignedBuffer::reserve(std::size_t n) {
  if (n <= capacity_) return;
  const std::size_t rounded = (n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kDirectAlignment, rounded));
  if (!p) throw std::bad_alloc();
  data_.reset(p);
  capacity_ = rounded;
}

}  // namespace mergepipe::io
