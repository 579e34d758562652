#pragma once
// Bytes moved per category, counted by the application at the read/write call sites
// (SPEC §2 manifest `bytes_read`). Thread-safe.
#include <atomic>
#include <cstdint>

namespace mergepipe::io {

enum class ByteCategory { kBase, kExpert, kCatalog, kOutputWritten, kOther };

struct ByteCounts {
  std::uint64_t base = 0, expert = 0, catalog = 0, output_written = 0, other = 0;
};

class ByteCounters {
 public:
  void add(ByteCategory category, std::uint64_t bytes);
  ByteCounts snapshot() const;
  void reset();

 private:
  std::atomic<std::uint64_t> base_{0}, expert_{0}, catalog_{0}, output_{0}, other_{0};
};

// Process-wide counters used by the readers and writers.
ByteCounters& global_byte_counters();

}  // namespace mergepipe::io
