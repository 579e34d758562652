#include "mergepipe/mpi/node_counter.hpp"

#include <atomic>

namespace mergepipe::mpi {

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free,
              "a counter in memory shared between processes needs lock-free atomics");

NodeCounter::NodeCounter(const Comm& node) {
  // The node's rank 0 holds the value; the others map the same memory.
  const MPI_Aint size = node.is_root() ? static_cast<MPI_Aint>(sizeof(std::uint64_t)) : 0;
  void* base = nullptr;
  if (MPI_Win_allocate_shared(size, sizeof(std::uint64_t), MPI_INFO_NULL, node.handle(), &base,
                              &window_) != MPI_SUCCESS)
    throw IoError("MPI: allocating a shared-memory window failed (work counter)");
  MPI_Aint owner_size = 0;
  int unit = 0;
  void* owner = nullptr;
  if (MPI_Win_shared_query(window_, 0, &owner_size, &unit, &owner) != MPI_SUCCESS ||
      owner == nullptr || owner_size < static_cast<MPI_Aint>(sizeof(std::uint64_t))) {
    // Not freed: that is collective, and the other ranks may not be failing here. The job ends.
    throw IoError("MPI: the node's shared-memory window is not addressable (work counter)");
  }
  value_ = static_cast<std::uint64_t*>(owner);
  if (node.is_root()) std::atomic_ref<std::uint64_t>(*value_).store(0);
  node.barrier("start the work counter");  // nobody draws before it is 0
}

NodeCounter::~NodeCounter() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (window_ != MPI_WIN_NULL && !finalized) MPI_Win_free(&window_);
}

std::uint64_t NodeCounter::fetch_add(std::uint64_t n) {
  return std::atomic_ref<std::uint64_t>(*value_).fetch_add(n);
}

}  // namespace mergepipe::mpi
