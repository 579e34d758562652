#include "mergepipe/io/catalog_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>

#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/folder_lock.hpp"
#include "mergepipe/io/hdf5_handle.hpp"
#include "mergepipe/io/hdf5_image.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "strict_json.hpp"

namespace mergepipe::io {

namespace {

namespace fs = std::filesystem;
using h5::check_status;
using h5::checked;
using h5::Handle;
using h5::Kind;
using json = nlohmann::json;

// Chunks of about 1 MiB: whole small arrays in one chunk, large sketch arrays in several.
constexpr std::size_t kChunkBytes = 1u << 20;
constexpr unsigned kDeflateLevel = 4;

template <typename T>
struct H5Types;
template <>
struct H5Types<double> {
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
  static hid_t disk() { return H5T_IEEE_F64LE; }
};
template <>
struct H5Types<float> {
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
  static hid_t disk() { return H5T_IEEE_F32LE; }
};
template <>
struct H5Types<std::uint64_t> {
  static hid_t mem() { return H5T_NATIVE_UINT64; }
  static hid_t disk() { return H5T_STD_U64LE; }
};
template <>
struct H5Types<std::uint32_t> {
  static hid_t mem() { return H5T_NATIVE_UINT32; }
  static hid_t disk() { return H5T_STD_U32LE; }
};
template <>
struct H5Types<std::uint16_t> {
  static hid_t mem() { return H5T_NATIVE_UINT16; }
  static hid_t disk() { return H5T_STD_U16LE; }
};

std::string expert_group_name(std::size_t k) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%03zu", k);
  return buf;
}

constexpr std::size_t kCoreIncrement = 1 << 20;  // in-memory file growth step while writing

Handle file_access_plist(const std::string& path) {
  Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), Kind::kPropertyList, "H5Pcreate", path);
  // File locking fails on some shared file systems; a catalog is written once and then only read.
  check_status(H5Pset_file_locking(fapl.get(), false, true), "H5Pset_file_locking", path);
  return fapl;
}

Handle fixed_string_type(std::size_t size, const std::string& context) {
  Handle type = checked(H5Tcopy(H5T_C_S1), Kind::kDatatype, "H5Tcopy", context);
  check_status(H5Tset_size(type.get(), std::max<std::size_t>(size, 1)), "H5Tset_size", context);
  check_status(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "H5Tset_strpad", context);
  return type;
}

// ---------------------------------------------------------------------------------------------
// Writing

// Builds the file in memory (see hdf5_image.hpp); finish() returns its bytes for the caller to
// write, so a full disk is reported by our own write with its errno.
class H5Writer {
 public:
  explicit H5Writer(const std::string& path) : path_(path) {
    h5::silence_hdf5_errors();
    Handle fapl = file_access_plist(path);
    h5::in_memory_file_access(fapl.get(), kCoreIncrement, path);
    // The 1.10 object formats (readable by HDF5 >= 1.10, h5py and h5dump of this stack) index a
    // single-chunk dataset without a B-tree: several KiB less per dataset.
    check_status(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110),
                 "H5Pset_libver_bounds", path);
    file_ = checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), Kind::kFile,
                    "H5Fcreate", path);
    deflate_ = H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0 && H5Zfilter_avail(H5Z_FILTER_SHUFFLE) > 0;
  }

  hid_t root() const { return file_.get(); }

  Handle group(hid_t parent, const std::string& name, const std::string& full_name) {
    return checked(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   Kind::kGroup, "H5Gcreate2", where(full_name));
  }

  // A chunked dataset of shape [n] or [n, cols]; dimension 0 is extensible. Chunks of about
  // kChunkBytes, or of `chunk_rows` rows (for datasets read a row at a time).
  template <typename T>
  void dataset(hid_t loc, const std::string& name, const std::string& full_name,
               std::span<const T> data, std::size_t cols = 0, std::size_t chunk_rows = 0) {
    write_raw(loc, name, full_name, H5Types<T>::mem(), H5Types<T>::disk(), sizeof(T), data.data(),
              cols == 0 ? data.size() : data.size() / cols, cols, chunk_rows);
  }

  void strings(hid_t loc, const std::string& name, const std::string& full_name,
               const std::vector<std::string>& values) {
    std::size_t width = 1;
    for (const auto& v : values) width = std::max(width, v.size());
    std::string packed(values.size() * width, '\0');
    for (std::size_t i = 0; i < values.size(); ++i)
      std::memcpy(packed.data() + i * width, values[i].data(), values[i].size());
    Handle type = fixed_string_type(width, where(full_name));
    write_raw(loc, name, full_name, type.get(), type.get(), width, packed.data(), values.size(), 0,
              0);
  }

  void attribute(hid_t loc, const std::string& name, std::uint64_t value,
                 const std::string& owner) {
    const std::string ctx = where(owner + "@" + name);
    Handle space = checked(H5Screate(H5S_SCALAR), Kind::kDataspace, "H5Screate", ctx);
    Handle attr =
        checked(H5Acreate2(loc, name.c_str(), H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                Kind::kAttribute, "H5Acreate2", ctx);
    check_status(H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value), "H5Awrite", ctx);
  }

  void attribute(hid_t loc, const std::string& name, const std::string& value,
                 const std::string& owner) {
    const std::string ctx = where(owner + "@" + name);
    Handle type = fixed_string_type(value.size(), ctx);
    Handle space = checked(H5Screate(H5S_SCALAR), Kind::kDataspace, "H5Screate", ctx);
    Handle attr =
        checked(H5Acreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                Kind::kAttribute, "H5Acreate2", ctx);
    std::string buf = value;
    buf.resize(std::max<std::size_t>(value.size(), 1), '\0');
    check_status(H5Awrite(attr.get(), type.get(), buf.data()), "H5Awrite", ctx);
  }

  // The complete file image; the in-memory file is closed.
  std::vector<std::byte> finish() {
    std::vector<std::byte> image = h5::file_image(file_.get(), path_);
    if (!file_.reset()) throw IoError("HDF5 H5Fclose failed for " + path_);
    return image;
  }

 private:
  std::string where(const std::string& object) const { return path_ + ":" + object; }

  void write_raw(hid_t loc, const std::string& name, const std::string& full_name, hid_t mem_type,
                 hid_t disk_type, std::size_t elem_size, const void* data, std::size_t rows,
                 std::size_t cols, std::size_t chunk_rows) {
    const std::string ctx = where(full_name);
    const int rank = cols == 0 ? 1 : 2;
    const hsize_t dims[2] = {rows, cols};
    const hsize_t maxdims[2] = {H5S_UNLIMITED, cols};
    const std::size_t row_bytes = elem_size * (cols == 0 ? 1 : cols);
    if (chunk_rows == 0) chunk_rows = kChunkBytes / row_bytes;
    const hsize_t chunk[2] = {
        std::max<std::size_t>(1, std::min<std::size_t>(std::max<std::size_t>(rows, 1), chunk_rows)),
        cols};
    Handle space =
        checked(H5Screate_simple(rank, dims, maxdims), Kind::kDataspace, "H5Screate_simple", ctx);
    Handle dcpl = checked(H5Pcreate(H5P_DATASET_CREATE), Kind::kPropertyList, "H5Pcreate", ctx);
    check_status(H5Pset_chunk(dcpl.get(), rank, chunk), "H5Pset_chunk", ctx);
    if (deflate_) {
      check_status(H5Pset_shuffle(dcpl.get()), "H5Pset_shuffle", ctx);
      check_status(H5Pset_deflate(dcpl.get(), kDeflateLevel), "H5Pset_deflate", ctx);
    }
    Handle dset = checked(
        H5Dcreate2(loc, name.c_str(), disk_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        Kind::kDataset, "H5Dcreate2", ctx);
    if (rows > 0) {
      check_status(H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite",
                   ctx);
    }
  }

  std::string path_;
  Handle file_;
  bool deflate_ = false;
};

