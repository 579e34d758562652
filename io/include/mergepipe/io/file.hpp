#pragma once
// RAII file descriptor with positioned, retried reads and writes. Every error names the file.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "mergepipe/checkpoint.hpp"
#include "mergepipe/io/aligned_buffer.hpp"

namespace mergepipe::io {

class File {
 public:
  enum class Mode {
    kRead,
    kCreateWrite /* O_CREAT|O_TRUNC */,
    kReadWrite /* O_CREAT, no trunc */,
    kAppend /* O_CREAT|O_APPEND: each write lands whole at the end */,
    kCreateNew /* O_CREAT|O_EXCL|O_NOFOLLOW: a new file, never an existing one or a link */
  };
  File() = default;
  File(const std::string& path, Mode mode);  // throws IoError (missing file, permissions, ...)
  // Opens for reading with O_DIRECT: reads go from the device to our buffer, bypassing the page
  // cache. Returns a closed File when the file system refuses O_DIRECT (open fails with EINVAL);
  // other failures throw IoError.
  static File open_direct(const std::string& path);
  // The same for writing an existing file (no O_CREAT, no truncation).
  static File open_direct_write(const std::string& path);
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Reads exactly dst.size() bytes at offset (loops over short reads, retries EINTR/EAGAIN and a
  // bounded number of EIO). Throws IoError naming file and offset; InputError if the file ends
  // early.
  void read_at(std::uint64_t offset, std::span<std::byte> dst) const;
  // The same on a File from open_direct, at any offset and length: reads the enclosing 4 KiB
  // aligned range into `scratch` and copies `dst` out of it. Returns false, having read
  // nothing, when the device refuses the aligned request (EINVAL: a logical block larger than
  // 4 KiB); the caller then reads through the page cache.
  bool read_at_direct(std::uint64_t offset, std::span<std::byte> dst, AlignedBuffer& scratch) const;
  // The same without the scratch: the device writes the enclosing aligned range straight into
  // the memory around `dst`, so dst.data() - offset % kDirectAlignment must be aligned and the
  // memory up to the next boundary after dst's end writable (its bytes become the file's).
  bool read_direct_in_place(std::uint64_t offset, std::span<std::byte> dst) const;
  void write_at(std::uint64_t offset, std::span<const std::byte> src) const;
  // write_at on a File from open_direct_write: offset, src.data() and src.size() must be
  // multiples of kDirectAlignment. Returns false, having written nothing, when the device
  // refuses the request (EINVAL); the caller then writes through the page cache.
  bool write_direct_at(std::uint64_t offset, std::span<const std::byte> src) const;
  // Reserves the file's blocks up to `size` and makes it at least that long (fallocate): a full
  // disk fails here, before anything is written. A file system without fallocate is left as it
  // is.
  void preallocate(std::uint64_t size) const;
  // kAppend files: one write(2) of all of `src` (short writes are an IoError, never retried in
  // pieces, so a record is either whole or torn at the very end of the file).
  void append(std::span<const std::byte> src) const;
  std::uint64_t size() const;
  void sync() const;  // fsync
  void truncate(std::uint64_t size) const;
  // posix_fadvise hints: don't prefetch beyond what we ask; drop pages after use.
  void advise_random() const;
  void advise_sequential() const;
  void drop_cache(std::uint64_t offset = 0, std::uint64_t length = 0) const;
  // Asks the kernel to start reading [offset, offset + length) into the page cache now.
  void will_need(std::uint64_t offset, std::uint64_t length) const;

  int fd() const noexcept { return fd_; }
  const std::string& path() const noexcept { return path_; }
  bool is_open() const noexcept { return fd_ >= 0; }

 private:
  // Reads into dst at offset until it is full or the file ends; returns the bytes read, or
  // SIZE_MAX on EINVAL when `einval_refused` (O_DIRECT alignment). Retries as read_at says.
  std::size_t read_until_end(std::uint64_t offset, std::span<std::byte> dst,
                             bool einval_refused) const;

  // open(2) with O_DIRECT and `access` (O_RDONLY, O_WRONLY); closed on EINVAL.
  static File open_with_direct(const std::string& path, int access);
  // Writes all of src at offset (retries as read_at says); returns false on EINVAL before
  // anything was written when `einval_refused` (O_DIRECT alignment).
  bool write_until_done(std::uint64_t offset, std::span<const std::byte> src,
                        bool einval_refused) const;
  int fd_ = -1;
  std::string path_;
};

// Size and mtime of a file (header_hash left empty). Throws IoError.
FileIdentity stat_identity(const std::string& path);
// Reads a whole small file (config.json, index, YAML). Throws IoError.
std::string read_text_file(const std::string& path);
// Writes a small file in full and fsyncs it.
void write_text_file(const std::string& path, const std::string& text);
// Replaces `path` as a whole: the text goes to a new temporary file beside it (created with
// O_EXCL | O_NOFOLLOW, so no link planted there is followed), fsynced, renamed over `path`. A
// reader sees the old file or the new one; a failure leaves the old one.
void write_file_atomically(const std::string& path, const std::string& text);
// A name for a temporary file beside `path` (in its folder, hidden):
// `.<name>.tmp-<host>-<pid>-<n>`. Unique across the nodes of a job sharing the folder (a pid alone
// is unique on one host only) and across calls in this process.
std::string temp_sibling_path(const std::string& path);
// fsync a directory (after renames inside it).
void sync_directory(const std::string& path);

}  // namespace mergepipe::io
