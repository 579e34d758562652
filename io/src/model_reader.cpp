#include "mergepipe/io/model_reader.hpp"

#include <hdf5.h>

#include <filesystem>
#include <map>

#include "mergepipe/checkpoint.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hdf5_handle.hpp"
#include "mergepipe/io/hf_folder.hpp"

namespace mergepipe::io {

long ModelReader::find(const std::string& name) const {
  const auto& ts = tensors();
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (ts[i].name == name) return static_cast<long>(i);
  return -1;
}

namespace {

class SafetensorsModel : public ModelReader {
 public:
  explicit SafetensorsModel(const std::string& dir) : checkpoint_(open_checkpoint(dir)) {
    for (const auto& t : checkpoint_.tensors) infos_.push_back(t.info);
  }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  void read(std::size_t index, std::uint64_t elem_begin, std::uint64_t n,
            std::span<std::byte> dst) override {
    const StoredTensor& t = checkpoint_.tensors.at(index);
    const std::size_t size = dtype_size(t.info.dtype);
    if (dst.size() != n * size) throw InputError("model read of the wrong size");
    auto it = files_.find(t.file);
    if (it == files_.end()) it = files_.emplace(t.file, File(t.file, File::Mode::kRead)).first;
    it->second.read_at(t.offset + elem_begin * size, dst);
  }

 private:
  Checkpoint checkpoint_;
  std::vector<TensorInfo> infos_;
  std::map<std::string, File> files_;
};

// Serial read of a MergePipe HDF5 output: one dataset per tensor at the root.
class Hdf5Model : public ModelReader {
 public:
  explicit Hdf5Model(const std::string& path) : path_(path) {
    h5::silence_hdf5_errors();
    file_ = h5::checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), h5::Kind::kFile,
                        "H5Fopen", path);
    H5G_info_t info;
    h5::check_status(H5Gget_info(file_.get(), &info), "H5Gget_info", path);
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      char name[4096];
      const ssize_t len = H5Lget_name_by_idx(file_.get(), ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i,
                                             name, sizeof name, H5P_DEFAULT);
      const ssize_t len2 = len >= 0
                               ? len
                               : H5Lget_name_by_idx(file_.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i,
                                                    name, sizeof name, H5P_DEFAULT);
      if (len2 < 0) throw IoError(path + ": cannot list datasets");
      open_dataset(name);
    }
  }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  void read(std::size_t index, std::uint64_t elem_begin, std::uint64_t n,
            std::span<std::byte> dst) override {
    const TensorInfo& t = infos_.at(index);
    const std::string context = path_ + ": dataset " + t.name;
    const hid_t ds = datasets_[index].get();
    const hid_t type = types_[index].get();
    if (t.shape.empty()) {
      h5::check_status(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst.data()), "H5Dread",
                       context);
      return;
    }
    // Callers (verify) ask for whole-row ranges: blocks, or chunks of rows.
    h5::Handle fs = h5::select_rows(ds, t.shape, elem_begin, n, context);
    const hsize_t mem = n;
    h5::Handle ms = h5::checked(H5Screate_simple(1, &mem, nullptr), h5::Kind::kDataspace,
                                "H5Screate_simple", context);
    h5::check_status(H5Dread(ds, type, ms.get(), fs.get(), H5P_DEFAULT, dst.data()), "H5Dread",
                     context);
  }

 private:
  void open_dataset(const std::string& name) {
    const std::string context = path_ + ": dataset " + name;
    h5::Handle ds = h5::checked(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT),
                                h5::Kind::kDataset, "H5Dopen2", context);
    h5::Handle type =
        h5::checked(H5Dget_type(ds.get()), h5::Kind::kDatatype, "H5Dget_type", context);
    h5::Handle space =
        h5::checked(H5Dget_space(ds.get()), h5::Kind::kDataspace, "H5Dget_space", context);
    TensorInfo info;
    info.name = name;
    const size_t size = H5Tget_size(type.get());
    const int ebias = static_cast<int>(H5Tget_ebias(type.get()));
    if (H5Tget_class(type.get()) != H5T_FLOAT) throw InputError(context + ": not a float dataset");
    if (size == 4)
      info.dtype = DType::kF32;
    else if (size == 8)
      info.dtype = DType::kF64;
    else if (size == 2 && ebias == 127)
      info.dtype = DType::kBF16;
    else if (size == 2)
      info.dtype = DType::kF16;
    else
      throw InputError(context + ": unsupported float size");
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    info.shape.assign(dims.begin(), dims.end());
    infos_.push_back(info);
    datasets_.push_back(std::move(ds));
    types_.push_back(std::move(type));
  }

  std::string path_;
  h5::Handle file_;
  std::vector<TensorInfo> infos_;
  std::vector<h5::Handle> datasets_, types_;
};

}  // namespace

std::unique_ptr<ModelReader> open_model(const std::string& dir) {
  const std::string h5path = dir + "/model.h5";
  std::error_code ec;
  if (std::filesystem::exists(h5path, ec)) return std::make_unique<Hdf5Model>(h5path);
  return std::make_unique<SafetensorsModel>(dir);
}

}  // namespace mergepipe::io