void write_location(H5Writer& w, hid_t group, const std::string& group_name,
                    const CheckpointLocation& loc) {
  w.dataset<std::uint32_t>(group, "tensor_file", group_name + "/tensor_file", loc.tensor_file);
  w.dataset<std::uint64_t>(group, "tensor_offset", group_name + "/tensor_offset",
                           loc.tensor_offset);
}

void write_h5(const Catalog& c, const std::string& path) {
  H5Writer w(path);
  const hid_t root = w.root();
  w.attribute(root, "format", c.format, "/");
  w.attribute(root, "family_id", c.family_id, "/");
  w.attribute(root, "block_bytes", c.blocking.block_bytes, "/");
  w.attribute(root, "tensor_count", c.tensors.size(), "/");
  w.attribute(root, "block_count", c.block_count(), "/");
  w.attribute(root, "expert_count", c.expert_count(), "/");
  w.attribute(root, "norm_octaves", static_cast<std::uint64_t>(kNormOctaves), "/");
  w.attribute(root, "octave_bias", static_cast<std::uint64_t>(kOctaveBias), "/");
  w.attribute(root, "trim_grid_steps", static_cast<std::uint64_t>(kTrimGridSteps), "/");

  {
    Handle g = w.group(root, "tensors", "/tensors");
    std::vector<std::string> names, dtypes;
    std::vector<std::uint32_t> ndim;
    std::vector<std::uint64_t> dims;
    for (const TensorInfo& t : c.tensors) {
      names.push_back(t.name);
      dtypes.emplace_back(dtype_name(t.dtype));
      ndim.push_back(static_cast<std::uint32_t>(t.shape.size()));
      dims.insert(dims.end(), t.shape.begin(), t.shape.end());
    }
    w.strings(g.get(), "name", "/tensors/name", names);
    w.strings(g.get(), "dtype", "/tensors/dtype", dtypes);
    w.dataset<std::uint32_t>(g.get(), "ndim", "/tensors/ndim", ndim);
    w.dataset<std::uint64_t>(g.get(), "dims", "/tensors/dims", dims);
  }
  {
    Handle g = w.group(root, "blocks", "/blocks");
    const auto& blocks = c.blocking.blocks;
    std::vector<std::uint32_t> tensor(blocks.size());
    std::vector<std::uint64_t> eb(blocks.size()), ec(blocks.size()), bb(blocks.size()),
        bl(blocks.size());
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      tensor[b] = blocks[b].tensor;
      eb[b] = blocks[b].elem_begin;
      ec[b] = blocks[b].elem_count;
      bb[b] = blocks[b].byte_begin;
      bl[b] = blocks[b].byte_length;
    }
    w.dataset<std::uint32_t>(g.get(), "tensor", "/blocks/tensor", tensor);
    w.dataset<std::uint64_t>(g.get(), "elem_begin", "/blocks/elem_begin", eb);
    w.dataset<std::uint64_t>(g.get(), "elem_count", "/blocks/elem_count", ec);
    w.dataset<std::uint64_t>(g.get(), "byte_begin", "/blocks/byte_begin", bb);
    w.dataset<std::uint64_t>(g.get(), "byte_length", "/blocks/byte_length", bl);
  }
  {
    Handle g = w.group(root, "base", "/base");
    write_location(w, g.get(), "/base", c.base);
    if (!c.base_block_hashes.empty())
      w.dataset<std::uint64_t>(g.get(), "block_hash", "/base/block_hash", c.base_block_hashes);
  }
  Handle experts = w.group(root, "experts", "/experts");
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    const ExpertCatalog& e = c.experts[k];
    const std::string name = expert_group_name(k);
    const std::string gname = "/experts/" + name;
    Handle g = w.group(experts.get(), name, gname);
    const std::size_t nb = e.blocks.size();
    std::vector<double> l2(nb);
    std::vector<float> max_abs(nb), octaves(nb * kNormOctaves);
    std::vector<std::uint64_t> nonzero(nb), hash(nb);
    for (std::size_t b = 0; b < nb; ++b) {
      const BlockStats& s = e.blocks[b];
      l2[b] = s.l2;
      max_abs[b] = s.max_abs;
      nonzero[b] = s.nonzero;
      hash[b] = s.hash;
      std::copy(s.octave_sumsq.begin(), s.octave_sumsq.end(), octaves.begin() + b * kNormOctaves);
    }
    w.dataset<double>(g.get(), "block_l2", gname + "/block_l2", l2);
    w.dataset<float>(g.get(), "block_max_abs", gname + "/block_max_abs", max_abs);
    w.dataset<std::uint64_t>(g.get(), "block_nonzero", gname + "/block_nonzero", nonzero);
    w.dataset<std::uint64_t>(g.get(), "block_hash", gname + "/block_hash", hash);
    w.dataset<float>(g.get(), "block_octaves", gname + "/block_octaves", octaves, kNormOctaves);

    std::vector<std::uint64_t> offsets{0};
    std::vector<std::uint16_t> keys;
    std::vector<std::uint64_t> counts;
    // trim_thresholds[i - 1][t]: the threshold of tensor t at density i / kTrimGridSteps.
    const std::size_t nt = e.sketches.size();
    std::vector<float> grid_table(kTrimGridSteps * nt);
    for (std::size_t t = 0; t < nt; ++t) {
      const MagnitudeSketch& s = e.sketches[t];
      const auto k_keys = s.keys();
      const auto k_counts = s.counts();
      keys.insert(keys.end(), k_keys.begin(), k_keys.end());
      counts.insert(counts.end(), k_counts.begin(), k_counts.end());
      offsets.push_back(keys.size());
      const std::vector<float> grid =
          MagnitudeSketch::grid_thresholds(k_keys, k_counts, s.total(), kTrimGridSteps);
      for (std::size_t i = 0; i < kTrimGridSteps; ++i) grid_table[i * nt + t] = grid[i];
    }
    w.dataset<std::uint64_t>(g.get(), "sketch_offsets", gname + "/sketch_offsets", offsets);
    w.dataset<std::uint16_t>(g.get(), "sketch_keys", gname + "/sketch_keys", keys);
    // 32-bit counts when every count fits (a tensor of fewer than 2^32 entries): the loader
    // inflates and copies 6 bytes per bucket instead of 10.
    if (std::all_of(counts.begin(), counts.end(), [](std::uint64_t n) {
          return n <= std::numeric_limits<std::uint32_t>::max();
        })) {
      const std::vector<std::uint32_t> narrow(counts.begin(), counts.end());
      w.dataset<std::uint32_t>(g.get(), "sketch_counts", gname + "/sketch_counts", narrow);
    } else {
      w.dataset<std::uint64_t>(g.get(), "sketch_counts", gname + "/sketch_counts", counts);
    }
    if (nt > 0) {
      w.dataset<float>(g.get(), "trim_thresholds", gname + "/trim_thresholds", grid_table, nt, 1);
    }
    write_location(w, g.get(), gname, e.location);
    w.attribute(g.get(), "nonfinite", e.nonfinite, gname);
    w.attribute(g.get(), "dir", e.location.dir, gname);
  }
  experts.reset();
  const std::vector<std::byte> image = w.finish();
  File(path, File::Mode::kCreateWrite).write_at(0, image);
}

