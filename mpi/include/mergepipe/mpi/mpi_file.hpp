#pragma once
// RAII MPI_File opened collectively on a communicator. Writes use explicit offsets and are split
// into pieces below 2 GiB (MPI counts are int). Closing is collective: call close() on every
// rank on the success path; the destructor only closes a handle still open after an error.
#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mergepipe::mpi {

class Comm;

// MPI_Info built from key=value hints (e.g. striping_factor, cb_nodes); owned.
class InfoHints {
 public:
  explicit InfoHints(const std::vector<std::pair<std::string, std::string>>& hints = {});
  ~InfoHints();
  InfoHints(const InfoHints&) = delete;
  InfoHints& operator=(const InfoHints&) = delete;
  MPI_Info handle() const noexcept { return info_; }

 private:
  MPI_Info info_ = MPI_INFO_NULL;
};

class MpiFile {
 public:
  // Collective over comm. Creates the file (write-only) when `create` is set.
  MpiFile(const Comm& comm, const std::string& path, bool create, const InfoHints& hints);
  ~MpiFile();
  MpiFile(const MpiFile&) = delete;
  MpiFile& operator=(const MpiFile&) = delete;

  void write_at(std::uint64_t offset, std::span<const std::byte> data) const;  // independent
  void set_size(std::uint64_t size) const;                                     // collective
  void sync() const;                                                           // collective
  void close();                                                                // collective
  const std::string& path() const noexcept { return path_; }

 private:
  MPI_File file_ = MPI_FILE_NULL;
  std::string path_;
};

}  // namespace mergepipe::mpi
