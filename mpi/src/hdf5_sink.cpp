#include <hdf5.h>

#include <algorithm>
#include <vector>

#include "mergepipe/error.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hdf5_handle.hpp"
#include "mergepipe/mpi/output_sinks.hpp"

namespace mergepipe::mpi {

namespace h5 = io::h5;

namespace {

// bf16 has no native HDF5 type: an IEEE float of 16 bits with fp32's 8-bit exponent (h5py reads
// it with astype(float32)). fp16 is HDF5's IEEE half layout.
h5::Handle make_file_type(DType dtype, const std::string& path) {
  if (dtype == DType::kF32)
    return h5::checked(H5Tcopy(H5T_IEEE_F32LE), h5::Kind::kDatatype, "H5Tcopy", path);
  if (dtype == DType::kF64)
    return h5::checked(H5Tcopy(H5T_IEEE_F64LE), h5::Kind::kDatatype, "H5Tcopy", path);
  h5::Handle t = h5::checked(H5Tcopy(H5T_IEEE_F32LE), h5::Kind::kDatatype, "H5Tcopy", path);
  if (dtype == DType::kBF16) {
    h5::check_status(H5Tset_fields(t.get(), 15, 7, 8, 0, 7), "H5Tset_fields", path);
    h5::check_status(H5Tset_offset(t.get(), 0), "H5Tset_offset", path);
    h5::check_status(H5Tset_precision(t.get(), 16), "H5Tset_precision", path);
    h5::check_status(H5Tset_size(t.get(), 2), "H5Tset_size", path);
    h5::check_status(H5Tset_ebias(t.get(), 127), "H5Tset_ebias", path);
  } else if (dtype == DType::kF16) {
    h5::check_status(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), "H5Tset_fields", path);
    h5::check_status(H5Tset_offset(t.get(), 0), "H5Tset_offset", path);
    h5::check_status(H5Tset_precision(t.get(), 16), "H5Tset_precision", path);
    h5::check_status(H5Tset_size(t.get(), 2), "H5Tset_size", path);
    h5::check_status(H5Tset_ebias(t.get(), 15), "H5Tset_ebias", path);
  } else {
    throw UsageError(path + ": the HDF5 output supports BF16, F16, F32 and F64 tensors, not " +
                     std::string(dtype_name(dtype)));
  }
  return t;
}

}  // namespace

struct Hdf5Sink::State {
  const Comm* comm = nullptr;
  std::string path;
  std::vector<TensorInfo> tensors;
  h5::Handle file;
  std::vector<h5::Handle> types;
  std::vector<h5::Handle> datasets;
  std::vector<std::uint64_t> offsets;  // per dataset: file offset of its contiguous data
  h5::Handle transfer;
};

