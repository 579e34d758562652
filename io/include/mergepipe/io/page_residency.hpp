#pragma once
// How much of a file the page cache holds, from mincore(2) on a mapping that is never touched
// (mapping reads nothing; mincore reports only what is cached). Used to read a file around the
// cache (O_DIRECT) only when it is cold: a warm file is faster to copy from memory.
#include <cstdint>

#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

// Bytes of `file` in the page cache (whole pages). Throws IoError if it cannot be mapped.
std::uint64_t cached_bytes(const File& file);

}  // namespace mergepipe::io
