// NodeCounter at 1, 2 and 4 ranks: ranks (and threads within them) drawing from the node's
// counter at the same time get every value exactly once.
#include "mergepipe/mpi/node_counter.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace mergepipe;

TEST(MPI, NodeCounterHandsOutEveryValueOnce) {
  const mpi::Comm comm = mpi::Comm::world();
  const mpi::Comm node = comm.split_node();  // CTest runs every rank on this machine
  mpi::NodeCounter counter(node);
  constexpr std::uint64_t kItems = 20000;
  std::vector<std::uint64_t> mine;
  std::mutex mutex;
  auto draw = [&] {
    for (std::uint64_t v; (v = counter.fetch_add(1)) < kItems;) {
      const std::lock_guard lock(mutex);
      mine.push_back(v);
    }
  };
  std::thread helper(draw);
  draw();
  helper.join();
  std::string packed;
  for (std::uint64_t v : mine) packed += std::to_string(v) + " ";
  std::vector<int> seen(kItems, 0);
  for (const std::string& part : comm.allgather(packed, "drawn values")) {
    std::size_t at = 0;
    while (at < part.size()) {
      const std::size_t end = part.find(' ', at);
      ++seen.at(std::stoull(part.substr(at, end - at)));
      at = end + 1;
    }
  }
  for (std::uint64_t v = 0; v < kItems; ++v) ASSERT_EQ(seen[v], 1) << "value " << v;
  // Past the end every draw still returns a distinct value: nobody sees an item twice.
  EXPECT_GE(counter.fetch_add(1), kItems);
}
