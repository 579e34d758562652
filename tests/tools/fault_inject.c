// LD_PRELOAD shim for the fault tests (tests/e2e/storage_faults.sh, rank_faults.sh): makes the
// C library calls of a process fail on chosen files, so the tests exercise real error paths of an
// unmodified mergepipe binary. Production code has no test hook. Configured by environment:
//
//   MERGEPIPE_FAULT_ENOSPC_PATH=PREFIX  write, pwrite, pwrite64, writev, pwritev, pwritev2 and
//   MERGEPIPE_FAULT_ENOSPC_AFTER=BYTES  fallocate (its length counts as written) on a file whose
//                                       path starts with PREFIX fail with ENOSPC once this
//                                       process has written BYTES (default 0) under PREFIX
//   MERGEPIPE_FAULT_EIO_FILE=PATH       the first MERGEPIPE_FAULT_EIO_COUNT (default 1) calls of
//   MERGEPIPE_FAULT_EIO_COUNT=N         read, pread, pread64, preadv, preadv2 on the file PATH
//                                       (its absolute, symlink-free path) fail with EIO
//   MERGEPIPE_FAULT_SLOW_PATH=PREFIX    read-family calls on files under PREFIX first sleep
//   MERGEPIPE_FAULT_SLOW_MS=MS          MS milliseconds (a tiny merge then lasts long enough to
//                                       be killed or raced, deterministically and without CPU)
//   MERGEPIPE_FAULT_SLOW_WRITE_PATH=P   write-family calls on files under P sleep the same way (a
//                                       merge's journal and shards: its progress is slowed
//                                       evenly, whatever its reads hold in memory)
//   MERGEPIPE_FAULT_SLOW_RENAME=TEXT    rename() of a path containing TEXT first sleeps
//                                       MERGEPIPE_FAULT_SLOW_MS (widens a publication window)
//   MERGEPIPE_FAULT_FLIP_FILE=PATH      pread, pread64, preadv and preadv2 of the file PATH return
//   MERGEPIPE_FAULT_FLIP_OFFSET=N       the byte at offset N with its lowest bit flipped (storage
//                                       that returns wrong data; the file itself is unchanged)
//   MERGEPIPE_FAULT_RANK=R              only in the MPI rank R (OMPI_COMM_WORLD_RANK or PMI_RANK)
//
// A file is recognised by its path in /proc/self/fd, so faults follow the file, not the call site.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static const char* enospc_prefix;
static long enospc_room;  // bytes still accepted under the prefix
static const char* eio_file;
static long eio_remaining;  // decremented atomically: ranks run reader threads
static const char* slow_prefix;
static const char* slow_write_prefix;
static const char* slow_rename;
static long slow_ms;
static const char* flip_file;
static long long flip_offset = -1;

// Read once, before main: the configuration never changes during a run.
__attribute__((constructor)) static void read_configuration(void) {
  const char* rank = getenv("MERGEPIPE_FAULT_RANK");
  if (rank) {
    const char* mine = getenv("OMPI_COMM_WORLD_RANK");
    if (!mine) mine = getenv("PMI_RANK");
    if (!mine || strcmp(mine, rank) != 0) return;  // mpirun itself, or another rank
  }
  enospc_prefix = getenv("MERGEPIPE_FAULT_ENOSPC_PATH");
  const char* room = getenv("MERGEPIPE_FAULT_ENOSPC_AFTER");
  enospc_room = room ? strtol(room, NULL, 10) : 0;
  eio_file = getenv("MERGEPIPE_FAULT_EIO_FILE");
  const char* count = getenv("MERGEPIPE_FAULT_EIO_COUNT");
  eio_remaining = count ? strtol(count, NULL, 10) : 1;
  slow_prefix = getenv("MERGEPIPE_FAULT_SLOW_PATH");
  slow_write_prefix = getenv("MERGEPIPE_FAULT_SLOW_WRITE_PATH");
  slow_rename = getenv("MERGEPIPE_FAULT_SLOW_RENAME");
  const char* ms = getenv("MERGEPIPE_FAULT_SLOW_MS");
  slow_ms = ms ? strtol(ms, NULL, 10) : 100;
  flip_file = getenv("MERGEPIPE_FAULT_FLIP_FILE");
  const char* flip = getenv("MERGEPIPE_FAULT_FLIP_OFFSET");
  flip_offset = flip ? strtoll(flip, NULL, 10) : -1;
}

static int fd_path(int fd, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, out, size - 1);
  if (n < 0) return 0;
  out[n] = '\0';
  return 1;
}

static int has_prefix(const char* path, const char* prefix) {
  return strncmp(path, prefix, strlen(prefix)) == 0;
}

