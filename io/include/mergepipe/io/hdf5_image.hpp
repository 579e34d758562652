#pragma once
// Whole-file images of in-memory HDF5 files (core driver without a backing store): the catalog is
// built in memory and written with ordinary positioned writes, so a full disk fails our write
// call with its errno instead of HDF5's close (a failed H5Fclose leaves the file open inside the
// library, which then crashes at exit trying to flush it again).
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mergepipe::io::h5 {

// A file-access property list for an in-memory file growing in steps of `increment` bytes.
hid_t in_memory_file_access(hid_t fapl, std::size_t increment, const std::string& context);

// Flushes `file` and returns its image, ready to be written to disk as is. IoError on failure.
std::vector<std::byte> file_image(hid_t file, const std::string& context);

// HDF5 1.10's H5Fget_file_image clears a version 2/3 superblock's status flags in the image but
// keeps the checksum computed with them set, so the image fails its own checksum when opened.
// Recomputes that checksum (Jenkins' lookup3, as HDF5 does); older superblocks have none.
void repair_superblock_checksum(std::span<std::byte> image);

// Jenkins' lookup3 `hashlittle` with initial value 0: HDF5's metadata checksum.
std::uint32_t hdf5_metadata_checksum(std::span<const std::byte> bytes);

}  // namespace mergepipe::io::h5
