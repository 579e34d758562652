#pragma once
// The common tail of `merge` and `replay`: broadcast the task, stage, run, finalise, publish.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "mergepipe/merge_task.hpp"
#include "mergepipe/mpi/merge_run.hpp"

namespace mergepipe::app {

struct PipelineOptions {
  std::string out;
  bool force = false;
  int threads = 1;
  int prefetch_depth = 2;
  bool allow_nonfinite = false;
  bool quiet = false;
  std::vector<std::pair<std::string, std::string>> mpiio_hints;
  std::string catalog_path;
  std::uint64_t catalog_bytes = 0;
  std::string replay_of;
  std::map<std::string, std::string> expected_hashes;  // replay: output must match, else no publish
  double plan_seconds = 0;
};

struct PipelineOutcome {
  mpi::MergeRunResult run;
  nlohmann::ordered_json manifest;  // rank 0
  double total_seconds = 0;
};

// Collective. `task` must be complete on rank 0 (other ranks receive it).
PipelineOutcome execute_and_publish(CommandContext& ctx, MergeTask& task,
                                    const PipelineOptions& options);

// Parses repeated --mpiio-hint key=value flags (UsageError on a malformed one).
std::vector<std::pair<std::string, std::string>> parse_hints(const std::vector<std::string>& hints);

}  // namespace mergepipe::app
