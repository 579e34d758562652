#include "mergepipe/io/hdf5_image.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string_view>

#include "checkpoint_test_util.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hdf5_handle.hpp"

using namespace mergepipe::io;
using mergepipe::test::TempDir;

namespace {

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace

TEST(Hdf5Image, MetadataChecksumIsJenkinsLookup3) {
  // Reference values from lookup3.c's self test (hashlittle with initval 0).
  EXPECT_EQ(h5::hdf5_metadata_checksum({}), 0xdeadbeefu);
  EXPECT_EQ(h5::hdf5_metadata_checksum(bytes_of("Four score and seven years ago")), 0x17770551u);
}

TEST(Hdf5Image, InMemoryFileWithV110SuperblockOpensFromDisk) {
  h5::silence_hdf5_errors();
  TempDir dir;
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), h5::Kind::kPropertyList);
  ASSERT_GE(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110), 0);
  h5::in_memory_file_access(fapl.get(), 1 << 16, "test");
  std::vector<std::byte> image;
  {
    h5::Handle file(H5Fcreate("in-memory.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                    h5::Kind::kFile);
    ASSERT_TRUE(file.valid());
    const hsize_t n = 3;
    const int values[3] = {7, 8, 9};
    h5::Handle space(H5Screate_simple(1, &n, nullptr), h5::Kind::kDataspace);
    h5::Handle data(H5Dcreate2(file.get(), "x", H5T_STD_I32LE, space.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
                    h5::Kind::kDataset);
    ASSERT_GE(H5Dwrite(data.get(), H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0);
    data.reset();
    image = h5::file_image(file.get(), "test");
  }
  ASSERT_GE(image.size(), 48u);
  EXPECT_EQ(static_cast<int>(image[8]), 3);  // superblock version 3: checksummed
  const std::string path = dir.file("image.h5");
  File(path, File::Mode::kCreateWrite).write_at(0, image);
  h5::Handle reopened(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), h5::Kind::kFile);
  ASSERT_TRUE(reopened.valid()) << "the image fails HDF5's own checks";
  h5::Handle data(H5Dopen2(reopened.get(), "x", H5P_DEFAULT), h5::Kind::kDataset);
  int read[3] = {};
  ASSERT_GE(H5Dread(data.get(), H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, read), 0);
  EXPECT_EQ(read[2], 9);

  // A flipped checksum byte is what HDF5 rejects, and what the repair restores.
  image[44] ^= std::byte{0xff};
  h5::repair_superblock_checksum(image);
  File(path, File::Mode::kCreateWrite).write_at(0, image);
  h5::Handle again(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), h5::Kind::kFile);
  EXPECT_TRUE(again.valid());
}
