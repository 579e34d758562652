#pragma once
// Scratch memory for O_DIRECT reads: the buffer address, the file offset and the length of a
// direct request must all be multiples of the device's logical block size (512 B or 4 KiB), so
// the buffer starts on a 4 KiB boundary. It keeps its capacity, so a reader thread allocates
// (and faults in) its scratch once.
#include <cstddef>
#include <cstdlib>
#include <memory>

namespace mergepipe::io {

inline constexpr std::size_t kDirectAlignment = 4096;

class AlignedBuffer {
 public:
  std::byte* data() noexcept { return data_.get(); }
  const std::byte* data() const noexcept { return data_.get(); }
  std::size_t capacity() const noexcept { return capacity_; }
  // At least n bytes; the contents are unspecified afterwards.
  void reserve(std::size_t n);

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t capacity_ = 0;
};

}  // namespace mergepipe::io
