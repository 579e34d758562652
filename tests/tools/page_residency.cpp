// page_residency FILE...: prints "<resident bytes> <file>" per file, from mincore(2) on a mapping
// that is never touched (mapping does not read pages; mincore only reports the page cache).
// `page_residency --evict FILE...` drops the files' clean pages first (POSIX_FADV_DONTNEED).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  bool evict = argc > 1 && std::strcmp(argv[1], "--evict") == 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (int i = evict ? 2 : 1; i < argc; ++i) {
    const int fd = open(argv[i], O_RDONLY);
    if (fd < 0) {
      std::perror(argv[i]);
      return 1;
    }
    struct stat st {};
    fstat(fd, &st);
    if (evict) {
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    unsigned long long resident = 0;
    if (st.st_size > 0) {
      void* map = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (map == MAP_FAILED) {
        std::perror("mmap");
        return 1;
      }
      std::vector<unsigned char> vec(static_cast<size_t>((st.st_size + page - 1) / page));
      if (mincore(map, static_cast<size_t>(st.st_size), vec.data()) != 0) {
        std::perror("mincore");
        return 1;
      }
      for (unsigned char v : vec) resident += (v & 1) ? static_cast<unsigned long long>(page) : 0;
      munmap(map, static_cast<size_t>(st.st_size));
    }
    close(fd);
    std::printf("%llu %s\n", resident, argv[i]);
  }
  return 0;
}
