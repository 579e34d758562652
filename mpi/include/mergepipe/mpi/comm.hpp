#pragma once
// Move-only communicator wrapper (after ADIOS2's helper::Comm): checked MPI calls that throw,
// a hint string per collective for messages, and a collective error check so a failure on one
// rank ends every rank cleanly instead of hanging the others in the next collective.
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe::mpi {

// MPI_Init_thread(FUNNELED) / MPI_Finalize. Only the main thread calls MPI.
class Environment {
 public:
  Environment(int& argc, char**& argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

// Thrown on every rank when some rank failed: carries that rank's message and exit code.
class CollectiveError : public Error {
 public:
  CollectiveError(ExitCode code, const std::string& message, int origin_rank)
      : Error(code, message), origin_rank_(origin_rank) {}
  int origin_rank() const noexcept { return origin_rank_; }

 private:
  int origin_rank_;
};

class Comm {
 public:
  static Comm world();  // MPI_COMM_WORLD, not freed on destruction
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool is_root() const noexcept { return rank_ == 0; }
  MPI_Comm handle() const noexcept { return comm_; }
  // The ranks of this communicator on this node (shared memory), as a communicator of its own
  // (freed with it). Collective.
  Comm split_node() const;

  void barrier(const char* hint) const;
  // Broadcast a byte string from root (sizes above 1 GiB are sent in pieces).
  void broadcast(std::string& data, int root, const char* hint) const;
  std::uint64_t allreduce_sum(std::uint64_t value, const char* hint) const;
  std::uint64_t allreduce_max(std::uint64_t value, const char* hint) const;
  double allreduce_max(double value, const char* hint) const;
  double allreduce_sum(double value, const char* hint) const;
  // Gathers each rank's string on root (empty vector elsewhere).
  std::vector<std::string> gather(const std::string& mine, int root, const char* hint) const;
  // Every rank's string on every rank.
  std::vector<std::string> allgather(const std::string& mine, const char* hint) const;

  // Collective: every rank passes its local failure (or nullopt). If any rank failed, every rank
  // throws CollectiveError with the message and code of the lowest failing rank.
  void check(const std::optional<Error>& local_failure, const char* hint) const;

 private:
  Comm(MPI_Comm comm, bool owned);
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
};

// Runs `body` and turns any exception into a value for Comm::check.
template <typename F>
std::optional<Error> capture_failure(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(ExitCode::kInternal, e.what());
  }
  return std::nullopt;
}

}  // namespace mergepipe::mpi