// ---------------------------------------------------------------------------------------------
// Reading

class H5Reader {
 public:
  explicit H5Reader(const std::string& path) : path_(path) {
    h5::silence_hdf5_errors();
    if (!fs::exists(path)) throw InputError(path + ": catalog file is missing");
    // Opening it ourselves first tells storage errors (exit 4, with errno) from damaged content.
    (void)File(path, File::Mode::kRead);
    const htri_t is_h5 = H5Fis_hdf5(path.c_str());
    if (is_h5 == 0) throw InputError(path + ": not an HDF5 file");
    Handle fapl = file_access_plist(path);
    const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (id < 0) throw InputError(path + ": HDF5 cannot open it (damaged or truncated catalog?)");
    file_ = Handle(id, Kind::kFile);
  }

  // True when every component of `object` (absolute, "/a/b/c") exists.
  bool exists(const std::string& object) const {
    std::size_t pos = 0;
    while ((pos = object.find('/', pos + 1)) != std::string::npos) {
      if (H5Lexists(file_.get(), object.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
    }
    return H5Lexists(file_.get(), object.c_str(), H5P_DEFAULT) > 0;
  }

  // Reads a dataset of shape [rows] (cols == 0) or [rows, cols]; rows == kAny accepts any length.
  static constexpr std::uint64_t kAny = ~0ull;
  template <typename T>
  std::vector<T> read(const std::string& object, std::uint64_t rows, std::uint64_t cols = 0) const {
    std::vector<T> out;
    read_into(object, rows, cols, out);
    return out;
  }
  // As read(), into `out`: a buffer reused for one dataset after another keeps its pages, which
  // a fresh one faults in again, page by page (costly in a VM).
  template <typename T>
  void read_into(const std::string& object, std::uint64_t rows, std::uint64_t cols,
                 std::vector<T>& out) const {
    Handle dset = open(object);
    const std::uint64_t n = check_shape(dset.get(), object, rows, cols);
    out.resize(n);
    if (n > 0) {
      check_status(
          H5Dread(dset.get(), H5Types<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
          "H5Dread", where(object));
    }
  }

  // Row `row` of a dataset of shape [rows, cols], into `out` (cols values).
  template <typename T>
  void read_row(const std::string& object, std::uint64_t rows, std::uint64_t cols,
                std::uint64_t row, std::vector<T>& out) const {
    Handle dset = open(object);
    check_shape(dset.get(), object, rows, cols);
    out.resize(cols);
    Handle file_space =
        checked(H5Dget_space(dset.get()), Kind::kDataspace, "H5Dget_space", where(object));
    const hsize_t start[2] = {row, 0}, count[2] = {1, cols};
    check_status(
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
        "H5Sselect_hyperslab", where(object));
    Handle mem_space = checked(H5Screate_simple(2, count, nullptr), Kind::kDataspace,
                               "H5Screate_simple", where(object));
    check_status(H5Dread(dset.get(), H5Types<T>::mem(), mem_space.get(), file_space.get(),
                         H5P_DEFAULT, out.data()),
                 "H5Dread", where(object));
  }

  bool has_attribute(const std::string& object, const std::string& name) const {
    return H5Aexists_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT) > 0;
  }

  // Bytes per element of an integer dataset as stored (the reader converts on request, but
  // reading the stored width saves a pass).
  std::size_t element_bytes(const std::string& object) const {
    Handle dset = open(object);
    Handle type = checked(H5Dget_type(dset.get()), Kind::kDatatype, "H5Dget_type", where(object));
    if (H5Tget_class(type.get()) != H5T_INTEGER)
      throw InputError(where(object) + ": expected integers");
    return H5Tget_size(type.get());
  }

  std::vector<std::string> read_strings(const std::string& object, std::uint64_t rows) const {
    Handle dset = open(object);
    const std::uint64_t n = check_shape(dset.get(), object, rows, 0);
    Handle type = checked(H5Dget_type(dset.get()), Kind::kDatatype, "H5Dget_type", where(object));
    if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) != 0) {
      throw InputError(where(object) + ": expected fixed-length strings");
    }
    const std::size_t width = H5Tget_size(type.get());
    Handle mem = fixed_string_type(width, where(object));
    std::string packed(n * width, '\0');
    if (n > 0) {
      check_status(H5Dread(dset.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()),
                   "H5Dread", where(object));
    }
    std::vector<std::string> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::string s = packed.substr(i * width, width);
      s.resize(std::strlen(s.c_str()));
      out[i] = std::move(s);
    }
    return out;
  }

  // Opens attribute `name` of `object`; InputError when it is missing.
  Handle open_attribute(const std::string& object, const std::string& name,
                        const std::string& ctx) const {
    if (H5Aexists_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT) <= 0) {
      throw InputError(ctx + ": attribute is missing");
    }
    return checked(
        H5Aopen_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
        Kind::kAttribute, "H5Aopen_by_name", ctx);
  }

  std::uint64_t attribute_u64(const std::string& object, const std::string& name) const {
    const std::string ctx = where(object + "@" + name);
    Handle attr = open_attribute(object, name, ctx);
    std::uint64_t value = 0;
    check_status(H5Aread(attr.get(), H5T_NATIVE_UINT64, &value), "H5Aread", ctx);
    return value;
  }

  std::string attribute_string(const std::string& object, const std::string& name) const {
    const std::string ctx = where(object + "@" + name);
    Handle attr = open_attribute(object, name, ctx);
    Handle type = checked(H5Aget_type(attr.get()), Kind::kDatatype, "H5Aget_type", ctx);
    if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) != 0) {
      throw InputError(ctx + ": expected a fixed-length string");
    }
    const std::size_t width = H5Tget_size(type.get());
    Handle mem = fixed_string_type(width, ctx);
    std::string buf(width, '\0');
    check_status(H5Aread(attr.get(), mem.get(), buf.data()), "H5Aread", ctx);
    buf.resize(std::strlen(buf.c_str()));
    return buf;
  }

  std::string where(const std::string& object) const { return path_ + ":" + object; }

 private:
  Handle open(const std::string& object) const {
    if (!exists(object)) throw InputError(where(object) + ": dataset is missing");
    return checked(H5Dopen2(file_.get(), object.c_str(), H5P_DEFAULT), Kind::kDataset, "H5Dopen2",
                   where(object));
  }

  std::uint64_t check_shape(hid_t dset, const std::string& object, std::uint64_t rows,
                            std::uint64_t cols) const {
    Handle space = checked(H5Dget_space(dset), Kind::kDataspace, "H5Dget_space", where(object));
    const int rank = H5Sget_simple_extent_ndims(space.get());
    const int want_rank = cols == 0 ? 1 : 2;
    hsize_t dims[2] = {0, 0};
    if (rank != want_rank || H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0) {
      throw InputError(where(object) + ": expected a " + std::to_string(want_rank) +
                       "-dimensional dataset");
    }
    if ((rows != kAny && dims[0] != rows) || (cols != 0 && dims[1] != cols)) {
      // Built with append: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.
      std::string want = "[";
      want.append(rows == kAny ? std::string("any") : std::to_string(rows));
      if (cols) want.append(", ").append(std::to_string(cols));
      std::string got = "[";
      got.append(std::to_string(dims[0]));
      if (cols) got.append(", ").append(std::to_string(dims[1]));
      throw InputError(where(object) + ": has shape " + got + "], expected " + want + "]");
    }
    return dims[0] * (cols == 0 ? 1 : cols);
  }

  std::string path_;
  Handle file_;
};

