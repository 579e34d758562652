#pragma once
// Scratch memory for O_DIRECT transfers: the buffer address, the file offset and the length of
// a direct request must all be multiples of the device's logical block size (512 B or 4 KiB).
// Huge-page memory satisfies that and keeps a request's segments few (huge_page_buffer.hpp).
#include <cstddef>

#include "mergepipe/huge_page_buffer.hpp"

namespace mergepipe::io {

inline constexpr std::size_t kDirectAlignment = 4096;
static_assert(kHugePageBytes % kDirectAlignment == 0);

using AlignedBuffer = HugePageBuffer;

}  // namespace mergepipe::io
