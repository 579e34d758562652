// page_residency FILE...: prints "<resident bytes> <file>" per file (io::cached_bytes: mincore on
// an untouched mapping). `page_residency --evict FILE...` drops the files' clean pages first
// (POSIX_FADV_DONTNEED).
#include <cstdio>
#include <cstring>
#include <exception>

#include "mergepipe/io/file.hpp"
#include "mergepipe/io/page_residency.hpp"

int main(int argc, char** argv) {
  using mergepipe::io::File;
  const bool evict = argc > 1 && std::strcmp(argv[1], "--evict") == 0;
  try {
    for (int i = evict ? 2 : 1; i < argc; ++i) {
      File file(argv[i], File::Mode::kRead);
      if (evict) file.drop_cache();
      std::printf("%llu %s\n", static_cast<unsigned long long>(mergepipe::io::cached_bytes(file)),
                  argv[i]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "page_residency: %s\n", e.what());
    return 1;
  }
  return 0;
}
