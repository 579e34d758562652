#include "mergepipe/io/byte_counters.hpp"

namespace mergepipe::io {

void ByteCounters::add(ByteCategory category, std::uint64_t bytes) {
  switch (category) {
    case ByteCategory::kBase:
      base_ += bytes;
      break;
    case ByteCategory::kExpert:
      expert_ += bytes;
      break;
    case ByteCategory::kCatalog:
      catalog_ += bytes;
      break;
    case ByteCategory::kOutputWritten:
      output_ += bytes;
      break;
    case ByteCategory::kOther:
      other_ += bytes;
      break;
  }
}

ByteCounts ByteCounters::snapshot() const {
  return {base_.load(), expert_.load(), catalog_.load(), output_.load(), other_.load()};
}

void ByteCounters::reset() {
  base_ = 0;
  expert_ = 0;
  catalog_ = 0;
  output_ = 0;
  other_ = 0;
}

ByteCounters& global_byte_counters() {
  static ByteCounters counters;
  return counters;
}

}  // namespace mergepipe::io
