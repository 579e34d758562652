#pragma once
// How much of a file the page cache holds, from mincore(2) on a mapping that is never touched
// (mapping reads nothing; mincore reports only what is cached). Used to read a file around the
// cache (O_DIRECT) only when it is cold: a warm file is faster to copy from memory.
#include <cstdint>

#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

// Bytes of `file` in the page cache (whole pages). Throws IoError if it cannot be mapped. Costs
// a page-cache lookup per page (~16 ms for a 1.5 GB file).
std::uint64_t cached_bytes(const File& file);

// Whether the page cache holds at least half of `samples` pages spread evenly over the file: the
// --input-io auto test, cheap enough for every shard of every expert on every rank (~samples
// lookups instead of one per page).
bool mostly_cached(const File& file, int samples = 64);

// Whether every one of `samples` pages spread evenly over the file is in the page cache: reads
// of it will be copies from memory (the test by which --io-threads 0 picks one reader).
bool fully_cached(const File& file, int samples = 64);

}  // namespace mergepipe::io
