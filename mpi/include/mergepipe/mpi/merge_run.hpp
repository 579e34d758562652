#pragma once
// Runs a merge task on every rank of a communicator: split the blocks over the nodes by bytes,
// let each node's ranks draw chunks of its share, stream and merge them, write them into the
// shared output files, gather the output hashes and byte counts on rank 0. Collective: every
// rank calls it with the same task.
//
// Resume: when the output folder holds the journals of an interrupted run of the same task, the
// blocks they claim are read back from the output files and hashed; the ones that match are kept
// and only the rest is merged (the output is byte-identical to an uninterrupted run).
//
// A --full-read TIES task (no catalog) gets its trimming thresholds from the data: window by
// window (consecutive tensors of at most `window_bytes` of input per rank, or one tensor), each
// rank scans its share of the window's blocks for the thresholds and then merges it. A share
// that fits in memory is held there (read once, by large requests, O_DIRECT as `input_io` says)
// while the next one is read; a larger one (an embedding matrix) is read twice, the second time
// from the page cache. A --full-read task of a Gram method (slerp, model_stock, karcher,
// multislerp) gets its per-tensor coefficients the same way, from the Gram of the base and the
// deltas that the scan accumulates (tensor_gram.hpp).
//
// A budgeted merge reads a chunk's admitted expert blocks ahead in pieces held in memory
// (`expert_piece_bytes`, lib/held_pieces.hpp) while the previous piece merges.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/input_io.hpp"
#include "mergepipe/io/output_io.hpp"
#include "mergepipe/merge_task.hpp"
#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/progress.hpp"