void read_location(const H5Reader& r, const std::string& group, std::size_t tensors,
                   CheckpointLocation& loc) {
  loc.tensor_file = r.read<std::uint32_t>(group + "/tensor_file", tensors);
  loc.tensor_offset = r.read<std::uint64_t>(group + "/tensor_offset", tensors);
}

// ---------------------------------------------------------------------------------------------
// JSON summary

json location_json(const CheckpointLocation& loc) {
  json files = json::array();
  for (std::size_t i = 0; i < loc.files.size(); ++i) {
    const FileIdentity& f = loc.files[i];
    files.push_back({{"name", i < loc.shard_names.size() ? loc.shard_names[i] : std::string()},
                     {"path", f.path},
                     {"size", f.size},
                     {"mtime_ns", f.mtime_ns},
                     {"ctime_ns", f.ctime_ns},
                     {"header_hash", f.header_hash}});
  }
  return {{"dir", loc.dir}, {"files", files}};
}

void parse_location(const json& j, CheckpointLocation& loc) {
  loc.dir = j.at("dir").get<std::string>();
  for (const json& f : j.at("files")) {
    loc.shard_names.push_back(f.at("name").get<std::string>());
    FileIdentity id;
    id.path = f.at("path").get<std::string>();
    id.size = f.at("size").get<std::uint64_t>();
    id.mtime_ns = f.at("mtime_ns").get<std::int64_t>();
    id.ctime_ns = f.value("ctime_ns", std::int64_t{0});  // absent before it was recorded
    id.header_hash = f.at("header_hash").get<std::string>();
    loc.files.push_back(std::move(id));
  }
}

std::uint64_t location_data_bytes(const Catalog& c) {
  std::uint64_t b = 0;
  for (const TensorInfo& t : c.tensors) b += t.nbytes();
  return b;
}

std::uint64_t zero_blocks(const ExpertCatalog& e) {
  std::uint64_t z = 0;
  for (const BlockStats& s : e.blocks) z += s.nonzero == 0;
  return z;
}

std::string summary_json(const Catalog& c, std::uint64_t catalog_bytes) {
  std::uint64_t base_bytes = 0;
  for (const FileIdentity& f : c.base.files) base_bytes += f.size;
  json experts = json::array();
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    const ExpertCatalog& e = c.experts[k];
    json j = location_json(e.location);
    j["group"] = "/experts/" + expert_group_name(k);
    j["nonfinite"] = e.nonfinite;
    j["zero_blocks"] = zero_blocks(e);
    experts.push_back(std::move(j));
  }
  const std::uint64_t family = c.family_bytes();
  json j = {
      {"format", c.format},
      {"tool_version", MERGEPIPE_VERSION},
      {"family_id", c.family_id},
      {"block_bytes", c.blocking.block_bytes},
      {"tensor_count", c.tensors.size()},
      {"block_count", c.block_count()},
      {"expert_count", c.expert_count()},
      {"base", location_json(c.base)},
      {"experts", experts},
      {"totals",
       {{"tensor_bytes_per_checkpoint", location_data_bytes(c)},
        {"base_bytes", base_bytes},
        {"expert_bytes", c.full_expert_bytes()},
        {"family_bytes", family},
        {"catalog_bytes", catalog_bytes},
        {"catalog_fraction",
         family ? static_cast<double>(catalog_bytes) / static_cast<double>(family) : 0.0},
        {"build_seconds", c.build_seconds}}},
  };
  return j.dump(2) + "\n";
}

