#pragma once
// RAII ownership of HDF5 identifiers, and checked calls that turn a failed HDF5 call into an
// IoError naming the call and the file. HDF5 1.10 is not thread-safe: use from one thread.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mergepipe::io::h5 {

enum class Kind { kFile, kGroup, kDataset, kDataspace, kDatatype, kAttribute, kPropertyList };

// Owns one hid_t and closes it with the H5*close matching its kind. Move-only; never throws.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, Kind kind) noexcept : id_(id), kind_(kind) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), kind_(other.kind_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      kind_ = other.kind_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const noexcept { return id_; }
  bool valid() const noexcept { return id_ >= 0; }
  // Closes now; returns false when HDF5 reported a failure (e.g. a file close that flushes).
  bool reset() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
  Kind kind_ = Kind::kFile;
};

// Turns off HDF5's automatic error-stack printing (errors are reported as exceptions instead).
// Idempotent; call before a sequence of HDF5 calls.
void silence_hdf5_errors();

// True when `path` exists and HDF5 can open it read-only (serial driver): a file left behind by a
// killed writer may not be.
bool file_opens(const std::string& path);

// Returns `id` when valid, else throws IoError "HDF5 <call> failed for <context>".
hid_t check_id(hid_t id, const char* call, const std::string& context);
// Throws IoError "HDF5 <call> failed for <context>" when status < 0.
void check_status(herr_t status, const char* call, const std::string& context);
// check_id wrapped into a Handle of the given kind.
inline Handle checked(hid_t id, Kind kind, const char* call, const std::string& context) {
  return Handle(check_id(id, call, context), kind);
}

// The file dataspace of `dataset` (shape `shape`, at least 1-D) with the whole rows holding
// elements [elem_begin, elem_begin + n) selected (a row = product of shape[1:]). InputError when
// the range is not whole rows.
Handle select_rows(hid_t dataset, const std::vector<std::uint64_t>& shape, std::uint64_t elem_begin,
                   std::uint64_t n, const std::string& context);

}  // namespace mergepipe::io::h5
