#include "mergepipe/mpi/comm.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

namespace mergepipe::mpi {

namespace {
void check_mpi(int rc, const char* what, const char* hint) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw IoError(std::string("MPI ") + what + " failed during " + hint + ": " +
                std::string(msg, len));
}
constexpr std::size_t kMaxPiece = 1u << 30;

// Completes `request` polling with a short sleep between tests: costs up to a millisecond of
// latency, saves a busy core.
void wait_politely(MPI_Request& request, const char* hint) {
  for (int spins = 0;; ++spins) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "test", hint);
    if (done) return;
    if (spins > 50) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}
}  // namespace

Environment::Environment(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes and are turned into exceptions, not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Environment::~Environment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Comm::Comm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Comm Comm::world() {
  return Comm(MPI_COMM_WORLD, false);
}

Comm::Comm(Comm&& other) noexcept
    : comm_(other.comm_), owned_(other.owned_), rank_(other.rank_), size_(other.size_) {
  other.comm_ = MPI_COMM_NULL;
  other.owned_ = false;
}

Comm& Comm::operator=(Comm&& other) noexcept {
  if (this != &other) {
    this->~Comm();
    new (this) Comm(std::move(other));
  }
  return *this;
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Comm Comm::split_node() const {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "split",
            "ranks on this node");
  return Comm(node, true);
}

void Comm::barrier(const char* hint) const {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &request), "barrier", hint);
  wait_politely(request, hint);
}

void Comm::broadcast(std::string& data, int root, const char* hint) const {
  std::uint64_t size = data.size();
  check_mpi(MPI_Bcast(&size, 1, MPI_UINT64_T, root, comm_), "broadcast", hint);
  if (rank_ != root) data.resize(size);
  for (std::size_t done = 0; done < size; done += kMaxPiece) {
    const int piece = static_cast<int>(std::min<std::size_t>(kMaxPiece, size - done));
    check_mpi(MPI_Bcast(data.data() + done, piece, MPI_BYTE, root, comm_), "broadcast", hint);
  }
}

std::uint64_t Comm::allreduce_sum(std::uint64_t value, const char* hint) const {
  std::uint64_t out = 0;
  check_mpi(MPI_Allreduce(&value, &out, 1, MPI_UINT64_T, MPI_SUM, comm_), "allreduce", hint);
  return out;
}
std::uint64_t Comm::allreduce_max(std::uint64_t value, const char* hint) const {
  std::uint64_t out = 0;
  check_mpi(MPI_Allreduce(&value, &out, 1, MPI_UINT64_T, MPI_MAX, comm_), "allreduce", hint);
  return out;
}
double Comm::allreduce_max(double value, const char* hint) const {
  double out = 0;
  check_mpi(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, comm_), "allreduce", hint);
  return out;
}
double Comm::allreduce_sum(double value, const char* hint) const {
  double out = 0;
  check_mpi(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_SUM, comm_), "allreduce", hint);
  return out;
}

std::vector<std::string> Comm::gather(const std::string& mine, int root, const char* hint) const {
  const int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank_ == root ? size_ : 0);
  check_mpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm_), "gather", hint);
  std::vector<int> displs(lens.size());
  std::string all;
  if (rank_ == root) {
    long long total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = static_cast<int>(total);
      total += lens[r];
    }
    if (total > INT_MAX) throw IoError(std::string("gather of more than 2 GiB during ") + hint);
    all.resize(static_cast<std::size_t>(total));
  }
  check_mpi(MPI_Gatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(),
                        MPI_BYTE, root, comm_),
            "gatherv", hint);
  std::vector<std::string> out;
  if (rank_ == root)
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

std::vector<std::string> Comm::allgather(const std::string& mine, const char* hint) const {
  std::vector<std::string> parts = gather(mine, 0, hint);
  std::string packed;
  if (rank_ == 0) {
    for (const auto& p : parts) {
      const std::uint64_t n = p.size();
      packed.append(reinterpret_cast<const char*>(&n), sizeof n);
      packed += p;
    }
  }
  broadcast(packed, 0, hint);
  std::vector<std::string> out;
  std::size_t pos = 0;
  for (int r = 0; r < size_; ++r) {
    std::uint64_t n = 0;
    std::memcpy(&n, packed.data() + pos, sizeof n);
    pos += sizeof n;
    out.push_back(packed.substr(pos, n));
    pos += n;
  }
  return out;
}

void Comm::check(const std::optional<Error>& local_failure, const char* hint) const {
  // Lowest failing rank wins, so the message is the same whatever the timing.
  const int mine = local_failure ? rank_ : size_;
  int first = size_;
  // Non-blocking, waited for with short sleeps: ranks that arrive early (a smaller share, a
  // failure) must not busy-poll a core away from the ranks still working, as a blocking
  // MPI_Allreduce does in Open MPI.
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_, &request), "allreduce", hint);
  wait_politely(request, hint);
  if (first == size_) return;
  std::string message;
  int code = 0;
  if (rank_ == first) {
    message = local_failure->what();
    code = static_cast<int>(local_failure->code());
  }
  check_mpi(MPI_Bcast(&code, 1, MPI_INT, first, comm_), "broadcast", hint);
  std::string msg = message;
  broadcast(msg, first, hint);
  throw CollectiveError(static_cast<ExitCode>(code), msg, first);
}

}  // namespace mergepipe::mpi