void validate_for_save(const Catalog& c) {
  const std::size_t nt = c.tensors.size(), nb = c.block_count();
  const auto check_loc = [&](const CheckpointLocation& loc, const std::string& what) {
    if (loc.tensor_file.size() != nt || loc.tensor_offset.size() != nt ||
        loc.shard_names.size() != loc.files.size()) {
      throw std::invalid_argument("save_catalog: " + what + " location does not cover the tensors");
    }
  };
  check_loc(c.base, "base");
  for (const ExpertCatalog& e : c.experts) {
    check_loc(e.location, "expert " + e.location.dir);
    if (e.blocks.size() != nb || e.sketches.size() != nt) {
      throw std::invalid_argument("save_catalog: expert " + e.location.dir +
                                  " lacks block statistics or sketches");
    }
  }
}

// Removes a temporary file unless it was renamed into place.
class TempFile {
 public:
  explicit TempFile(fs::path path) : path_(std::move(path)) {}
  ~TempFile() {
    if (!path_.empty()) (void)::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const fs::path& path() const { return path_; }
  void rename_to(const fs::path& final_path) {
    if (::rename(path_.c_str(), final_path.c_str()) != 0) {
      throw IoError(final_path.string() + ": cannot rename " + path_.string() +
                    " into place: " + std::strerror(errno));
    }
    path_.clear();
  }

 private:
  fs::path path_;
};

fs::path target_path(const std::string& path) {
  fs::path p = fs::absolute(fs::path(path)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

fs::path temp_name(const fs::path& dir, const char* name) {
  return temp_sibling_path((dir / name).string());
}

}  // namespace

// -----------------------------------------------------------------------------------------------

bool is_catalog_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kCatalogJsonName, ec);
}

std::uint64_t catalog_size_bytes(const std::string& path) {
  const fs::path dir(path);
  return stat_identity((dir / kCatalogH5Name).string()).size +
         stat_identity((dir / kCatalogJsonName).string()).size;
}

void save_catalog(const Catalog& catalog, const std::string& path) {
  validate_for_save(catalog);
  const fs::path target = target_path(path);
  refuse_link_or_non_folder(target.string(), "catalog folder");
  std::error_code ec;
  if (fs::exists(target, ec) && !is_catalog_folder(target.string()) &&
      !holds_only_the_lock(target.string())) {
    throw UsageError(target.string() +
                     ": exists and is not a catalog folder; refusing to replace it");
  }
  fs::create_directories(target, ec);
  if (ec) throw IoError(target.string() + ": cannot create folder: " + ec.message());

  // Written beside the files they replace, then renamed over them, the .h5 first: the folder
  // keeps whatever else it holds, and a reader sees the old pair, the new pair, or a new .h5
  // with the old summary, which load_catalog refuses (their expert counts differ).
  TempFile h5(temp_name(target, kCatalogH5Name));
  TempFile summary(temp_name(target, kCatalogJsonName));
  write_h5(catalog, h5.path().string());
  File(h5.path().string(), File::Mode::kRead).sync();
  const std::uint64_t h5_size = stat_identity(h5.path().string()).size;

  // catalog_bytes includes the JSON itself, whose length depends on that number (and on the
  // printed fraction): grow the assumed length until the text fits, then pad with whitespace.
  std::size_t json_size = 0;
  std::string text;
  for (;;) {
    text = summary_json(catalog, h5_size + json_size);
    if (text.size() <= json_size) break;
    json_size = text.size();
  }
  text.insert(text.size() - 1, json_size - text.size(), ' ');
  write_text_file(summary.path().string(), text);
  h5.rename_to(target / kCatalogH5Name);
  summary.rename_to(target / kCatalogJsonName);
  sync_directory(target.string());
  sync_directory(target.parent_path().string());
}

std::vector<bool> selected_experts(const Catalog& c, const ExpertSelection& only) {
  std::vector<bool> selected(c.experts.size(), !only.has_value());
  if (only) {
    for (const int k : c.find_experts(*only))
      if (k >= 0) selected[static_cast<std::size_t>(k)] = true;
  }
  return selected;
}

Catalog load_catalog_summary(const std::string& path) {
  const fs::path dir(path);
  const std::string json_path = (dir / kCatalogJsonName).string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(path + ": no such catalog folder");
  if (!fs::exists(json_path, ec)) throw InputError(path + ": not a catalog (no catalog.json)");

  Catalog c;
  json summary;
  try {
    summary = json::parse(read_text_file(json_path));
    c.format = summary.at("format").get<std::string>();
    if (c.format != kCatalogFormat) {
      throw InputError(json_path + ": format '" + c.format + "' is not " + kCatalogFormat);
    }
    c.family_id = summary.at("family_id").get<std::string>();
    c.blocking.block_bytes = summary.at("block_bytes").get<std::uint64_t>();
    if (c.blocking.block_bytes == 0) throw InputError(json_path + ": block_bytes is 0");
    parse_location(summary.at("base"), c.base);
    for (const json& e : summary.at("experts")) {
      ExpertCatalog ex;
      parse_location(e, ex.location);
      ex.nonfinite = e.at("nonfinite").get<std::uint64_t>();
      c.experts.push_back(std::move(ex));
    }
    if (summary.contains("totals")) c.build_seconds = summary["totals"].value("build_seconds", 0.0);
  } catch (const json::exception& e) {
    throw InputError(json_path + ": malformed catalog summary: " + detail::json_error_text(e));
  }
  return c;
}

SketchLoad sketch_load_for(const MergeSpec& spec) {
  if (!uses_magnitude_trim(spec.method)) return SketchLoad::none();
  // Densities that vary by tensor take thresholds at any density, and breadcrumbs' band is not
  // on the stored grid: the sketches themselves.
  if (spec.varies_by_tensor() || uses_band_trim(spec.method)) return SketchLoad::sketches();
  std::vector<double> densities;
  for (const ExpertSpec& e : spec.experts) densities.push_back(e.density);
  return SketchLoad::thresholds(std::move(densities));
}

