#include "mergepipe/mpi/cpu_placement.hpp"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace mergepipe::mpi {

namespace {

// The CPUs `pid` may run on (0: this process); all online CPUs if the mask cannot be read.
cpu_set_t affinity_of(pid_t pid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(pid, sizeof(set), &set) != 0) {
    const long online = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    for (long c = 0; c < online && c < CPU_SETSIZE; ++c) CPU_SET(static_cast<int>(c), &set);
  }
  return set;
}

// CPUs Slurm allocated to this job on this node, or 0 outside Slurm. On a node shared with
// other jobs the launcher may be allowed more CPUs than the job owns.
int slurm_cpus_on_node() {
  const char* text = std::getenv("SLURM_CPUS_ON_NODE");
  if (!text || !*text) return 0;
  char* end = nullptr;
  const long cpus = std::strtol(text, &end, 10);
  return *end == '\0' && cpus > 0 && cpus < (1L << 20) ? static_cast<int>(cpus) : 0;
}

}  // namespace

CpuPlacement cpu_placement(const Comm& comm) {
  CpuPlacement p;
  const cpu_set_t mine = affinity_of(0);
  p.rank_cpus = std::max(1, CPU_COUNT(&mine));
  // The launcher (mpirun's daemon, slurmstepd, or the shell of a singleton run) holds the CPUs
  // the job was given on this node.
  const cpu_set_t launcher = affinity_of(::getppid());
  const Comm local = comm.split_node();
  p.ranks_on_node = local.size();
  p.node_ranks.resize(static_cast<std::size_t>(local.size()));
  const int my_rank = comm.rank();
  if (MPI_Allgather(&my_rank, 1, MPI_INT, p.node_ranks.data(), 1, MPI_INT, local.handle()) !=
      MPI_SUCCESS)
    throw IoError("MPI: allgather failed (ranks on this node)");
  std::sort(p.node_ranks.begin(), p.node_ranks.end());
  cpu_set_t node;
  if (MPI_Allreduce(&mine, &node, static_cast<int>(sizeof(cpu_set_t)), MPI_UNSIGNED_CHAR, MPI_BOR,
                    local.handle()) != MPI_SUCCESS)
    throw IoError("MPI: allreduce failed (ranks' CPU masks)");
  p.node_cpus = std::max(1, CPU_COUNT(&node));
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &node)) p.node_cpu_ids.push_back(c);
  int launcher_cpus = CPU_COUNT(&launcher);
  if (const int slurm = slurm_cpus_on_node(); slurm > 0)
    launcher_cpus = std::min(launcher_cpus, slurm);
  p.launcher_cpus = std::max(p.node_cpus, launcher_cpus);
  return p;
}

int default_threads(const CpuPlacement& p) {
  if (p.rank_cpus < p.launcher_cpus) return std::max(1, p.rank_cpus);  // bound: use what it got
  return std::max(1, p.launcher_cpus / std::max(1, p.ranks_on_node));
}

std::string idle_cpu_advice(const CpuPlacement& p) {
  if (p.node_cpus >= p.launcher_cpus) return {};
  const int idle = p.launcher_cpus - p.node_cpus;
  return "the " + std::to_string(p.ranks_on_node) + " rank" + (p.ranks_on_node == 1 ? "" : "s") +
         " on this node may run on " + std::to_string(p.node_cpus) + " of its " +
         std::to_string(p.launcher_cpus) + " CPUs (mpirun binds each rank to one core by " +
         "default), so " + std::to_string(idle) + (idle == 1 ? " CPU stays" : " CPUs stay") +
         " idle while reads and merging share the others; run more ranks, or give each "
         "rank several CPUs: mpirun --bind-to none, mpirun --map-by slot:PE=N, or srun "
         "--cpus-per-task=N";
}

}  // namespace mergepipe::mpi
