#include "mergepipe/io/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "mergepipe/error.hpp"

namespace mergepipe::io {

namespace {
constexpr int kMaxIoRetries = 3;                 // for EIO on shared storage
constexpr std::size_t kMaxRequest = 1ull << 30;  // keep single requests under 2 GiB

// Shared storage often recovers from a transient EIO within a second: wait 10, 100, 1000 ms.
void backoff(int attempt) {
  std::this_thread::sleep_for(std::chrono::milliseconds(attempt == 1   ? 10
                                                        : attempt == 2 ? 100
                                                                       : 1000));
}

std::string errno_text(int err) {
  return std::strerror(err);
}

[[noreturn]] void throw_open_error(const std::string& path, int err) {
  throw IoError(path + ": cannot open: " + errno_text(err));
}
}  // namespace

File::File(const std::string& path, Mode mode) : path_(path) {
  int flags = O_CLOEXEC;
  switch (mode) {
    case Mode::kRead:
      flags |= O_RDONLY;
      break;
    case Mode::kCreateWrite:
      flags |= O_WRONLY | O_CREAT | O_TRUNC;
      break;
    case Mode::kReadWrite:
      flags |= O_RDWR | O_CREAT;
      break;
    case Mode::kCreateNew:
      flags |= O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;
      break;
    case Mode::kAppend:
      flags |= O_WRONLY | O_CREAT | O_APPEND;
      break;
  }
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) throw_open_error(path, errno);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

File File::open_with_direct(const std::string& path, int access) {
  File file;
  file.path_ = path;
  file.fd_ = ::open(path.c_str(), access | O_DIRECT | O_CLOEXEC);
  if (file.fd_ < 0 && errno != EINVAL) throw_open_error(path, errno);
  return file;
}

File File::open_direct(const std::string& path) {
  return open_with_direct(path, O_RDONLY);
}

File File::open_direct_write(const std::string& path) {
  return open_with_direct(path, O_WRONLY);
}

std::size_t File::read_until_end(std::uint64_t offset, std::span<std::byte> dst,
                                 bool einval_refused) const {
  std::size_t done = 0;
  int eio_retries = 0;
  while (done < dst.size()) {
    const std::size_t want = std::min(kMaxRequest, dst.size() - done);
    const ssize_t got = ::pread(fd_, dst.data() + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN) continue;
      if (err == EIO && ++eio_retries <= kMaxIoRetries) {
        backoff(eio_retries);
        continue;
      }
      if (err == EINVAL && einval_refused) return SIZE_MAX;
      throw IoError(path_ + ": read of " + std::to_string(want) + " bytes at offset " +
                    std::to_string(offset + done) + " failed: " + errno_text(err));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

namespace {
[[noreturn]] void throw_truncated(const std::string& path, std::uint64_t at,
                                  std::uint64_t missing) {
  throw InputError(path + ": file ends at offset " + std::to_string(at) + " but " +
                   std::to_string(missing) + " more bytes were expected (truncated?)");
}
}  // namespace

void File::read_at(std::uint64_t offset, std::span<std::byte> dst) const {
  const std::size_t got = read_until_end(offset, dst, false);
  if (got < dst.size()) throw_truncated(path_, offset + got, dst.size() - got);
}

bool File::read_at_direct(std::uint64_t offset, std::span<std::byte> dst,
                          AlignedBuffer& scratch) const {
  const std::uint64_t begin = offset / kDirectAlignment * kDirectAlignment;
  const std::uint64_t end = offset + dst.size();
  const std::uint64_t aligned_end =
      (end + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  const std::size_t length = static_cast<std::size_t>(aligned_end - begin);
  scratch.reserve(length);
  // A direct read past the end of the file returns the bytes up to it, so reading whole
  // aligned pages is safe for the last tensor of a file.
  const std::size_t got = read_until_end(begin, std::span(scratch.data(), length), true);
  if (got == SIZE_MAX) return false;
  if (begin + got < end) throw_truncated(path_, begin + got, end - (begin + got));
  std::memcpy(dst.data(), scratch.data() + (offset - begin), dst.size());
  return true;
}

bool File::read_direct_in_place(std::uint64_t offset, std::span<std::byte> dst) const {
  const std::uint64_t begin = offset / kDirectAlignment * kDirectAlignment;
  const std::uint64_t end = offset + dst.size();
  const std::uint64_t aligned_end =
      (end + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  std::byte* aligned = dst.data() - (offset - begin);
  if (reinterpret_cast<std::uintptr_t>(aligned) % kDirectAlignment != 0)
    throw IoError(path_ + ": in-place direct read into unaligned memory (a bug)");
  const std::size_t got = read_until_end(
      begin, std::span(aligned, static_cast<std::size_t>(aligned_end - begin)), true);
  if (got == SIZE_MAX) return false;
  if (begin + got < end) throw_truncated(path_, begin + got, end - (begin + got));
  return true;
}

void File::write_at(std::uint64_t offset, std::span<const std::byte> src) const {
  (void)write_until_done(offset, src, false);
}

bool File::write_direct_at(std::uint64_t offset, std::span<const std::byte> src) const {
  return write_until_done(offset, src, true);
}

void File::preallocate(std::uint64_t size) const {
  if (::fallocate(fd_, 0, 0, static_cast<off_t>(size)) == 0) return;
  const int err = errno;
  if (err == EOPNOTSUPP || err == ENOSYS) return;
  throw IoError(path_ + ": cannot reserve " + std::to_string(size) + " bytes: " + errno_text(err));
}

bool File::write_until_done(std::uint64_t offset, std::span<const std::byte> src,
                            bool einval_refused) const {
  std::size_t done = 0;
  int eio_retries = 0;
  while (done < src.size()) {
    const std::size_t want = std::min(kMaxRequest, src.size() - done);
    const ssize_t put = ::pwrite(fd_, src.data() + done, want, static_cast<off_t>(offset + done));
    if (put < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN) continue;
      if (err == EIO && ++eio_retries <= kMaxIoRetries) {
        backoff(eio_retries);
        continue;
      }
      if (err == EINVAL && einval_refused && done == 0) return false;
      throw IoError(path_ + ": write of " + std::to_string(want) + " bytes at offset " +
                    std::to_string(offset + done) + " failed: " + errno_text(err));
    }
    if (put == 0)
      throw IoError(path_ + ": write of " + std::to_string(want) + " bytes at offset " +
                    std::to_string(offset + done) + " wrote nothing (disk full?)");
    done += static_cast<std::size_t>(put);
  }
  return true;
}

void File::append(std::span<const std::byte> src) const {
  for (;;) {
    const ssize_t put = ::write(fd_, src.data(), src.size());
    if (put < 0 && errno == EINTR) continue;
    if (put < 0)
      throw IoError(path_ + ": append of " + std::to_string(src.size()) +
                    " bytes failed: " + errno_text(errno));
    if (static_cast<std::size_t>(put) != src.size())
      throw IoError(path_ + ": append of " + std::to_string(src.size()) + " bytes wrote only " +
                    std::to_string(put) + " (disk full?)");
    return;
  }
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw IoError(path_ + ": cannot stat: " + errno_text(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

void File::sync() const {
  if (::fsync(fd_) != 0) throw IoError(path_ + ": fsync failed: " + errno_text(errno));
}

void File::truncate(std::uint64_t size) const {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    throw IoError(path_ + ": cannot resize to " + std::to_string(size) +
                  " bytes: " + errno_text(errno));
}

void File::advise_random() const {
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
}

void File::advise_sequential() const {
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

void File::will_need(std::uint64_t offset, std::uint64_t length) const {
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                        POSIX_FADV_WILLNEED);
}

void File::drop_cache(std::uint64_t offset, std::uint64_t length) const {
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                        POSIX_FADV_DONTNEED);
}

FileIdentity stat_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw IoError(path + ": cannot stat: " + errno_text(errno));
  FileIdentity id;
  id.path = path;
  id.size = static_cast<std::uint64_t>(st.st_size);
  id.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  id.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
  return id;
}

std::string read_text_file(const std::string& path) {
  File f(path, File::Mode::kRead);
  std::string text(f.size(), '\0');
  f.read_at(0, std::as_writable_bytes(std::span(text.data(), text.size())));
  return text;
}

void write_text_file(const std::string& path, const std::string& text) {
  File f(path, File::Mode::kCreateWrite);
  f.write_at(0, std::as_bytes(std::span(text.data(), text.size())));
  f.sync();
}

std::string temp_sibling_path(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  static const std::string host = [] {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0) return std::string("host");
    std::string h(name);
    for (char& c : h)
      if (c == '/' || c == '\0') c = '_';
    return h.empty() ? std::string("host") : h;
  }();
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + name + ".tmp-" + host + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = temp_sibling_path(path);
  File f(tmp, File::Mode::kCreateNew);
  try {
    f.write_at(0, std::as_bytes(std::span(text.data(), text.size())));
    f.sync();
  } catch (...) {
    (void)::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    (void)::unlink(tmp.c_str());
    throw IoError(path + ": cannot rename " + tmp + " into place: " + errno_text(err));
  }
  const std::size_t slash = path.rfind('/');
  sync_directory(slash == std::string::npos ? "." : path.substr(0, slash + 1));
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError(path + ": cannot open folder: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(path + ": fsync of folder failed: " + errno_text(err));
}

}  // namespace mergepipe::io