Catalog load_catalog(const std::string& path, const ExpertSelection& only,
                     const SketchLoad& sketches) {
  using Kind = SketchLoad::Kind;
  if (sketches.kind == Kind::kThresholds && (!only || only->size() != sketches.densities.size()))
    throw std::invalid_argument("load_catalog: thresholds need one density per selected folder");
  const fs::path dir(path);
  const std::string json_path = (dir / kCatalogJsonName).string();
  const std::string h5_path = (dir / kCatalogH5Name).string();
  Catalog c = load_catalog_summary(path);
  H5Reader r(h5_path);
  if (r.attribute_string("/", "format") != c.format ||
      r.attribute_string("/", "family_id") != c.family_id ||
      r.attribute_u64("/", "block_bytes") != c.blocking.block_bytes ||
      r.attribute_u64("/", "expert_count") != c.experts.size()) {
    throw InputError(path + ": catalog.h5 and catalog.json describe different catalogs");
  }
  if (r.attribute_u64("/", "norm_octaves") != static_cast<std::uint64_t>(kNormOctaves) ||
      r.attribute_u64("/", "octave_bias") != static_cast<std::uint64_t>(kOctaveBias)) {
    throw InputError(h5_path + ": octave layout differs from this version's");
  }
  const std::uint64_t nt = r.attribute_u64("/", "tensor_count");
  const std::uint64_t nb = r.attribute_u64("/", "block_count");

  // Tensors.
  const auto names = r.read_strings("/tensors/name", nt);
  const auto dtypes = r.read_strings("/tensors/dtype", nt);
  const auto ndim = r.read<std::uint32_t>("/tensors/ndim", nt);
  const auto dims = r.read<std::uint64_t>("/tensors/dims", H5Reader::kAny);
  std::size_t pos = 0;
  for (std::size_t t = 0; t < nt; ++t) {
    TensorInfo info;
    info.name = names[t];
    const auto dt = parse_dtype(dtypes[t]);
    if (!dt) throw InputError(r.where("/tensors/dtype") + ": unknown dtype '" + dtypes[t] + "'");
    info.dtype = *dt;
    if (pos + ndim[t] > dims.size()) throw InputError(r.where("/tensors/dims") + ": too short");
    info.shape.assign(dims.begin() + pos, dims.begin() + pos + ndim[t]);
    pos += ndim[t];
    c.tensors.push_back(std::move(info));
  }
  if (pos != dims.size()) throw InputError(r.where("/tensors/dims") + ": longer than ndim says");

  // Blocks: must be exactly the blocking this version derives from the tensors.
  c.blocking = make_blocking(c.tensors, c.blocking.block_bytes);
  {
    const auto tensor = r.read<std::uint32_t>("/blocks/tensor", nb);
    const auto eb = r.read<std::uint64_t>("/blocks/elem_begin", nb);
    const auto ecnt = r.read<std::uint64_t>("/blocks/elem_count", nb);
    const auto bb = r.read<std::uint64_t>("/blocks/byte_begin", nb);
    const auto bl = r.read<std::uint64_t>("/blocks/byte_length", nb);
    bool same = c.blocking.blocks.size() == nb;
    for (std::size_t b = 0; same && b < nb; ++b) {
      const Block& x = c.blocking.blocks[b];
      same = x.tensor == tensor[b] && x.elem_begin == eb[b] && x.elem_count == ecnt[b] &&
             x.byte_begin == bb[b] && x.byte_length == bl[b];
    }
    if (!same) {
      throw InputError(r.where("/blocks") + ": blocks differ from the blocking of the tensors at " +
                       std::to_string(c.blocking.block_bytes) + " bytes per block");
    }
  }

  const auto check_location = [&](const CheckpointLocation& loc, const std::string& group) {
    for (std::size_t t = 0; t < nt; ++t) {
      if (loc.tensor_file[t] >= loc.files.size()) {
        throw InputError(r.where(group + "/tensor_file") + ": tensor '" + c.tensors[t].name +
                         "' refers to file #" + std::to_string(loc.tensor_file[t]) + " of " +
                         std::to_string(loc.files.size()));
      }
      const std::uint64_t size = loc.files[loc.tensor_file[t]].size;
      const std::uint64_t len = c.tensors[t].nbytes();
      if (loc.tensor_offset[t] > size || len > size - loc.tensor_offset[t]) {
        throw InputError(r.where(group + "/tensor_offset") + ": tensor '" + c.tensors[t].name +
                         "' lies beyond the end of " + loc.files[loc.tensor_file[t]].path);
      }
    }
  };
  read_location(r, "/base", nt, c.base);
  check_location(c.base, "/base");
  if (r.exists("/base/block_hash"))  // absent in catalogs from before it was recorded
    c.base_block_hashes = r.read<std::uint64_t>("/base/block_hash", nb);

  const std::vector<bool> selected = selected_experts(c, only);
  // kThresholds: the densities asked of each catalog expert, each once.
  std::vector<std::vector<double>> densities_of(c.experts.size());
  if (sketches.kind == Kind::kThresholds) {
    const std::vector<int> found = c.find_experts(*only);
    for (std::size_t i = 0; i < found.size(); ++i) {
      if (found[i] < 0) continue;
      std::vector<double>& d = densities_of[static_cast<std::size_t>(found[i])];
      if (std::find(d.begin(), d.end(), sketches.densities[i]) == d.end())
        d.push_back(sketches.densities[i]);
    }
  }
  // Thresholds at densities on the grid are stored (catalogs written before they were: none).
  const bool has_grid = r.has_attribute("/", "trim_grid_steps") &&
                        r.attribute_u64("/", "trim_grid_steps") == kTrimGridSteps;
  const auto needs_sketches = [&](std::size_t k) {
    if (sketches.kind != Kind::kThresholds) return sketches.kind == Kind::kSketches;
    return std::any_of(densities_of[k].begin(), densities_of[k].end(),
                       [&](double d) { return !has_grid || trim_grid_step(d) == 0; });
  };
  std::vector<std::uint64_t> offsets;  // one expert's sketches at a time, in reused buffers
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
  std::vector<std::uint32_t> narrow_counts;  // as stored, when 32 bits wide
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    ExpertCatalog& e = c.experts[k];
    const std::string g = "/experts/" + expert_group_name(k);
    read_location(r, g, nt, e.location);
    check_location(e.location, g);
    if (!selected[k]) continue;
    const auto l2 = r.read<double>(g + "/block_l2", nb);
    const auto max_abs = r.read<float>(g + "/block_max_abs", nb);
    const auto nonzero = r.read<std::uint64_t>(g + "/block_nonzero", nb);
    const auto hash = r.read<std::uint64_t>(g + "/block_hash", nb);
    const auto octaves = r.read<float>(g + "/block_octaves", nb, kNormOctaves);
    e.blocks.resize(nb);
    for (std::size_t b = 0; b < nb; ++b) {
      BlockStats& s = e.blocks[b];
      s.l2 = l2[b];
      s.max_abs = max_abs[b];
      s.nonzero = nonzero[b];
      s.hash = hash[b];
      std::copy(octaves.begin() + b * kNormOctaves, octaves.begin() + (b + 1) * kNormOctaves,
                s.octave_sumsq.begin());
    }
    if (sketches.kind == Kind::kNone) continue;
    std::vector<double> from_sketches;  // kThresholds: the densities off the grid
    for (const double d : densities_of[k]) {
      const std::size_t step = has_grid ? trim_grid_step(d) : 0;
      if (step == 0) {
        from_sketches.push_back(d);
        continue;
      }
      DensityThresholds& stored = e.thresholds.emplace_back(DensityThresholds{d, {}});
      r.read_row(g + "/trim_thresholds", kTrimGridSteps, nt, step - 1, stored.by_tensor);
      for (std::size_t t = 0; t < nt; ++t) {
        if (!(stored.by_tensor[t] >= 0.0f)) {
          throw InputError(r.where(g + "/trim_thresholds") + ": tensor '" + c.tensors[t].name +
                           "' has threshold " + std::to_string(stored.by_tensor[t]) +
                           " at density " + std::to_string(d));
        }
      }
    }
    if (!needs_sketches(k)) continue;
    r.read_into(g + "/sketch_offsets", nt + 1, 0, offsets);
    r.read_into(g + "/sketch_keys", H5Reader::kAny, 0, keys);
    if (r.element_bytes(g + "/sketch_counts") == sizeof(std::uint32_t)) {
      r.read_into(g + "/sketch_counts", keys.size(), 0, narrow_counts);
      counts.assign(narrow_counts.begin(), narrow_counts.end());
    } else {
      r.read_into(g + "/sketch_counts", keys.size(), 0, counts);
    }
    if (offsets[0] != 0 || offsets[nt] != keys.size()) {
      throw InputError(r.where(g + "/sketch_offsets") + ": does not span sketch_keys");
    }
    const std::size_t first_computed = e.thresholds.size();
    for (const double d : from_sketches) e.thresholds.push_back({d, {}});
    for (std::size_t t = 0; t < nt; ++t) {
      if (offsets[t + 1] < offsets[t]) {
        throw InputError(r.where(g + "/sketch_offsets") + ": decreases at tensor '" +
                         c.tensors[t].name + "'");
      }
      const std::span<const std::uint16_t> tk(keys.data() + offsets[t],
                                              offsets[t + 1] - offsets[t]);
      const std::span<const std::uint64_t> tc(counts.data() + offsets[t], tk.size());
      std::uint64_t total = 0;
      try {
        total = MagnitudeSketch::check_sparse(tk, tc);
      } catch (const InputError& err) {
        throw InputError(r.where(g + "/sketch_keys") + ": tensor '" + c.tensors[t].name +
                         "': " + err.what());
      }
      if (total != c.tensors[t].numel()) {
        throw InputError(r.where(g + "/sketch_counts") + ": the sketch of tensor '" +
                         c.tensors[t].name + "' counts " + std::to_string(total) +
                         " entries, the tensor has " + std::to_string(c.tensors[t].numel()));
      }
      if (sketches.kind == Kind::kSketches) {
        e.sketches.push_back(MagnitudeSketch::from_sparse(tk, tc));
        continue;
      }
      for (std::size_t i = first_computed; i < e.thresholds.size(); ++i) {
        DensityThresholds& d = e.thresholds[i];
        d.by_tensor.push_back(MagnitudeSketch::threshold(tk, tc, total, d.density));
      }
    }
  }
  global_byte_counters().add(ByteCategory::kCatalog,
                             stat_identity(h5_path).size + stat_identity(json_path).size);
  return c;
}

