#include "mergepipe/mpi/job_layout.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>

#include "mergepipe/error.hpp"

namespace mergepipe::mpi {

std::vector<int> JobLayout::ranks_per_node() const {
  std::vector<int> out;
  for (const NodeLayout& n : nodes) out.push_back(n.ranks);
  return out;
}

JobLayout job_layout(const Comm& comm, const CpuPlacement& placement, int threads) {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const int first_rank = placement.node_ranks.empty() ? comm.rank() : placement.node_ranks.front();
  // One line per rank: its node's lowest rank, then what it knows of the node.
  std::ostringstream mine;
  mine << first_rank << ' ' << placement.ranks_on_node << ' ' << threads << ' '
       << placement.node_cpus << ' ' << host;
  JobLayout layout;
  const std::vector<std::string> all = comm.gather(mine.str(), 0, "gather the job layout");
  if (!comm.is_root()) {
    layout.nodes.push_back({host, placement.ranks_on_node, threads, placement.node_cpus});
    return layout;
  }
  std::map<int, NodeLayout> by_first_rank;
  for (const std::string& line : all) {
    std::istringstream in(line);
    int first = 0;
    NodeLayout n;
    if (!(in >> first >> n.ranks >> n.threads >> n.cpus))
      throw IoError("merge: a rank sent a malformed layout line '" + line + "'");
    std::getline(in >> std::ws, n.host);
    NodeLayout& node = by_first_rank[first];
    if (node.ranks == 0) {
      node = n;
    } else {
      node.threads = std::max(node.threads, n.threads);
    }
  }
  for (auto& [first, node] : by_first_rank) layout.nodes.push_back(node);
  return layout;
}

}  // namespace mergepipe::mpi
