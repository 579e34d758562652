#include "mergepipe/mpi/merge_run.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>

#include "mergepipe/blocking.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/executor.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/held_pieces.hpp"
#include "mergepipe/io/checkpoint_reader.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hdf5_handle.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/io/resume_journal.hpp"
#include "mergepipe/io/writeback.hpp"
#include "mergepipe/mpi/node_counter.hpp"
#include "mergepipe/mpi/output_sinks.hpp"
#include "mergepipe/mpi/packing.hpp"
#include "mergepipe/mpi/partition.hpp"
#include "mergepipe/mpi/run_monitor.hpp"
#include "mergepipe/retained_window.hpp"
#include "mergepipe/tensor_statistics.hpp"
#include "mergepipe/thread_name.hpp"
#include "mergepipe/threshold_scan.hpp"
#include "mergepipe/window_steps.hpp"

namespace mergepipe::mpi {

namespace {

using Clock = std::chrono::steady_clock;
// Largest request of a held window's read: large enough for the device, small enough that the
// I/O threads share a window's ranges.
constexpr std::uint64_t kHeldRequestBytes = std::uint64_t{8} << 20;
// Largest request of a budgeted merge's expert piece (measured with --expert-piece-size 64MiB,
// K = 20 TIES 10%: see docs/benchmark-history.md).
constexpr std::uint64_t kPieceRequestBytes = std::uint64_t{4} << 20;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::uint64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

using BlockHashes = std::map<std::uint32_t, std::uint64_t>;

std::string pack_hashes(const BlockHashes& hashes) {
  Packer p;
  for (const auto& [block, hash] : hashes) {
    p.put(block);
    p.put(hash);
  }
  return p.out;
}

void unpack_hashes(const std::string& bytes, BlockHashes& into) {
  Unpacker u(bytes, "merge: block hashes");
  while (!u.done()) {
    const auto block = u.get<std::uint32_t>();
    into[block] = u.get<std::uint64_t>();
  }
}

// What a full read's scan decides per tensor: TIES thresholds (one per expert) or the linear
// form of a Gram method (base scale, then one alpha per expert).
using Thresholds = std::map<std::uint32_t, std::vector<float>>;

std::string pack_thresholds(const Thresholds& thresholds) {
  Packer p;
  for (const auto& [tensor, values] : thresholds) {
    p.put(tensor);
    p.put_vector(values);
  }
  return p.out;
}

void unpack_thresholds(const std::string& bytes, Thresholds& into) {
  Unpacker u(bytes, "merge: thresholds");
  while (!u.done()) {
    const auto tensor = u.get<std::uint32_t>();
    into[tensor] = u.get_vector<float>();
  }
}

// Checks reads against the catalog's content hashes (SPEC §2: a block hash per expert block,
// and per base block in catalogs that record them).
class ReadVerifier {
 public:
  ReadVerifier(const MergeTask& task, const Blocking& blocking, VerifyReads mode,
               const BlockReader& reader)
      : task_(task), blocking_(blocking), mode_(mode), reader_(reader) {}
  bool active() const {
    return mode_ != VerifyReads::kOff &&
           (!task_.expert_block_hashes.empty() || !task_.base_block_hashes.empty());
  }
  bool wanted(SourceId source, std::uint32_t block) {
    if (expected(source).empty()) return false;
    if (mode_ == VerifyReads::kAll || mode_ == VerifyReads::kEveryRead) return true;
    const CheckpointLocation& loc = source.expert == SourceId::kBase
                                        ? task_.base
                                        : task_.experts[static_cast<std::size_t>(source.expert)];
    // The first block this rank reads from each file.
    return seen_.insert({source.expert, loc.tensor_file[blocking_.blocks[block].tensor]}).second;
  }
  void verify(SourceId source, std::uint32_t block, std::uint64_t got) const {
    const std::uint64_t want = expected(source)[block];
    if (got == want) return;
    const Block& blk = blocking_.blocks[block];
    throw InputError(reader_.describe(source, blk.tensor, blk.byte_begin, blk.byte_length) +
                     ": block " + std::to_string(block) + " of tensor '" +
                     task_.tensors[blk.tensor].name + "' does not match the catalog (hash " +
                     hex64(got) + ", catalogued " + hex64(want) +
                     "): the file changed after it was catalogued (rebuild the catalog) or the "
                     "storage returned wrong data");
  }

 private:
  const std::vector<std::uint64_t>& expected(SourceId source) const {
    return source.expert == SourceId::kBase
               ? task_.base_block_hashes
               : task_.expert_block_hashes.at(static_cast<std::size_t>(source.expert));
  }
  const MergeTask& task_;
  const Blocking& blocking_;
  const VerifyReads mode_;
  const BlockReader& reader_;
  std::set<std::pair<int, std::uint32_t>> seen_;  // (source, file index) already checked
};

// Journal, progress and stop requests around execute_blocks.
class RankObserver : public ExecutionObserver {
 public:
  RankObserver(io::JournalWriter& journal, RunMonitor& monitor, BlockHashes& done)
      : journal_(journal), monitor_(monitor), done_(done) {}
  void block_done(std::uint32_t block, std::uint64_t output_hash,
                  std::uint64_t bytes_moved) override {
    journal_.block_done(block, output_hash);
    done_[block] = output_hash;
    monitor_.add(bytes_moved);
  }
  bool stop_requested() override { return monitor_.stop_requested(); }

 private:
  io::JournalWriter& journal_;
  RunMonitor& monitor_;
  BlockHashes& done_;
};

// What a speculative merge of a full-read TIES part wrote (window_steps.hpp): not journaled nor
// counted as done until the window's thresholds confirm the guess it merged with.
struct WrittenBlock {
  std::uint32_t block;
  std::uint64_t output_hash, bytes_moved;
};
class SpeculativeObserver : public ExecutionObserver {
 public:
  SpeculativeObserver(RunMonitor& monitor, std::vector<WrittenBlock>& written)
      : monitor_(monitor), written_(written) {}
  void block_done(std::uint32_t block, std::uint64_t output_hash,
                  std::uint64_t bytes_moved) override {
    written_.push_back({block, output_hash, bytes_moved});
  }
  bool stop_requested() override { return monitor_.stop_requested(); }

