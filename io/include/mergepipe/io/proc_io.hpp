#pragma once
// The kernel's own I/O accounting of this process (/proc/self/io), a cross-check of the bytes the
// application counts: rchar/wchar are bytes passed to read/write calls (page-cache hits
// included), read_bytes/write_bytes the bytes the process caused the storage to transfer.
#include <cstdint>

namespace mergepipe::io {

struct KernelIoCounters {
  std::uint64_t rchar = 0, wchar = 0, read_bytes = 0, write_bytes = 0;
  bool available = false;  // false where /proc/self/io cannot be read
};

KernelIoCounters read_kernel_io_counters();

}  // namespace mergepipe::io
