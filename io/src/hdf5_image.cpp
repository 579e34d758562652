#include "mergepipe/io/hdf5_image.hpp"

#include <cstdint>
#include <cstring>

#include "mergepipe/io/hdf5_handle.hpp"

namespace mergepipe::io::h5 {

namespace {

constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

std::uint32_t rotate(std::uint32_t x, int k) {
  return (x << k) | (x >> (32 - k));
}

std::uint32_t load_le32(const std::byte* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

}  // namespace

hid_t in_memory_file_access(hid_t fapl, std::size_t increment, const std::string& context) {
  check_status(H5Pset_fapl_core(fapl, increment, /*backing_store=*/false), "H5Pset_fapl_core",
               context);
  return fapl;
}

std::uint32_t hdf5_metadata_checksum(std::span<const std::byte> bytes) {
  std::size_t length = bytes.size();
  const std::byte* k = bytes.data();
  std::uint32_t a, b, c;
  a = b = c = 0xdeadbeef + static_cast<std::uint32_t>(length);
  while (length > 12) {
    a += load_le32(k);
    b += load_le32(k + 4);
    c += load_le32(k + 8);
    a -= c, a ^= rotate(c, 4), c += b;
    b -= a, b ^= rotate(a, 6), a += c;
    c -= b, c ^= rotate(b, 8), b += a;
    a -= c, a ^= rotate(c, 16), c += b;
    b -= a, b ^= rotate(a, 19), a += c;
    c -= b, c ^= rotate(b, 4), b += a;
    length -= 12;
    k += 12;
  }
  if (length == 0) return c;
  std::byte tail[12] = {};
  std::memcpy(tail, k, length);
  a += load_le32(tail);
  b += load_le32(tail + 4);
  c += load_le32(tail + 8);
  c ^= b, c -= rotate(b, 14);
  a ^= c, a -= rotate(c, 11);
  b ^= a, b -= rotate(a, 25);
  c ^= b, c -= rotate(b, 16);
  a ^= c, a -= rotate(c, 4);
  b ^= a, b -= rotate(a, 14);
  c ^= b, c -= rotate(b, 24);
  return c;
}

void repair_superblock_checksum(std::span<std::byte> image) {
  // Superblock v2/v3 at offset 0: signature, version, offset size, length size, status flags,
  // then four addresses (base, extension, end of file, root object header) and the checksum.
  if (image.size() < 12 || std::memcmp(image.data(), kSignature, sizeof kSignature) != 0) return;
  const auto version = static_cast<unsigned>(image[8]);
  if (version < 2) return;
  const std::size_t covered = 12 + 4 * static_cast<std::size_t>(image[9]);
  if (image.size() < covered + 4) return;
  const std::uint32_t sum = hdf5_metadata_checksum(image.first(covered));
  for (int i = 0; i < 4; ++i) image[covered + i] = static_cast<std::byte>((sum >> (8 * i)) & 0xff);
}

std::vector<std::byte> file_image(hid_t file, const std::string& context) {
  check_status(H5Fflush(file, H5F_SCOPE_GLOBAL), "H5Fflush", context);
  const ssize_t size = H5Fget_file_image(file, nullptr, 0);
  if (size < 0) check_status(-1, "H5Fget_file_image", context);
  std::vector<std::byte> image(static_cast<std::size_t>(size));
  if (H5Fget_file_image(file, image.data(), image.size()) != size)
    check_status(-1, "H5Fget_file_image", context);
  repair_superblock_checksum(image);
  return image;
}

}  // namespace mergepipe::io::h5