 private:
  RunMonitor& monitor_;
  std::vector<WrittenBlock>& written_;
};

// Hands each written range to the kernel's writeback at once (io/writeback.hpp).
class WritebackSink : public OutputSink {
 public:
  explicit WritebackSink(StagedOutput& output) : output_(output) {}
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override {
    output_.write(tensor, elem_begin, bytes);
    const OutputLocation where = output_.locate(tensor, elem_begin);
    writeback_.start(where.path, where.offset, bytes.size());
  }

 private:
  StagedOutput& output_;
  io::WritebackStarter writeback_;
};

// The journal claims of an interrupted run that the staged output bears out. Collective: the
// claims are spread over the ranks by bytes, each rank reads its share back and hashes it.
BlockHashes check_resume_claims(const Comm& comm, const MergeTask& task, const Blocking& blocking,
                                const StagedOutput& output, const BlockHashes& claims,
                                std::uint64_t& bytes_read) {
  std::vector<std::uint32_t> blocks;
  std::vector<std::uint64_t> costs;
  for (const auto& [block, hash] : claims) {
    blocks.push_back(block);
    const Block& blk = blocking.blocks[block];
    costs.push_back(blk.elem_count * dtype_size(task.out_dtypes[blk.tensor]) + 1);
  }
  const BlockRange mine =
      partition_by_cost(costs, comm.size())[static_cast<std::size_t>(comm.rank())];
  BlockHashes confirmed;
  auto failure = capture_failure([&] {
    std::map<std::string, io::File> files;
    std::vector<std::byte> bytes;
    for (std::uint32_t i = mine.begin; i < mine.end; ++i) {
      const Block& blk = blocking.blocks[blocks[i]];
      const OutputLocation where = output.locate(blk.tensor, blk.elem_begin);
      auto it = files.find(where.path);
      if (it == files.end())
        it = files.emplace(where.path, io::File(where.path, io::File::Mode::kRead)).first;
      bytes.resize(blk.elem_count * dtype_size(task.out_dtypes[blk.tensor]));
      try {
        it->second.read_at(where.offset, bytes);
      } catch (const InputError&) {
        continue;  // the file is shorter than the claim: the block was never written
      }
      bytes_read += bytes.size();
      if (hash64(bytes.data(), bytes.size()) == claims.at(blocks[i]))
        confirmed[blocks[i]] = claims.at(blocks[i]);
    }
  });
  comm.check(failure, "check the staged output of the interrupted run");
  BlockHashes all;
  for (const std::string& part : comm.allgather(pack_hashes(confirmed), "gather resume checks"))
    unpack_hashes(part, all);
  return all;
}

// Groups consecutive tensors into windows of at most `limit` input bytes (one tensor at least).
std::vector<std::vector<std::uint32_t>> make_windows(const std::vector<std::uint32_t>& tensors,
                                                     const std::vector<TensorInfo>& infos,
                                                     std::size_t sources, std::uint64_t limit) {
  std::vector<std::vector<std::uint32_t>> windows;
  std::uint64_t bytes = 0;
  for (std::uint32_t t : tensors) {
    const std::uint64_t b = infos[t].nbytes() * sources;
    if (windows.empty() || bytes + b > limit) {
      windows.emplace_back();
      bytes = 0;
    }
    windows.back().push_back(t);
    bytes += b;
  }
  return windows;
}

// This node's part of a budgeted merge: chunks of a contiguous share of the blocks left, and
// the counter its ranks draw them with. A static split inside the node left one rank merging
// alone for the last 0.2-0.9 s of a K = 20 TIES 10% merge (its I/O threads the device's only
// queue, the other rank's core idle), by a margin that varied from run to run.
struct NodeWork {
  std::optional<Comm> node;
  std::unique_ptr<NodeCounter> counter;  // freed (collectively) before `node`
  std::vector<BlockRange> chunks;
};

// Smallest chunk, in bytes moved: each one refills the read pipeline (milliseconds).
constexpr std::uint64_t kMinChunkCost = 64ull << 20;

// Collective. Nodes take contiguous shares in the order of their lowest rank, each in
// proportion to its number of ranks, so a node's reads stay in its part of every file and its
// page cache holds what it merges (the base read-ahead reads about these shares).
NodeWork share_of_this_node(const Comm& comm, std::span<const std::uint64_t> costs,
                            Schedule schedule) {
  NodeWork work;
  if (schedule == Schedule::kStatic) {  // this rank's own range, no counter
    const BlockRange mine =
        partition_by_cost(costs, comm.size())[static_cast<std::size_t>(comm.rank())];
    if (mine.begin < mine.end) work.chunks.push_back(mine);
    return work;
  }
  work.node.emplace(comm.split_node());
  int leader = comm.rank();
  for (const std::string& r : work.node->allgather(std::to_string(comm.rank()), "node ranks"))
    leader = std::min(leader, std::stoi(r));
  std::map<int, int> ranks_of_node;  // by leader, in rank order
  for (const std::string& l : comm.allgather(std::to_string(leader), "node leaders"))
    ++ranks_of_node[std::stoi(l)];
  int first_slot = 0;
  for (const auto& [node_leader, ranks] : ranks_of_node) {
    if (node_leader == leader) break;
    first_slot += ranks;
  }
  const int slots = ranks_of_node.at(leader);
  const std::vector<BlockRange> ranges = partition_by_cost(costs, comm.size());
  const BlockRange share{ranges[static_cast<std::size_t>(first_slot)].begin,
                         ranges[static_cast<std::size_t>(first_slot + slots - 1)].end};
  std::uint64_t share_cost = 0;
  for (std::uint32_t b = share.begin; b < share.end; ++b) share_cost += costs[b];
  // Small merges (tests, tiny models) still get several chunks per rank.
  const std::uint64_t min_cost = std::clamp<std::uint64_t>(
      share_cost / (4 * static_cast<std::uint64_t>(slots)), 1, kMinChunkCost);
  if (share.begin < share.end)
    work.chunks =
        slots == 1 ? std::vector<BlockRange>{share} : guided_chunks(costs, share, slots, min_cost);
  const std::optional<Error> failure =
      capture_failure([&] { work.counter = std::make_unique<NodeCounter>(*work.node); });
  try {
    comm.check(failure, "create the node's work counter");
  } catch (const CollectiveError&) {
    // Freeing a window is collective, and the rank that failed to create it would never join.
    (void)work.counter.release();
    throw;
  }
  return work;
}

}  // namespace

MergeRunResult run_merge(const Comm& comm, const MergeTask& task, const MergeRunOptions& options) {
  const auto t0 = Clock::now();
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  if (task.plan.block_count != blocking.blocks.size()) {
    throw InputError("plan covers " + std::to_string(task.plan.block_count) +
                     " blocks but the inputs have " + std::to_string(blocking.blocks.size()) +
                     " (plan made for another blocking)");
  }
  const std::size_t experts = task.experts.size();
  const std::size_t tensor_count = task.tensors.size();
  const std::vector<TensorInfo> out_tensors = task.output_tensors();
  const bool trims = uses_magnitude_trim(task.spec.method);
  const bool band = uses_band_trim(task.spec.method);
  const bool gram_methods = uses_tensor_statistics(task.spec.method);
  const bool scan_thresholds_from_data =
      task.full_read &&
      ((trims && task.plan.thresholds.empty()) || (gram_methods && task.plan.linear_forms.empty()));
  // Values per tensor the scan decides (Thresholds): a Gram method's linear form, or the trim
  // thresholds (breadcrumbs: K lower, then K upper).
  const std::size_t scan_values = gram_methods ? experts + 1 : (band ? 2 : 1) * experts;

  ExecutionJob job = make_execution_job(task, blocking);
  BlockPool buffers;  // one set of block buffers for every stream of this run
  job.pool = &buffers;
  job.threads = options.threads;
  job.prefetch_depth = options.prefetch_depth;
  job.slice_bytes = options.read_bytes;
  job.allow_nonfinite = options.allow_nonfinite;
  if (scan_thresholds_from_data && trims) job.thresholds.assign(scan_values * tensor_count, 0.0f);
  // A tensor's scan values, applied to the job before its blocks merge.
  auto apply_scan_values = [&](std::uint32_t tensor, const std::vector<float>& values) {
    if (gram_methods) {
      OperatorConfig::LinearForm& form = job.tensor_ops[tensor].linear_form.emplace();
      form.base_scale = values[0];
      form.alpha.assign(values.begin() + 1, values.end());
      return;
    }
    for (std::size_t r = 0; r < scan_values; ++r)
      job.thresholds[r * tensor_count + tensor] = values[r];
  };

  io::global_byte_counters().reset();
  MergeRunResult result;
  result.blocks_total = blocking.blocks.size();

  // The inputs. A full read's experts stream as whole files through the page cache unless it
  // holds them in memory (TIES windows; linear and DARE pieces of files read with O_DIRECT,
  // which hold the base bytes too, so its base is opened like an expert).
  const bool hold_full_read_pieces =
      task.full_read && !scan_thresholds_from_data && options.hold_windows;
  // A budgeted merge whose experts are read into held pieces holds its base bytes there too,
  // read around the page cache like theirs. Streamed through the cache, the base cost a cold
  // K = 20 TIES 10% merge 17% of its CPU samples in copies out of the cache, and on 2 vCPUs the
  // device reads slower while the CPUs are busy (alternated runs in docs/benchmarks.md).
  const bool hold_budgeted_base =
      !task.full_read && options.expert_piece_bytes > 0 && options.hold_base;
  std::optional<io::CheckpointBlockReader> input_reader;
  comm.check(capture_failure([&] {
               input_reader.emplace(
                   task.base, task.experts, io::global_byte_counters(),
                   task.full_read && !options.hold_windows
                       ? io::CheckpointBlockReader::ExpertAccess::kWholeFiles
                   : hold_full_read_pieces || hold_budgeted_base
                       ? io::CheckpointBlockReader::ExpertAccess::kHeldWindows
                       : io::CheckpointBlockReader::ExpertAccess::kExactRanges,
                   scan_thresholds_from_data ? io::InputIo::kBuffered : options.input_io);
             }),
             "merge");
  // Expert files read around the page cache, on every rank (the output mode and the pieces
  // follow it alike everywhere).
  const bool direct_here =
      options.input_io == io::InputIo::kDirect ||
      (options.input_io == io::InputIo::kAuto && input_reader->direct_expert_files() > 0);
  const bool experts_direct =
      comm.allreduce_max(std::uint64_t{direct_here ? 0u : 1u}, "reduce input modes") == 0;
  // Experts in the page cache: no pieces (below), so the base streams through the cache too.
  if ((hold_budgeted_base || hold_full_read_pieces) && !experts_direct)
    input_reader->stream_base_through_cache();
  // Reads in flight. A device needs a queue of them. When every input is already in the page
  // cache, each is a copy from memory, and more readers only cost thread hand-offs (on the
  // 2-core VM, a warm K = 8 merge on 1 rank switched threads 80,000 times at eight readers,
  // 12,000 at one). Measured there, warm K = 8 merge time at eight readers -> one (medians of
  // 4, free page reporting off): linear 2.24 -> 1.86 s at 1 rank, 1.24 -> 1.09 s at 2, 2.41 ->
  // 1.67 s at 1 rank x 2 threads; TIES 2.48 -> 2.15, 1.47 -> 1.30 and 2.52 -> 1.74 s. The
  // readers filling held windows and pieces issue large requests, a few hand-offs each: they
  // keep the device's number.
  const int fill_io_threads = options.io_threads > 0 ? options.io_threads : kDeviceIoThreads;
  const int stream_io_threads = options.io_threads > 0              ? options.io_threads
                                : input_reader->reads_from_memory() ? 1
                                                                    : kDeviceIoThreads;
  job.io_threads = stream_io_threads;
  result.io_threads = comm.is_root() ? stream_io_threads : 0;

  // The output files, created (or, resuming, reopened) collectively.
  bool resume = options.resume;
  InfoHints hints(options.mpiio_hints);
  std::unique_ptr<io::OutputLayout> layout;
  std::unique_ptr<StagedOutput> output;
  const SafetensorsSink* safetensors_output = nullptr;
  if (task.format == OutputFormat::kSafetensors) {
    layout = std::make_unique<io::OutputLayout>(
        io::make_output_layout(out_tensors, task.max_shard_bytes));
    result.files = layout->shard_names;
    // Whole files through the cache: full reads whose inputs are not held in memory.
    const bool streams_inputs_through_cache =
        task.full_read && !(scan_thresholds_from_data && options.hold_windows) &&
        !(hold_full_read_pieces && experts_direct);
    result.output_io = io::resolve_output_io(options.output_io, streams_inputs_through_cache);
    std::uint64_t largest_write = 0;  // a block's output bytes
    for (const Block& blk : blocking.blocks)
      largest_write =
          std::max(largest_write, blk.elem_count * dtype_size(layout->tensors[blk.tensor].dtype));
    auto sink = std::make_unique<SafetensorsSink>(comm, *layout, options.output_dir, hints,
                                                  result.output_io, largest_write);
    safetensors_output = sink.get();
    output = std::move(sink);
  } else {
    result.files = {kHdf5OutputName};
    const std::string path = options.output_dir + "/" + kHdf5OutputName;
    if (resume) {
      // A run killed before its file skeleton reached the disk left nothing to reopen.
      std::uint64_t opens = comm.is_root() && io::h5::file_opens(path) ? 1 : 0;
      resume = comm.allreduce_max(opens, "probe the staged HDF5 file") == 1;
    }
    output = std::make_unique<Hdf5Sink>(comm, out_tensors, path, hints, resume);
  }

  // What an interrupted run already did, checked against the bytes it left.
  BlockHashes done;
  Thresholds thresholds;
  if (resume) {
    std::string claims_bytes, thresholds_bytes;
    auto failure = capture_failure([&] {
      if (!comm.is_root()) return;
      const io::JournalContents journal =
          io::read_journals(options.output_dir, static_cast<std::uint32_t>(blocking.blocks.size()),
                            static_cast<std::uint32_t>(tensor_count), scan_values);
      claims_bytes = pack_hashes(BlockHashes(journal.blocks.begin(), journal.blocks.end()));
      if (scan_thresholds_from_data)
        thresholds_bytes =
            pack_thresholds(Thresholds(journal.thresholds.begin(), journal.thresholds.end()));
    });
    comm.check(failure, "read the resume journals");
    comm.broadcast(claims_bytes, 0, "broadcast resume claims");
    comm.broadcast(thresholds_bytes, 0, "broadcast resume thresholds");
    BlockHashes claims;
    unpack_hashes(claims_bytes, claims);
    unpack_thresholds(thresholds_bytes, thresholds);
    std::uint64_t checked_bytes = 0;
    done = check_resume_claims(comm, task, blocking, *output, claims, checked_bytes);
    result.bytes_resume_check = comm.allreduce_sum(checked_bytes, "reduce resume bytes");
    result.blocks_resumed = done.size();
    result.blocks_rejected = claims.size() - done.size();
  }
  for (const auto& [tensor, values] : thresholds) apply_scan_values(tensor, values);

  // This rank's share of what is left.
  std::vector<std::uint32_t> remaining;
  for (std::uint32_t b = 0; b < blocking.blocks.size(); ++b)
    if (!done.count(b)) remaining.push_back(b);
  std::vector<std::uint64_t> merge_cost(blocking.blocks.size(), 0);
  for (std::uint32_t b : remaining) merge_cost[b] = block_cost(job, b);

  std::uint64_t total_bytes = 0;
  // Full-read TIES: tensors whose thresholds are still unknown are scanned (every block read
  // once more, into sketches) before they are merged.
  auto scan_cost = [&](std::uint32_t b) -> std::uint64_t {
    const Block& blk = blocking.blocks[b];
    return thresholds.count(blk.tensor) ? 0 : blk.byte_length * (experts + 1);
  };
  if (scan_thresholds_from_data) {
    for (std::uint32_t b = 0; b < blocking.blocks.size(); ++b)
      total_bytes += merge_cost[b] + scan_cost(b);
  } else {
    for (std::uint32_t b : remaining) total_bytes += merge_cost[b];
  }

  // The blocks left are split over the nodes (contiguous, by cost, in proportion to their
  // ranks); a node's ranks draw chunks of its share as they go.
  NodeWork node_work;
  if (!scan_thresholds_from_data) {
    std::vector<std::uint64_t> costs;
    for (std::uint32_t b : remaining) costs.push_back(merge_cost[b]);
    node_work = share_of_this_node(comm, costs, options.schedule);
  }

  // Stream this rank's share.
  RunMonitor monitor(comm, "merge", total_bytes, options.progress);
  BlockHashes mine;
  Thresholds scanned;
  ExecutionStats stats;
  double scan_seconds = 0, scan_read_wait = 0;
  std::uint64_t input_files = 0, input_files_direct = 0;
  std::uint64_t window_count = 0, held_shares = 0, held_bytes = 0;
  std::uint64_t speculative_blocks = 0, speculative_redone = 0;
  double fill_wait = 0, combine_seconds = 0;
  std::uint64_t used_window_bytes = 0;
  std::uint64_t expert_piece_bytes = 0, expert_pieces = 0, held_pieces = 0, held_piece_bytes = 0;
  auto failure = capture_failure([&] {
    io::JournalWriter journal(options.output_dir, comm.rank());
    io::CheckpointBlockReader& reader = *input_reader;
    input_files = reader.total_files();
    input_files_direct = reader.direct_files();
    ReadVerifier verifier(task, blocking, options.verify_reads, reader);
    if (verifier.active()) {
      job.check_read.wanted = [&](SourceId source, std::uint32_t block) {
        return verifier.wanted(source, block);
      };
      job.check_read.verify = [&](SourceId source, std::uint32_t block, std::uint64_t hash) {
        verifier.verify(source, block, hash);
      };
    }
    RankObserver observer(journal, monitor, mine);
    // The safetensors writer starts writeback itself; HDF5 writes stay on this thread (HDF5 is
    // not thread-safe), so start theirs here.
    std::optional<WritebackSink> hdf5_sink;
    if (task.format == OutputFormat::kHdf5) hdf5_sink.emplace(*output);
    OutputSink& sink = hdf5_sink ? static_cast<OutputSink&>(*hdf5_sink) : *output;
    if (!scan_thresholds_from_data) {
      // Chunks of this node's share, drawn in turn by its ranks until none are left (a static
      // schedule: this rank's own range).
      std::uint64_t own = 0;
      auto next_chunk = [&]() -> std::optional<std::vector<std::uint32_t>> {
        const std::uint64_t next = node_work.counter ? node_work.counter->fetch_add(1) : own++;
        if (next >= node_work.chunks.size()) return std::nullopt;
        const BlockRange chunk = node_work.chunks[next];
        return std::vector<std::uint32_t>(remaining.begin() + chunk.begin,
                                          remaining.begin() + chunk.end);
      };
      // Pieces for expert files read around the page cache. A warm file's slices are copies
      // from memory that land in the CPU cache for the merge: holding them only adds a pass
      // over memory (warm K = 8 linear 100%, 2 ranks, merge time 1.72 -> 2.10 s with pieces,
      // medians of 4). A linear or DARE full read admits every expert of a block (K x 4 MiB),
      // so its pieces are as large as a TIES window; it used to stream whole files through the
      // page cache, which on the test VM reads at a fraction of O_DIRECT (the K = 20 family
      // once: 16.7-28.9 s through the cache on 4 threads, 6.1-9.1 s direct).
      HeldPieceOptions pieces;
      pieces.piece_bytes = !experts_direct         ? 0
                           : !task.full_read       ? options.expert_piece_bytes
                           : !options.hold_windows ? 0
                           : options.window_bytes  ? options.window_bytes
                                                   : kFullReadPieceBytes;
      expert_piece_bytes = pieces.piece_bytes;
      pieces.fill_threads = std::max(1, fill_io_threads / 2);
      pieces.request_bytes = kPieceRequestBytes;
      pieces.hold_base = pieces.piece_bytes > 0 && (task.full_read || hold_budgeted_base);
      HeldPieceStats held;
      accumulate(stats,
                 execute_in_held_pieces(job, next_chunk, reader, sink, &observer, pieces, &held));
      expert_pieces = held.pieces;
      held_pieces = held.held_pieces;
      held_piece_bytes = held.held_bytes;
      return;
    }
    ThresholdScan scan;
    scan.gram = gram_methods;
    scan.blocking = &blocking;
    scan.tensors = &task.tensors;
    for (const ExpertSpec& e : task.spec.experts) {
      scan.densities.push_back(e.density);
      if (band) scan.gammas.push_back(e.gamma);
    }
    if (task.spec.varies_by_tensor()) {
      std::vector<std::string> names;
      for (const TensorInfo& t : task.tensors) names.push_back(t.name);
      for (const MergeSpec& s : specs_by_tensor(task.spec, names))
        for (const ExpertSpec& e : s.experts) {
          scan.tensor_densities.push_back(e.density);
          if (band) scan.tensor_gammas.push_back(e.gamma);
        }
    }
    scan.threads = options.threads;
    scan.io_threads = stream_io_threads;
    scan.prefetch_depth = options.prefetch_depth;
    scan.slice_bytes = options.read_bytes;
    scan.pool = &buffers;
    scan.on_block = [&](std::uint64_t bytes) { monitor.add(bytes); };
    scan.stop_requested = [&] { return monitor.stop_requested(); };
    // Windows are shared by all ranks: each rank scans and then merges its share of every
    // window, the sketches of a tensor's parts are combined in between. So a window's reads
    // are in the page cache of the node that merges them, and a tensor larger than a window
    // (an embedding) is split over the ranks instead of being held by one.
    std::vector<char> unchanged_pairs(blocking.blocks.size() * experts, 0);  // [block][expert]
    job.admitted = [&unchanged_pairs, experts, admitted = job.admitted](std::size_t k,
                                                                        std::size_t b) {
      return !unchanged_pairs[b * experts + k] && admitted(k, b);
    };
    std::vector<std::uint32_t> pending_tensors;
    for (std::uint32_t t = 0; t < tensor_count; ++t) {
      bool work = !thresholds.count(t);
      for (std::uint32_t i = 0; i < blocking.block_count[t] && !work; ++i)
        work = !done.count(blocking.first_block[t] + i);
      if (work) pending_tensors.push_back(t);
    }
    const std::uint64_t window_bytes =
        options.window_bytes ? options.window_bytes : full_read_window_bytes(experts);
    const auto windows = make_windows(pending_tensors, task.tensors, experts + 1,
                                      window_bytes * static_cast<std::uint64_t>(comm.size()));
    window_count = windows.size();
    used_window_bytes = window_bytes;
    auto blocks_of = [&](const std::vector<std::uint32_t>& window) {
      std::vector<std::uint32_t> blocks;
      std::vector<std::uint64_t> costs;
      for (std::uint32_t t : window)
        for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i) {
          const std::uint32_t b = blocking.first_block[t] + i;
          blocks.push_back(b);
          costs.push_back(merge_cost[b] + scan_cost(b) + 1);
        }
      const BlockRange r =
          partition_by_cost(costs, comm.size())[static_cast<std::size_t>(comm.rank())];
      return std::vector<std::uint32_t>(blocks.begin() + r.begin, blocks.begin() + r.end);
    };
    // Each window's share is read into memory and served from there to the scan and the merge,
    // each byte by one large request (O_DIRECT where the files allow), into two buffers so the
    // next step is read while this one is scanned and merged; a share larger than a buffer (an
    // embedding matrix) in parts, each read twice (window_steps.hpp). Without held windows the
    // share is read from the page cache, which the kernel fills in advance.
    std::optional<io::CheckpointBlockReader> held_reader;
    if (options.hold_windows)
      held_reader.emplace(task.base, task.experts, io::global_byte_counters(),
                          io::CheckpointBlockReader::ExpertAccess::kHeldWindows, options.input_io);
    if (held_reader) input_files_direct = held_reader->direct_files();
    auto footprint = [&](std::span<const std::uint32_t> blocks) {
      return RetainedWindow::footprint(*held_reader, held_ranges(blocking, blocks, experts));
    };
    struct Step {
      std::size_t window;
      WindowStep work;
    };
    std::vector<Step> steps;
    for (std::size_t w = 0; w < windows.size(); ++w) {
      std::vector<std::uint32_t> to_scan, to_merge;
      for (std::uint32_t b : blocks_of(windows[w])) {
        if (!thresholds.count(blocking.blocks[b].tensor)) to_scan.push_back(b);
        if (!done.count(b)) to_merge.push_back(b);
      }
      // Speculation guesses thresholds from part of a tensor; a Gram has no such guess, and
      // its check (MagnitudeSketch::decided_differently) knows one threshold, not a band.
      for (WindowStep& s :
           window_steps(to_scan, to_merge, footprint, window_bytes, held_reader.has_value(),
                        options.speculative_merge && trims && !band))
        steps.push_back({w, std::move(s)});
    }
    // A recheck step's blocks are known once its window's guesses are checked.
    std::vector<char> awaiting_check(steps.size(), 0);
    for (std::size_t j = 0; j < steps.size(); ++j) awaiting_check[j] = steps[j].work.recheck;
    auto skipped = [&](std::size_t j) {
      return steps[j].work.recheck && !awaiting_check[j] && steps[j].work.to_merge.empty();
    };
    auto next_to_run = [&](std::size_t j) {
      while (j < steps.size() && skipped(j)) ++j;
      return j;
    };
    // The speculative merges of the current window, and the blocks whose guess held.
    struct Speculation {
      std::map<std::uint32_t, std::vector<float>> guessed;        // per tensor merged, per expert
      std::map<std::uint32_t, std::vector<MagnitudeSketch>> own;  // the part's sketches
      std::vector<WrittenBlock> written;
    };
    std::vector<Speculation> speculations;
    std::vector<char> confirmed(blocking.blocks.size(), 0);
    // Checks each guess against the window's combined thresholds: a part's blocks of a tensor
    // are done when no value of the part is trimmed differently under the two (its own sketch
    // says), else merged again by the window's recheck steps.
    auto check_guesses = [&](std::size_t w, std::size_t combine_step) {
      for (const Speculation& guess : speculations) {
        std::set<std::uint32_t> wrong;
        for (const auto& [t, guessed] : guess.guessed) {
          const std::vector<float>& actual = scanned.at(t);
          for (std::size_t k = 0; k < experts; ++k)
            if (guessed[k] != actual[k] &&
                guess.own.at(t)[k].decided_differently(guessed[k], actual[k]) > 0)
              wrong.insert(t);
        }
        for (const WrittenBlock& b : guess.written) {
          ++speculative_blocks;
          if (wrong.count(blocking.blocks[b.block].tensor)) {
            ++speculative_redone;
            continue;
          }
          confirmed[b.block] = 1;
          observer.block_done(b.block, b.output_hash, b.bytes_moved);
        }
      }
      speculations.clear();
      for (std::size_t j = combine_step + 1; j < steps.size() && steps[j].window == w; ++j) {
        if (!steps[j].work.recheck) continue;
        std::erase_if(steps[j].work.to_merge, [&](std::uint32_t b) { return confirmed[b] != 0; });
        awaiting_check[j] = 0;
      }
    };
    // What a held step reads: its blocks, less the expert blocks a scan already found identical
    // to the base (merged as omitted, so never read again). Decided when its read starts.
    auto ranges_of = [&](const WindowStep& step) {
      return held_ranges(blocking, step_blocks(step), experts, [&](std::size_t k, std::uint32_t b) {
        return !unchanged_pairs[std::size_t{b} * experts + k];
      });
    };
    // The Gram methods: every rank's per-block Grams of window w, summed per tensor in block
    // order (so the same whatever the split), decide each tensor's linear form. Collective.
    auto combine_grams = [&](std::size_t w, const ScanResult& part) {
      Packer mine_packed;
      for (const auto& [block, gram] : part.grams) {
        mine_packed.put(block);
        mine_packed.put_vector(gram.sums);
      }
      std::map<std::uint32_t, TensorGram> by_block;
      for (const std::string& p : comm.allgather(mine_packed.out, "combine tensor Grams")) {
        Unpacker u(p, "merge: tensor Grams");
        while (!u.done()) {
          const auto block = u.get<std::uint32_t>();
          TensorGram& into = by_block[block];
          into = TensorGram(experts);
          into.sums = u.get_vector<double>();
          if (into.sums.size() != gram_pair_count(experts + 1))
            throw IoError("merge: a block's Gram has " + std::to_string(into.sums.size()) +
                          " sums, not " + std::to_string(gram_pair_count(experts + 1)));
        }
      }
      for (std::uint32_t t : windows[w]) {
        if (thresholds.count(t)) continue;
        TensorGram whole(experts);
        for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i) {
          const auto it = by_block.find(blocking.first_block[t] + i);
          if (it == by_block.end())
            throw IoError("merge: the Gram of a block of tensor '" + task.tensors[t].name +
                          "' was lost in the gather");
          whole += it->second;
        }
        const OperatorConfig::LinearForm form =
            linear_form_from_gram(job.op_for(t), whole, task.tensors[t].name);
        std::vector<float> values{form.base_scale};
        values.insert(values.end(), form.alpha.begin(), form.alpha.end());
        if (comm.is_root()) journal.thresholds(t, values);
        apply_scan_values(t, values);
        scanned[t] = std::move(values);
      }
    };
    // Combines every rank's part of window w's sketches (integer counts, so the result does not
    // depend on how a tensor was split) into the thresholds of its tensors. Collective.
    auto combine_sketches = [&](std::size_t w, const ScanResult& part) {
      const MagnitudeSketch none;
      auto part_of = [&](std::uint32_t t, std::size_t k) -> const MagnitudeSketch& {
        return part.sketches.empty() || part.sketches[t].empty() ? none : part.sketches[t][k];
      };
      if (gram_methods) return combine_grams(w, part);
      Packer mine_packed;
      for (std::uint32_t t : windows[w]) {
        if (thresholds.count(t)) continue;
        for (std::size_t k = 0; k < experts; ++k) {
          mine_packed.put_vector(part_of(t, k).keys());
          mine_packed.put_vector(part_of(t, k).counts());
        }
      }
      std::vector<std::vector<MagnitudeSketch>> whole(tensor_count);
      for (const std::string& p : comm.allgather(mine_packed.out, "combine sketches")) {
        Unpacker u(p, "merge: sketches");
        for (std::uint32_t t : windows[w]) {
          if (thresholds.count(t)) continue;
          whole[t].resize(experts);
          for (std::size_t k = 0; k < experts; ++k) {
            const auto keys = u.get_vector<std::uint16_t>();
            const auto counts = u.get_vector<std::uint64_t>();
            whole[t][k].merge(MagnitudeSketch::from_sparse(keys, counts));
          }
        }
      }
      for (std::uint32_t t : windows[w]) {
        if (thresholds.count(t)) continue;
        std::vector<float> values = tensor_trim_thresholds(scan, t, whole[t]);
        if (comm.is_root()) journal.thresholds(t, values);
        apply_scan_values(t, values);
        scanned[t] = std::move(values);
      }
    };
    std::array<RetainedWindow, 2> held;
    std::size_t held_count = 0;  // held steps so far: the i-th uses held[i % 2]
    // Each buffer is sized for the largest held step before its first read. Grown as steps
    // came, a buffer freed its memory and faulted in all of the new: a cold K = 10 full-read
    // TIES took 967 huge-page faults for what 2 x 264 MiB per rank needs, each zeroing 2 MiB on
    // the read's path.
    std::uint64_t largest_held_step = 0;
    for (const Step& s : steps)
      if (s.work.held)
        largest_held_step = std::max(largest_held_step, footprint(step_blocks(s.work)));
    // Scanning and merging a share that is not held reads it from the page cache, so the
    // storage would sit idle meanwhile: have the kernel fetch the next share while this one is
    // scanned and merged (started only after the scan, the fetch overlapped half the CPU work
    // and a full-read TIES took ~1.5x its I/O time).
    auto fetch = [&](const WindowStep* step, RetainedWindow* into, std::vector<HeldRange> ranges) {
      name_this_thread("mp-fetch");
      if (into) {
        into->reserve(largest_held_step);
        into->fill(*held_reader, ranges, fill_io_threads, kHeldRequestBytes);
        return;
      }
      for (std::uint32_t b : step->to_scan) {
        const Block& blk = blocking.blocks[b];
        for (int source = SourceId::kBase; source < static_cast<int>(experts); ++source)
          reader.prefetch(SourceId{source}, blk.tensor, blk.byte_begin, blk.byte_length);
      }
    };
    std::future<void> fetching;  // declared after what it uses: its destructor waits for it
    auto start_fetch = [&](std::size_t i) -> RetainedWindow* {
      const WindowStep& step = steps[i].work;
      RetainedWindow* into = step.held ? &held[held_count++ % 2] : nullptr;
      std::vector<HeldRange> ranges;
      if (into) {
        ranges = ranges_of(step);
        ++held_shares;
        for (const HeldRange& r : ranges) held_bytes += r.length;
      }
      fetching = std::async(std::launch::async, fetch, &step, into, std::move(ranges));
      return into;
    };
    RetainedWindow* next_held = steps.empty() ? nullptr : start_fetch(0);
    std::size_t i = 0;  // the next step
    for (std::size_t w = 0; w < windows.size(); ++w) {
      // Every rank has one combining step per window, and its number of steps varies: a failure
      // here skips this rank's remaining work and ends the merge on every rank at the window's
      // next check, not at once.
      std::optional<Error> window_failure;
      ScanResult part;  // this rank's sketches of the window so far
      for (; i < steps.size() && steps[i].window == w; ++i) {
        if (skipped(i)) continue;  // every guess it would recheck held
        const WindowStep& step = steps[i].work;
        if (!window_failure)
          window_failure = capture_failure([&] {
            const auto tw = Clock::now();
            if (fetching.valid()) fetching.get();
            fill_wait += seconds_since(tw);
          });
        RetainedWindow* const this_held = std::exchange(next_held, nullptr);
        // The next step's read starts now, unless it is a recheck whose blocks this step's
        // combine decides: then once they are known.
        bool fetch_after_check = false;
        if (const std::size_t next = next_to_run(i + 1); !window_failure && next < steps.size()) {
          if (awaiting_check[next])
            fetch_after_check = true;
          else
            next_held = start_fetch(next);
        }
        BlockReader& source = this_held ? static_cast<BlockReader&>(*this_held) : reader;
        // A held step's bytes are all in memory: its streams find them on their own thread.
        scan.io_threads = job.io_threads = this_held ? 0 : stream_io_threads;
        const auto ts = Clock::now();
        std::map<std::uint32_t, std::vector<MagnitudeSketch>> own_sketches;  // speculating
        if (!window_failure && !step.to_scan.empty()) {
          window_failure = capture_failure([&] {
            ScanResult scanned_part = scan_sketches(scan, step.to_scan, source);
            if (step.speculative)
              for (std::uint32_t b : step.to_merge) {
                const std::uint32_t t = blocking.blocks[b].tensor;
                if (!own_sketches.count(t)) own_sketches[t] = scanned_part.sketches[t];
              }
            scan_read_wait += scanned_part.read_wait_seconds;
            part.grams.merge(scanned_part.grams);  // blocks are scanned once
            if (!scanned_part.sketches.empty()) {
              if (part.sketches.empty()) part.sketches.resize(tensor_count);
              for (std::uint32_t t : windows[w]) {
                std::vector<MagnitudeSketch>& into = part.sketches[t];
                if (into.empty()) into.resize(experts);
                for (std::size_t k = 0; k < experts; ++k)
                  into[k].merge(scanned_part.sketches[t][k]);
              }
            }
            // Expert blocks identical to the base merge as omitted ones: not read again. The
            // progress total counted them in the merge's bytes, so they count as done here (a
            // full read of a family of partial fine-tunes ended its bar at 73-80%).
            std::uint64_t skipped_bytes = 0;
            for (const auto& [block, changed] : scanned_part.changed)
              for (std::size_t k = 0; k < experts; ++k) {
                char& unchanged = unchanged_pairs[std::size_t{block} * experts + k];
                if (changed[k] || unchanged) continue;
                unchanged = 1;
                skipped_bytes += blocking.blocks[block].byte_length;
              }
            monitor.add(skipped_bytes);
          });
        }
        if (step.combine) {
          const auto tc = Clock::now();
          comm.check(window_failure, "scan thresholds");
          combine_sketches(w, part);
          check_guesses(w, i);
          combine_seconds += seconds_since(tc);
        }
        if (fetch_after_check && !window_failure)
          if (const std::size_t next = next_to_run(i + 1); next < steps.size())
            next_held = start_fetch(next);
        scan_seconds += seconds_since(ts);
        if (!window_failure && step.speculative) {
          // Thresholds guessed from this rank's sketches of each tensor so far.
          Speculation& guess = speculations.emplace_back();
          guess.own = std::move(own_sketches);
          for (const auto& [t, own] : guess.own) {
            std::vector<float>& guessed = guess.guessed[t];
            for (std::size_t k = 0; k < experts; ++k) {
              guessed.push_back(part.sketches[t][k].threshold(scan.density(t, k)));
              job.thresholds[k * tensor_count + t] = guessed[k];
            }
          }
          SpeculativeObserver held_back(monitor, guess.written);
          window_failure = capture_failure([&] {
            accumulate(stats, execute_blocks(job, step.to_merge, source, sink, &held_back));
          });
        } else if (!window_failure && !step.to_merge.empty()) {
          std::vector<std::uint32_t> to_merge = step.to_merge;
          // Merge a share read from the page cache backwards: the cache evicts the oldest pages
          // first, so the blocks scanned last are the likeliest to still be there, and merging
          // them first gives other reads the least time to push the rest out.
          if (!this_held) std::reverse(to_merge.begin(), to_merge.end());
          window_failure = capture_failure(
              [&] { accumulate(stats, execute_blocks(job, to_merge, source, sink, &observer)); });
        }
      }
      comm.check(window_failure, "merge");
    }
  });
  monitor.finish(failure.has_value());
  comm.check(failure, "merge");
  node_work = {};  // frees the shared window (collective) here, where every rank is
  const auto finish_start = Clock::now();
  output->finish();
  const double finish_seconds = seconds_since(finish_start);
  const std::uint64_t output_direct = safetensors_output ? safetensors_output->direct_bytes() : 0;

  // Output hashes of every block on rank 0: the confirmed claims plus what each rank merged.
  const auto parts = comm.gather(pack_hashes(mine), 0, "gather output hashes");
  if (comm.is_root()) {
    BlockHashes all = done;
    for (const std::string& p : parts) unpack_hashes(p, all);
    if (all.size() != blocking.blocks.size())
      throw IoError("merge: output hashes of " +
                    std::to_string(blocking.blocks.size() - all.size()) +
                    " blocks were lost in the gather");
    std::vector<std::uint64_t> flat(blocking.blocks.size());
    for (const auto& [block, hash] : all) flat[block] = hash;
    for (std::size_t t = 0; t < tensor_count; ++t) {
      result.tensor_hashes.push_back(combine_block_hashes(
          std::span(flat).subspan(blocking.first_block[t], blocking.block_count[t])));
    }
    if (scan_thresholds_from_data) {
      // Every rank combined every window's sketches, so rank 0 knows all thresholds.
      Thresholds known = thresholds;
      known.insert(scanned.begin(), scanned.end());
      if (known.size() != tensor_count)
        throw IoError("merge: thresholds of " + std::to_string(tensor_count - known.size()) +
                      " tensors were lost in the gather");
      std::vector<float>& out = gram_methods ? result.linear_forms : result.thresholds;
      out.assign(scan_values * tensor_count, 0.0f);
      for (const auto& [tensor, values] : known)
        for (std::size_t k = 0; k < scan_values; ++k) {
          // thresholds are [row][tensor], linear forms [tensor][value]
          out[gram_methods ? tensor * scan_values + k : k * tensor_count + tensor] = values[k];
        }
    }
  }

  const io::ByteCounts local = io::global_byte_counters().snapshot();
  result.bytes.base = comm.allreduce_sum(local.base, "reduce bytes");
  result.bytes.expert = comm.allreduce_sum(local.expert, "reduce bytes");
  result.bytes.output_written = comm.allreduce_sum(local.output_written, "reduce bytes");
  result.bytes.catalog = comm.allreduce_sum(local.catalog, "reduce bytes");
  result.read_wait_seconds = comm.allreduce_max(stats.read_wait_seconds, "reduce timings");
  result.compute_seconds = comm.allreduce_max(stats.compute_seconds, "reduce timings");
  result.write_seconds = comm.allreduce_max(stats.write_seconds, "reduce timings");
  result.scan_seconds = comm.allreduce_max(scan_seconds, "reduce timings");
  result.scan_read_wait_seconds = comm.allreduce_max(scan_read_wait, "reduce timings");
  result.finish_seconds = comm.allreduce_max(finish_seconds, "reduce timings");
  result.merge_seconds = comm.allreduce_max(seconds_since(t0), "reduce timings");
  result.max_rss_bytes = comm.allreduce_max(peak_rss_bytes(), "reduce rss");
  result.input_files = comm.allreduce_sum(input_files, "reduce input files");
  result.input_files_direct = comm.allreduce_sum(input_files_direct, "reduce input files");
  result.output_bytes_direct = comm.allreduce_sum(output_direct, "reduce output bytes");
  result.windows = window_count;
  result.window_bytes = used_window_bytes;
  result.held_shares = comm.allreduce_sum(held_shares, "reduce held windows");
  result.held_bytes = comm.allreduce_sum(held_bytes, "reduce held windows");
  result.fill_wait_seconds = comm.allreduce_max(fill_wait, "reduce held windows");
  result.combine_seconds = comm.allreduce_max(combine_seconds, "reduce held windows");
  result.speculative_blocks = comm.allreduce_sum(speculative_blocks, "reduce speculation");
  result.speculative_redone = comm.allreduce_sum(speculative_redone, "reduce speculation");
  result.expert_piece_bytes = comm.allreduce_max(expert_piece_bytes, "reduce expert pieces");
  result.expert_pieces = comm.allreduce_sum(expert_pieces, "reduce expert pieces");
  result.held_pieces = comm.allreduce_sum(held_pieces, "reduce expert pieces");
  result.held_piece_bytes = comm.allreduce_sum(held_piece_bytes, "reduce expert pieces");
  return result;
}

}  // namespace mergepipe::mpi
