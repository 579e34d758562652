#include "mergepipe/mpi/mpi_file.hpp"

#include <algorithm>

#include "mergepipe/error.hpp"
#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::mpi {

namespace {
constexpr std::size_t kMaxPiece = 1ull << 30;

void check_io(int rc, const std::string& path, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw IoError(path + ": " + what + " failed: " + std::string(msg, len));
}
}  // namespace

InfoHints::InfoHints(const std::vector<std::pair<std::string, std::string>>& hints) {
  if (hints.empty()) return;
  MPI_Info_create(&info_);
  for (const auto& [key, value] : hints) MPI_Info_set(info_, key.c_str(), value.c_str());
}

InfoHints::~InfoHints() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (info_ != MPI_INFO_NULL && !finalized) MPI_Info_free(&info_);
}

MpiFile::MpiFile(const Comm& comm, const std::string& path, bool create, const InfoHints& hints)
    : path_(path) {
  const int mode = create ? (MPI_MODE_CREATE | MPI_MODE_WRONLY) : MPI_MODE_RDONLY;
  check_io(MPI_File_open(comm.handle(), path.c_str(), mode, hints.handle(), &file_), path,
           "MPI_File_open");
  MPI_File_set_errhandler(file_, MPI_ERRORS_RETURN);
}

MpiFile::~MpiFile() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (file_ != MPI_FILE_NULL && !finalized) MPI_File_close(&file_);
}

void MpiFile::write_at(std::uint64_t offset, std::span<const std::byte> data) const {
  for (std::size_t done = 0; done < data.size();) {
    const int piece = static_cast<int>(std::min(kMaxPiece, data.size() - done));
    MPI_Status status;
    check_io(MPI_File_write_at(file_, static_cast<MPI_Offset>(offset + done), data.data() + done,
                               piece, MPI_BYTE, &status),
             path_, "write");
    int written = 0;
    MPI_Get_count(&status, MPI_BYTE, &written);
    if (written <= 0)
      throw IoError(path_ + ": write at offset " + std::to_string(offset + done) +
                    " wrote nothing (disk full?)");
    done += static_cast<std::size_t>(written);
  }
}

void MpiFile::set_size(std::uint64_t size) const {
  check_io(MPI_File_set_size(file_, static_cast<MPI_Offset>(size)), path_, "MPI_File_set_size");
}

void MpiFile::sync() const {
  check_io(MPI_File_sync(file_), path_, "MPI_File_sync");
}

void MpiFile::close() {
  if (file_ == MPI_FILE_NULL) return;
  check_io(MPI_File_close(&file_), path_, "MPI_File_close");
  file_ = MPI_FILE_NULL;
}

}  // namespace mergepipe::mpi
