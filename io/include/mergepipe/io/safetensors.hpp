#pragma once
// safetensors reading and writing (format facts: shared/reference/checkpoints.md).
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "mergepipe/checkpoint.hpp"
#include "mergepipe/tensor.hpp"

namespace mergepipe::io {

inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // as the reference reader

struct SafetensorsHeader {
  std::string path;
  std::uint64_t header_length = 0;  // N
  std::uint64_t data_begin = 0;     // 8 + N
  std::uint64_t file_size = 0;
  std::vector<StoredTensor> tensors;  // sorted by offset; offsets absolute, file = path
  std::map<std::string, std::string> metadata;
  std::string header_hash;  // hash128_hex of the 8 + N header bytes
};

// Validates and parses a header. `header` holds the file's first 8 + N bytes. Throws InputError
// naming `path` (and the tensor) for every malformed case: see docs/formats.md.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> header,
                                           std::uint64_t file_size, const std::string& path);
// Reads the first 8 + N bytes of `path` with positioned reads and parses them.
SafetensorsHeader read_safetensors_header(const std::string& path);

// Layout of a file to write: the header bytes and every tensor's absolute offset, computed from
// (name, dtype, shape) alone so several writers can fill one file. Tensor order is the reference
// writer's: dtype size descending, then name byte-wise; header padded with spaces to 8 bytes;
// `__metadata__` first (always containing "format": "pt").
struct SafetensorsLayout {
  std::string header_bytes;           // 8-byte length + JSON + padding
  std::vector<StoredTensor> tensors;  // in file order
  std::uint64_t file_size = 0;
};
SafetensorsLayout layout_safetensors(const std::vector<TensorInfo>& tensors,
                                     const std::map<std::string, std::string>& metadata = {});

// Convenience single-process writer: writes to a temp file in the same folder, fsyncs, renames.
// `data[i]` holds the bytes of `tensors[i]`.
void write_safetensors(const std::string& path, const std::vector<TensorInfo>& tensors,
                       const std::vector<std::span<const std::byte>>& data,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mergepipe::io