namespace mergepipe::mpi {

// Which reads are checked against the catalog's block hashes: none, the first block each rank
// reads from each file, every block read, or every block read after a content check of every
// input file before the merge (kAll: that check is the catalog load's; here it acts as kEveryRead).
enum class VerifyReads { kOff, kFirstPerFile, kEveryRead, kAll };

// How a node's share of the blocks is spread over its ranks: drawn in chunks as they go, or a
// fixed contiguous range per rank (which rank reads which bytes does not depend on timing).
enum class Schedule { kDynamic, kStatic };

// Reads in flight per rank that keep a device (or a parallel file system) busy.
inline constexpr int kDeviceIoThreads = 8;

struct MergeRunOptions {
  std::string output_dir;  // an existing (staging) folder; tensor files are written inside it
  int threads = 1;
  // Reads in flight per rank; 0: kDeviceIoThreads, or one when every input file is already in
  // the page cache (each read is then a copy from memory; more readers only add thread
  // hand-offs). Pieces and windows read ahead into memory use kDeviceIoThreads then.
  int io_threads = 0;
  int prefetch_depth = 2;
  std::uint64_t read_bytes = 128u << 10;  // slice of a block read and merged at a time
  bool allow_nonfinite = false;
  std::vector<std::pair<std::string, std::string>> mpiio_hints;
  bool resume = false;  // output_dir holds an earlier attempt of this task: keep what checks out
  VerifyReads verify_reads = VerifyReads::kEveryRead;
  Schedule schedule = Schedule::kDynamic;  // budgeted and full-read linear merges
  // How inputs read once are read: budgeted expert blocks and held full-read TIES windows (the
  // base and whole expert files are read through the page cache).
  io::InputIo input_io = io::InputIo::kAuto;
  // How the safetensors shards are written (an HDF5 output goes through the HDF5 library).
  io::OutputIo output_io = io::OutputIo::kAuto;
  // Full-read TIES: input bytes per rank per scan-then-merge window. Two held windows of up to
  // 5/4 of it each are in memory at once. A linear or DARE full read whose experts are read
  // around the page cache holds pieces of this many expert bytes (see expert_piece_bytes).
  // 0: full_read_window_bytes(K) for TIES windows, kFullReadPieceBytes for pieces.
  std::uint64_t window_bytes = 0;
  // false: every TIES window is read twice, and linear and DARE full reads stream whole files,
  // through the page cache
  bool hold_windows = true;
  // A budgeted merge's held pieces hold their blocks' base bytes too, read like the experts
  // (O_DIRECT when cold). false: the base streams through the page cache with read-ahead, where
  // `--base-read-ahead` put it.
  bool hold_base = true;
  // Full-read TIES: parts of a share too large for a window buffer merge right after their scan
  // with thresholds guessed from the sketches so far, checked once the tensor's are known, and
  // are read again only where a guess trimmed some value differently (window_steps.hpp).
  // false: every part but the last is read twice.
  bool speculative_merge = true;
  // Budgeted merge whose expert files are read around the page cache (`input_io` direct, or
  // auto with a cold file): admitted expert bytes read ahead per piece, in large requests, into
  // memory the merge reads from (lib/held_pieces.hpp); two pieces are in memory at once. 0, or
  // experts read through the cache: the expert blocks are read slice by slice as they merge.
  std::uint64_t expert_piece_bytes = std::uint64_t{64} << 20;
  ProgressListener* progress = nullptr;  // rank 0
};

struct MergeRunResult {
  io::ByteCounts bytes;                    // summed over ranks (this run's reads and writes)
  std::vector<std::string> tensor_hashes;  // rank 0: per tensor (combine_block_hashes)
  std::vector<std::string> files;          // output data files written (names in output_dir)
  std::vector<float> thresholds;           // rank 0, full-read TIES: [expert][tensor] from data
  std::vector<float> linear_forms;         // rank 0, full-read Gram method: Plan::linear_forms
  double merge_seconds = 0;                // slowest rank
  double read_wait_seconds = 0, compute_seconds = 0, write_seconds = 0;  // slowest rank
  double scan_seconds = 0;            // slowest rank: full-read TIES threshold scans
  double scan_read_wait_seconds = 0;  // slowest rank: of which waiting for the scans' reads
  double finish_seconds = 0;          // slowest rank: flushing and closing the output files
  std::uint64_t max_rss_bytes = 0;    // largest peak RSS over ranks
  std::uint64_t blocks_total = 0;
  std::uint64_t blocks_resumed = 0;      // kept from an interrupted run after checking their bytes
  std::uint64_t blocks_rejected = 0;     // claimed by a journal but their bytes did not match
  std::uint64_t bytes_resume_check = 0;  // output bytes read back to check those claims
  std::uint64_t input_files = 0;         // input shards opened, summed over ranks
  std::uint64_t input_files_direct = 0;  // of which read with O_DIRECT
  io::OutputIo output_io = io::OutputIo::kBuffered;  // how the shards were written (never kAuto)
  int io_threads = 0;  // rank 0's reads in flight per stream (MergeRunOptions::io_threads resolved)
  std::uint64_t output_bytes_direct = 0;  // output bytes written with O_DIRECT, summed over ranks
  // Full-read TIES: scan-then-merge windows, rank shares of them held in memory (summed over
  // ranks) and the input bytes read into those.
  std::uint64_t windows = 0, held_shares = 0, held_bytes = 0;
  // ... and the longest time a rank waited for a held share's reads, and spent combining the
  // windows' sketches (waiting for the slowest rank included).
  double fill_wait_seconds = 0, combine_seconds = 0;
  // ... and the blocks merged speculatively (with guessed thresholds), of which merged again
  // because the guess did not hold, summed over ranks.
  std::uint64_t speculative_blocks = 0, speculative_redone = 0;
  std::uint64_t window_bytes = 0;  // the window size used
  // Budgeted merge, or linear or DARE full read: the piece size used (0: none), pieces merged,
  // of which held in memory, and the expert bytes read into those (summed over ranks).
  std::uint64_t expert_piece_bytes = 0;
  std::uint64_t expert_pieces = 0, held_pieces = 0, held_piece_bytes = 0;
};

inline constexpr std::uint64_t kFullReadPieceBytes = std::uint64_t{256} << 20;

MergeRunResult run_merge(const Comm& comm, const MergeTask& task, const MergeRunOptions& options);

// Name of the HDF5 output file inside the output folder.
inline constexpr const char* kHdf5OutputName = "model.h5";

}  // namespace mergepipe::mpi
