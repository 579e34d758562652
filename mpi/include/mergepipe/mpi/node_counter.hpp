#pragma once
// A counter shared by the ranks of one node (an MPI shared-memory window holding one 64-bit
// atomic): ranks draw work items from it with fetch_add, without messages and without the other
// ranks having to make MPI progress, so a rank that finishes early takes work a busy rank has
// not reached yet.
#include <mpi.h>

#include <cstdint>

#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::mpi {

class NodeCounter {
 public:
  // Collective over `node` (the ranks of one node: Comm::split_node). Starts at 0.
  explicit NodeCounter(const Comm& node);
  ~NodeCounter();  // frees the window: collective, like every path that destroys it
  NodeCounter(const NodeCounter&) = delete;
  NodeCounter& operator=(const NodeCounter&) = delete;

  // Adds `n` and returns the value before. Thread-safe, and atomic across the node's ranks.
  std::uint64_t fetch_add(std::uint64_t n);

 private:
  MPI_Win window_ = MPI_WIN_NULL;
  std::uint64_t* value_ = nullptr;
};

}  // namespace mergepipe::mpi
