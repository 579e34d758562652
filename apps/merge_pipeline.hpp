#pragma once
// The common tail of `merge` and `replay`: broadcast the task, stage (or resume), run, finalise,
// publish; and the options both take.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "mergepipe/io/output_guard.hpp"
#include "mergepipe/merge_task.hpp"
#include "mergepipe/mpi/cpu_placement.hpp"
#include "mergepipe/mpi/job_layout.hpp"
#include "mergepipe/mpi/merge_run.hpp"
#include "output_style.hpp"

namespace mergepipe::app {

// What the output folder holds besides the tensors, as mergekit writes it.
struct FolderOptions {
  bool copy_tokenizer = true;    // the base's tokenizer files (mergekit's --copy-tokenizer)
  bool write_model_card = true;  // README.md (mergekit's --write-model-card)
  std::string config_text;       // the config as given, copied to mergekit_config.yml
  std::string card_title;        // "": the output folder's name (a replay keeps the original's)
};

struct PipelineOptions {
  std::string out;
  FolderOptions folder;
  bool force = false;
  int threads = 0;         // 0: the node's cores shared by its ranks
  int io_threads = 0;      // 0: mpi::MergeRunOptions::io_threads says
  int prefetch_depth = 0;  // 0: by the kind of merge (default_prefetch_depth)
  std::uint64_t read_bytes = 128u << 10;
  std::uint64_t expert_piece_bytes = std::uint64_t{64} << 20;  // 0: no pieces
  bool hold_base = true;  // false: the base streams through the page cache (it was read ahead)
  bool allow_nonfinite = false;
  bool resume = true;
  mpi::VerifyReads verify_reads = mpi::VerifyReads::kEveryRead;
  io::InputIo input_io = io::InputIo::kAuto;
  io::OutputIo output_io = io::OutputIo::kAuto;
  mpi::Schedule schedule = mpi::Schedule::kDynamic;
  OutputStyle style;
  std::vector<std::pair<std::string, std::string>> mpiio_hints;
  std::string catalog_path;
  std::uint64_t catalog_bytes = 0;
  std::string replay_of;
  std::map<std::string, std::string> expected_hashes;  // replay: output must match, else no publish
  double catalog_load_seconds = 0;                     // reading and checking the catalog on rank 0
  double plan_seconds = 0;
  // The start of the base read into the page cache while rank 0 loaded the catalog and planned.
  std::uint64_t base_read_ahead_bytes = 0;
  double base_read_ahead_seconds = 0;
  double base_read_ahead_wait_seconds = 0;  // rank 0 waiting for it to finish after the plan
  // Where this node's ranks run, when the command found out already (else execute_and_publish
  // does; it is collective).
  std::optional<mpi::CpuPlacement> placement;
};

// Before anything is read or written (rank 0): --out is not, does not hold and does not lie inside
// any of `inputs`, nor the current folder or a parent of it; an existing --out is replaced only
// with --force and only when a mergepipe merge wrote it (io/output_guard.hpp).
void check_merge_target(const std::string& command, const PipelineOptions& options,
                        const std::vector<io::GuardedInput>& inputs);

// Command-line text of the options merge and replay share, before validation.
struct RunOptionText {
  std::vector<std::string> hints;
  std::string read_size = "128KiB";
  std::string expert_piece_size = "64MiB";
  std::string verify_reads = "reads";
  std::string input_io = "auto";
  std::string output_io = "auto";
  std::string schedule = "dynamic";
  bool no_resume = false;
  OutputStyleText style;
};
void add_run_options(po::options_description& desc, PipelineOptions& options, RunOptionText& text);
// Validates the shared options into `options` (UsageError naming `command`).
void finish_run_options(const RunOptionText& text, PipelineOptions& options,
                        const std::string& command);

struct PipelineOutcome {
  mpi::MergeRunResult run;
  nlohmann::ordered_json manifest;  // rank 0
  double total_seconds = 0;
  int threads = 1;         // compute threads per rank actually used
  int prefetch_depth = 2;  // slices read ahead per rank actually used
  mpi::JobLayout layout;   // the nodes, their ranks and threads (complete on rank 0)
};

// Collective. `task` must be complete on rank 0 (other ranks receive it).
PipelineOutcome execute_and_publish(CommandContext& ctx, MergeTask& task,
                                    const PipelineOptions& options);

// Parses repeated --mpiio-hint key=value flags (UsageError on a malformed one).
std::vector<std::pair<std::string, std::string>> parse_hints(const std::vector<std::string>& hints);

}  // namespace mergepipe::app