std::vector<FileIdentity> catalog_input_files(const Catalog& catalog, const ExpertSelection& only,
                                              FileShare share) {
  if (share.count == 0 || share.index >= share.count)
    throw std::invalid_argument("catalog_input_files: share index out of range");
  std::vector<FileIdentity> files;
  std::size_t nth = 0;  // this share is every count-th
  const auto take_mine = [&](const FileIdentity& f) {
    if (nth++ % share.count == share.index) files.push_back(f);
  };
  for (const FileIdentity& f : catalog.base.files) take_mine(f);
  const std::vector<bool> selected = selected_experts(catalog, only);
  for (std::size_t k = 0; k < catalog.experts.size(); ++k) {
    if (!selected[k]) continue;
    for (const FileIdentity& f : catalog.experts[k].location.files) take_mine(f);
  }
  return files;
}

namespace {

std::string stale_prefix(const FileIdentity& recorded) {
  return "stale catalog: " + recorded.path + " changed since it was catalogued (";
}

// Where a recorded file sits: the base (expert -1) or expert k, and its index in that location.
struct FileOwner {
  int expert = -1;
  std::size_t file = 0;
};
std::optional<FileOwner> owner_of(const Catalog& c, const std::string& path) {
  for (std::size_t i = 0; i < c.base.files.size(); ++i)
    if (c.base.files[i].path == path) return FileOwner{-1, i};
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    const auto& files = c.experts[k].location.files;
    for (std::size_t i = 0; i < files.size(); ++i)
      if (files[i].path == path) return FileOwner{static_cast<int>(k), i};
  }
  return std::nullopt;
}

// The catalogued content hash of every block of one source, or nothing when not loaded.
std::vector<std::uint64_t> block_hashes_of(const Catalog& c, int expert) {
  if (expert < 0) return c.base_block_hashes;
  std::vector<std::uint64_t> out;
  for (const BlockStats& s : c.experts[static_cast<std::size_t>(expert)].blocks)
    out.push_back(s.hash);
  return out;
}

