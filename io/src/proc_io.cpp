#include "mergepipe/io/proc_io.hpp"

#include <fstream>
#include <string>

namespace mergepipe::io {

KernelIoCounters read_kernel_io_counters() {
  KernelIoCounters c;
  std::ifstream in("/proc/self/io");
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value) {
    c.available = true;
    if (key == "rchar:") c.rchar = value;
    if (key == "wchar:") c.wchar = value;
    if (key == "read_bytes:") c.read_bytes = value;
    if (key == "write_bytes:") c.write_bytes = value;
  }
  return c;
}

}  // namespace mergepipe::io