Hdf5Sink::Hdf5Sink(const Comm& comm, const std::vector<TensorInfo>& tensors,
                   const std::string& path, const InfoHints& hints, bool reopen)
    : state_(std::make_unique<State>()) {
  h5::silence_hdf5_errors();
  State& s = *state_;
  s.comm = &comm;
  s.path = path;
  s.tensors = tensors;
  h5::Handle fapl =
      h5::checked(H5Pcreate(H5P_FILE_ACCESS), h5::Kind::kPropertyList, "H5Pcreate", path);
  h5::check_status(H5Pset_fapl_mpio(fapl.get(), comm.handle(), hints.handle()), "H5Pset_fapl_mpio",
                   path);
  h5::check_status(H5Pset_all_coll_metadata_ops(fapl.get(), true), "H5Pset_all_coll_metadata_ops",
                   path);
  h5::check_status(H5Pset_coll_metadata_write(fapl.get(), true), "H5Pset_coll_metadata_write",
                   path);
  h5::check_status(H5Pset_alignment(fapl.get(), 1 << 20, 1 << 20), "H5Pset_alignment", path);
  if (reopen) {
    s.file = h5::checked(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()), h5::Kind::kFile,
                         "H5Fopen", path);
  } else {
    // No modification times in object headers: the same merge gives the same file bytes.
    h5::Handle fcpl =
        h5::checked(H5Pcreate(H5P_FILE_CREATE), h5::Kind::kPropertyList, "H5Pcreate", path);
    h5::check_status(H5Pset_obj_track_times(fcpl.get(), false), "H5Pset_obj_track_times", path);
    s.file = h5::checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                         h5::Kind::kFile, "H5Fcreate", path);
  }
  h5::Handle dcpl =
      h5::checked(H5Pcreate(H5P_DATASET_CREATE), h5::Kind::kPropertyList, "H5Pcreate", path);
  h5::check_status(H5Pset_obj_track_times(dcpl.get(), false), "H5Pset_obj_track_times", path);
  h5::check_status(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout", path);
  h5::check_status(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time", path);
  h5::check_status(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time", path);
  // Every rank creates every dataset with identical arguments (HDF5 metadata is collective).
  for (const TensorInfo& t : tensors) {
    const std::string context = path + ": dataset " + t.name;
    s.types.push_back(make_file_type(t.dtype, context));
    if (reopen) {
      s.datasets.push_back(h5::checked(H5Dopen2(s.file.get(), t.name.c_str(), H5P_DEFAULT),
                                       h5::Kind::kDataset, "H5Dopen2", context));
      continue;
    }
    h5::Handle space;
    if (t.shape.empty()) {
      space = h5::checked(H5Screate(H5S_SCALAR), h5::Kind::kDataspace, "H5Screate", context);
    } else {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      space = h5::checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                          h5::Kind::kDataspace, "H5Screate_simple", context);
    }
    s.datasets.push_back(h5::checked(H5Dcreate2(s.file.get(), t.name.c_str(), s.types.back().get(),
                                                space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                                     h5::Kind::kDataset, "H5Dcreate2", context));
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const haddr_t offset = H5Dget_offset(s.datasets[t].get());
    if (offset == HADDR_UNDEF && tensors[t].numel() > 0)
      throw IoError(path + ": dataset " + tensors[t].name + " has no contiguous storage");
    s.offsets.push_back(offset == HADDR_UNDEF ? 0 : static_cast<std::uint64_t>(offset));
  }
  // The skeleton reaches the file now, so a run killed later leaves a file a resumed run can
  // reopen.
  h5::check_status(H5Fflush(s.file.get(), H5F_SCOPE_GLOBAL), "H5Fflush", path);
  // Every dataset's bytes reserved up front, as the safetensors shards are: a disk too small
  // fails now with the system's reason (HDF5's own write errors do not carry it), not after
  // minutes of merging.
  std::uint64_t data_end = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    data_end = std::max(data_end, s.offsets[t] + tensors[t].numel() * dtype_size(tensors[t].dtype));
  comm.check(capture_failure([&] {
               if (comm.is_root() && data_end > 0)
                 io::File(path, io::File::Mode::kReadWrite).preallocate(data_end);
             }),
             "reserve the HDF5 output");
  // Blocks differ per rank and per dataset, so data goes out as independent hyperslab writes
  // (no type conversion: memory and file types are identical).
  s.transfer = h5::checked(H5Pcreate(H5P_DATASET_XFER), h5::Kind::kPropertyList, "H5Pcreate", path);
  h5::check_status(H5Pset_dxpl_mpio(s.transfer.get(), H5FD_MPIO_INDEPENDENT), "H5Pset_dxpl_mpio",
                   path);
}

Hdf5Sink::~Hdf5Sink() = default;

void Hdf5Sink::write(std::uint32_t tensor, std::uint64_t elem_begin,
                     std::span<const std::byte> bytes) {
  State& s = *state_;
  const TensorInfo& t = s.tensors[tensor];
  const std::string context = s.path + ": dataset " + t.name;
  const std::uint64_t n = bytes.size() / dtype_size(t.dtype);
  const hid_t dataset = s.datasets[tensor].get();
  if (t.shape.empty()) {
    h5::check_status(
        H5Dwrite(dataset, s.types[tensor].get(), H5S_ALL, H5S_ALL, s.transfer.get(), bytes.data()),
        "H5Dwrite", context);
  } else {
    // A block is whole rows of the dataset.
    h5::Handle file_space = h5::select_rows(dataset, t.shape, elem_begin, n, context);
    const hsize_t mem_count = n;
    h5::Handle mem_space = h5::checked(H5Screate_simple(1, &mem_count, nullptr),
                                       h5::Kind::kDataspace, "H5Screate_simple", context);
    h5::check_status(H5Dwrite(dataset, s.types[tensor].get(), mem_space.get(), file_space.get(),
                              s.transfer.get(), bytes.data()),
                     "H5Dwrite", context);
  }
  io::global_byte_counters().add(io::ByteCategory::kOutputWritten, bytes.size());
}

OutputLocation Hdf5Sink::locate(std::uint32_t tensor, std::uint64_t elem_begin) const {
  const State& s = *state_;
  return {s.path, s.offsets[tensor] + elem_begin * dtype_size(s.tensors[tensor].dtype)};
}

void Hdf5Sink::finish() {
  State& s = *state_;
  s.datasets.clear();
  s.types.clear();
  s.transfer.reset();
  // Collective calls: a failure on one rank must reach all before the next one.
  s.comm->check(capture_failure([&] {
                  h5::check_status(H5Fflush(s.file.get(), H5F_SCOPE_GLOBAL), "H5Fflush", s.path);
                }),
                "flush the HDF5 output");
  s.comm->check(capture_failure([&] {
                  if (!s.file.reset()) throw IoError("HDF5 H5Fclose failed for " + s.path);
                }),
                "close the HDF5 output");
}

}  // namespace mergepipe::mpi