static int write_fails(int fd, size_t bytes) {
  if (!enospc_prefix) return 0;
  char path[PATH_MAX];
  if (!fd_path(fd, path, sizeof path)) return 0;
  if (!has_prefix(path, enospc_prefix)) return 0;
  if (__atomic_sub_fetch(&enospc_room, (long)bytes, __ATOMIC_RELAXED) >= 0) return 0;
  errno = ENOSPC;
  return 1;
}

static size_t iov_bytes(const struct iovec* iov, int count) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += iov[i].iov_len;
  return total;
}

static void sleep_under(const char* prefix, int fd) {
  if (!prefix) return;
  char path[PATH_MAX];
  if (fd_path(fd, path, sizeof path) && has_prefix(path, prefix)) usleep(slow_ms * 1000);
}

static void slow_down(int fd) { sleep_under(slow_prefix, fd); }

static int read_fails(int fd) {
  if (!eio_file || __atomic_load_n(&eio_remaining, __ATOMIC_RELAXED) <= 0) return 0;
  char path[PATH_MAX];
  if (!fd_path(fd, path, sizeof path) || strcmp(path, eio_file) != 0) return 0;
  if (__atomic_sub_fetch(&eio_remaining, 1, __ATOMIC_RELAXED) < 0) return 0;
  errno = EIO;
  return 1;
}

// Flips the chosen byte in what a positioned read of `got` bytes at `offset` returned.
static void flip_read(int fd, const struct iovec* iov, int count, off_t offset, ssize_t got) {
  if (!flip_file || got <= 0 || flip_offset < offset || flip_offset >= offset + got) return;
  char path[PATH_MAX];
  if (!fd_path(fd, path, sizeof path) || strcmp(path, flip_file) != 0) return;
  long long at = flip_offset - offset;
  for (int i = 0; i < count; ++i) {
    if (at < (long long)iov[i].iov_len) {
      ((unsigned char*)iov[i].iov_base)[at] ^= 0x01;
      return;
    }
    at -= (long long)iov[i].iov_len;
  }
}
static ssize_t flipped(int fd, void* buf, off_t offset, ssize_t got) {
  const struct iovec one = {buf, got > 0 ? (size_t)got : 0};
  flip_read(fd, &one, 1, offset, got);
  return got;
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ssize_t write(int fd, const void* buf, size_t n) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, n)) return -1;
  return NEXT(write)(fd, buf, n);
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, n)) return -1;
  return NEXT(pwrite)(fd, buf, n, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t offset) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, n)) return -1;
  return NEXT(pwrite64)(fd, buf, n, offset);
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, iov_bytes(iov, count))) return -1;
  return NEXT(writev)(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t offset) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, iov_bytes(iov, count))) return -1;
  return NEXT(pwritev)(fd, iov, count, offset);
}

ssize_t pwritev2(int fd, const struct iovec* iov, int count, off_t offset, int flags) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, iov_bytes(iov, count))) return -1;
  return NEXT(pwritev2)(fd, iov, count, offset, flags);
}

int fallocate(int fd, int mode, off_t offset, off_t length) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, (size_t)length)) return -1;
  return NEXT(fallocate)(fd, mode, offset, length);
}

int fallocate64(int fd, int mode, off64_t offset, off64_t length) {
  sleep_under(slow_write_prefix, fd);
  if (write_fails(fd, (size_t)length)) return -1;
  return NEXT(fallocate64)(fd, mode, offset, length);
}

ssize_t read(int fd, void* buf, size_t n) {
  slow_down(fd);
  if (read_fails(fd)) return -1;
  return NEXT(read)(fd, buf, n);
}

ssize_t pread(int fd, void* buf, size_t n, off_t offset) {
  slow_down(fd);
  if (read_fails(fd)) return -1;
  return flipped(fd, buf, offset, NEXT(pread)(fd, buf, n, offset));
}

ssize_t pread64(int fd, void* buf, size_t n, off64_t offset) {
  slow_down(fd);
  if (read_fails(fd)) return -1;
  return flipped(fd, buf, offset, NEXT(pread64)(fd, buf, n, offset));
}

ssize_t preadv(int fd, const struct iovec* iov, int count, off_t offset) {
  slow_down(fd);
  if (read_fails(fd)) return -1;
  const ssize_t got = NEXT(preadv)(fd, iov, count, offset);
  flip_read(fd, iov, count, offset, got);
  return got;
}

ssize_t preadv2(int fd, const struct iovec* iov, int count, off_t offset, int flags) {
  slow_down(fd);
  if (read_fails(fd)) return -1;
  const ssize_t got = NEXT(preadv2)(fd, iov, count, offset, flags);
  flip_read(fd, iov, count, offset, got);
  return got;
}

int rename(const char* from, const char* to) {
  if (slow_rename && strstr(from, slow_rename)) usleep(slow_ms * 1000);
  return NEXT(rename)(from, to);
}
