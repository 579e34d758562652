#include "mergepipe/io/hdf5_handle.hpp"

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe::io::h5 {

bool Handle::reset() noexcept {
  if (id_ < 0) return true;
  herr_t rc = 0;
  switch (kind_) {
    case Kind::kFile:
      rc = H5Fclose(id_);
      break;
    case Kind::kGroup:
      rc = H5Gclose(id_);
      break;
    case Kind::kDataset:
      rc = H5Dclose(id_);
      break;
    case Kind::kDataspace:
      rc = H5Sclose(id_);
      break;
    case Kind::kDatatype:
      rc = H5Tclose(id_);
      break;
    case Kind::kAttribute:
      rc = H5Aclose(id_);
      break;
    case Kind::kPropertyList:
      rc = H5Pclose(id_);
      break;
  }
  id_ = H5I_INVALID_HID;
  return rc >= 0;
}

bool file_opens(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  silence_hdf5_errors();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), Kind::kFile);
  return file.valid();
}

void silence_hdf5_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

namespace {

// The innermost frames of HDF5's error stack: what failed underneath ("file write failed;
// driver write request failed"), far below the call that reported it. (They do not carry the
// system's reason; the output reserves its bytes up front so that a full disk says so.)
herr_t collect_frame(unsigned depth, const H5E_error2_t* frame, void* into) {
  auto& lines = *static_cast<std::vector<std::string>*>(into);
  if (depth < 3 && frame->desc != nullptr && *frame->desc != '\0') lines.emplace_back(frame->desc);
  return 0;
}

std::string failure(const char* call, const std::string& context) {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_frame, &lines);
  H5Eclear2(H5E_DEFAULT);
  std::string message = "HDF5 " + std::string(call) + " failed for " + context;
  std::string detail;
  for (const std::string& line : lines) {
    if (detail.find(line) != std::string::npos) continue;
    detail += (detail.empty() ? "" : "; ") + line;
  }
  return detail.empty() ? message : message + ": " + detail;
}

}  // namespace

hid_t check_id(hid_t id, const char* call, const std::string& context) {
  if (id < 0) throw IoError(failure(call, context));
  return id;
}

void check_status(herr_t status, const char* call, const std::string& context) {
  if (status < 0) throw IoError(failure(call, context));
}

}  // namespace mergepipe::io::h5

namespace mergepipe::io::h5 {

Handle select_rows(hid_t dataset, const std::vector<std::uint64_t>& shape, std::uint64_t elem_begin,
                   std::uint64_t n, const std::string& context) {
  std::uint64_t row = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  if (shape.empty() || row == 0 || elem_begin % row != 0 || n % row != 0) {
    throw InputError(context + ": element range is not whole rows");
  }
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  start[0] = elem_begin / row;
  count[0] = n / row;
  Handle space = checked(H5Dget_space(dataset), Kind::kDataspace, "H5Dget_space", context);
  check_status(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                   nullptr),
               "H5Sselect_hyperslab", context);
  return space;
}

}  // namespace mergepipe::io::h5