// Reads every block stored in `recorded` and compares it with the catalog's hash: a file whose
// inode changed while its size, mtime and header stayed (a chmod; or bytes rewritten and the
// mtime put back) is fresh only if its content is.
void check_file_content(const Catalog& c, const FileOwner& owner, const FileIdentity& recorded) {
  const CheckpointLocation& loc =
      owner.expert < 0 ? c.base : c.experts[static_cast<std::size_t>(owner.expert)].location;
  const std::vector<std::uint64_t> hashes = block_hashes_of(c, owner.expert);
  if (hashes.size() != c.blocking.blocks.size()) {
    throw InputError(stale_prefix(recorded) +
                     "its inode change time differs, and the catalog holds no block hashes to "
                     "check its content; rebuild the catalog)");
  }
  const File file(recorded.path, File::Mode::kRead);
  std::vector<std::byte> buffer;
  std::uint64_t bytes = 0;
  for (std::size_t b = 0; b < c.blocking.blocks.size(); ++b) {
    const Block& blk = c.blocking.blocks[b];
    if (loc.tensor_file[blk.tensor] != owner.file) continue;
    buffer.resize(blk.byte_length);
    file.read_at(loc.tensor_offset[blk.tensor] + blk.byte_begin, buffer);
    bytes += blk.byte_length;
    if (hash64(buffer.data(), buffer.size()) != hashes[b]) {
      throw InputError(stale_prefix(recorded) + "block " + std::to_string(b) + " of tensor '" +
                       c.tensors[blk.tensor].name +
                       "' holds other bytes, though size, mtime and header are as catalogued)");
    }
  }
  global_byte_counters().add(owner.expert < 0 ? ByteCategory::kBase : ByteCategory::kExpert, bytes);
}

}  // namespace

void check_catalog_fresh(const Catalog& catalog, const ExpertSelection& only, FileShare share,
                         const std::string& catalog_path, bool every_block) {
  std::vector<FileIdentity> inode_changed;
  const auto check = [&](const FileIdentity& recorded) {
    const std::string prefix = stale_prefix(recorded) + "size/mtime/header differ: ";
    // A missing file makes the catalog stale (exit 3); storage that fails to answer is an I/O
    // error (exit 4) and is reported as such, with the file and offset.
    std::error_code ec;
    if (!std::filesystem::exists(recorded.path, ec) && !ec)
      throw InputError(prefix + "the file is missing)");
    const FileIdentity now = stat_identity(recorded.path);
    std::vector<std::string> diffs;
    if (now.size != recorded.size) {
      diffs.push_back("size " + std::to_string(recorded.size) + " -> " + std::to_string(now.size));
    }
    if (now.mtime_ns != recorded.mtime_ns) diffs.push_back("mtime");
    std::string header_hash;
    try {
      header_hash = read_safetensors_header(recorded.path).header_hash;
    } catch (const InputError&) {
      header_hash.clear();  // no longer a valid header: certainly changed
    }
    if (header_hash != recorded.header_hash) {
      diffs.push_back(header_hash.empty() ? "header no longer valid" : "header");
    }
    if (diffs.empty()) {
      if (every_block || (recorded.ctime_ns != 0 && now.ctime_ns != recorded.ctime_ns))
        inode_changed.push_back(recorded);
      return;
    }
    std::string what;
    for (std::size_t i = 0; i < diffs.size(); ++i) what += (i ? ", " : "") + diffs[i];
    throw InputError(prefix + what + ")");
  };
  for (const FileIdentity& f : catalog_input_files(catalog, only, share)) check(f);
  if (inode_changed.empty()) return;

  // Their content decides; the block hashes come from catalog.h5 when `catalog` lacks them.
  std::optional<Catalog> loaded;
  const Catalog* with_hashes = &catalog;
  for (const FileIdentity& f : inode_changed) {
    std::optional<FileOwner> owner = owner_of(*with_hashes, f.path);
    const bool has_hashes = owner &&
                            block_hashes_of(*with_hashes, owner->expert).size() ==
                                with_hashes->blocking.blocks.size() &&
                            !with_hashes->tensors.empty();
    if (!has_hashes && !loaded && !catalog_path.empty()) {
      loaded = load_catalog(catalog_path, only, SketchLoad{SketchLoad::Kind::kNone, {}});
      with_hashes = &*loaded;
      owner = owner_of(*with_hashes, f.path);
    }
    if (!owner) throw InputError(stale_prefix(f) + "it is no longer in the catalog)");
    check_file_content(*with_hashes, *owner, f);
  }
}

std::string describe_catalog(const Catalog& c) {
  std::ostringstream out;
  std::uint64_t base_bytes = 0;
  for (const FileIdentity& f : c.base.files) base_bytes += f.size;
  std::uint64_t per_ckpt = 0;
  for (const TensorInfo& t : c.tensors) per_ckpt += t.nbytes();
  out << "catalog (" << c.format << "), family " << c.family_id << "\n";
  out << "base: " << c.base.dir << " (" << c.base.files.size() << " file"
      << (c.base.files.size() == 1 ? "" : "s") << ", " << format_bytes(base_bytes) << ")\n";
  out << "tensors: " << c.tensors.size() << " (" << format_bytes(per_ckpt) << " per checkpoint)\n";
  out << "blocks: " << c.block_count() << " (target " << format_bytes(c.blocking.block_bytes)
      << " per block)\n";
  out << "experts: " << c.expert_count() << " (full expert read "
      << format_bytes(c.full_expert_bytes()) << ")\n";
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    const ExpertCatalog& e = c.experts[k];
    double sumsq = 0;
    std::uint64_t nonzero = 0, elems = 0;
    for (std::size_t b = 0; b < e.blocks.size(); ++b) {
      sumsq += e.blocks[b].l2 * e.blocks[b].l2;
      nonzero += e.blocks[b].nonzero;
      elems += c.blocking.blocks[b].elem_count;
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "  [%zu] %s: %zu file%s, %" PRIu64
                  "/%zu blocks with a non-zero delta, "
                  "%.2f%% entries changed, ||delta||_2 = %.6g",
                  k, e.location.dir.c_str(), e.location.files.size(),
                  e.location.files.size() == 1 ? "" : "s",
                  static_cast<std::uint64_t>(e.blocks.size() - zero_blocks(e)), e.blocks.size(),
                  elems ? 100.0 * static_cast<double>(nonzero) / static_cast<double>(elems) : 0.0,
                  std::sqrt(sumsq));
    out << line;
    if (e.nonfinite) out << ", " << e.nonfinite << " NaN/Inf values";
    out << "\n";
  }
  char tail[96];
  std::snprintf(tail, sizeof tail, "last built in %.2f s\n", c.build_seconds);
  out << tail;
  return out.str();
}

}  // namespace mergepipe::io
