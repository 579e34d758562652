#include "mergepipe/mpi/merge_run.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cstring>

#include "mergepipe/blocking.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/executor.hpp"
#include "mergepipe/io/checkpoint_reader.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/mpi/output_sinks.hpp"
#include "mergepipe/mpi/partition.hpp"

namespace mergepipe::mpi {

namespace {

std::uint64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::vector<std::uint64_t> block_costs(const MergeTask& task, const Blocking& blocking) {
  std::vector<std::uint64_t> costs(blocking.blocks.size());
  for (std::size_t b = 0; b < costs.size(); ++b) {
    const Block& blk = blocking.blocks[b];
    std::uint64_t c = blk.byte_length + blk.elem_count * dtype_size(task.out_dtypes[blk.tensor]);
    for (std::size_t k = 0; k < task.experts.size(); ++k)
      if (task.plan.admitted(k, b)) c += blk.byte_length;
    costs[b] = c;
  }
  return costs;
}

std::string pack_u64(const std::vector<std::uint64_t>& values) {
  std::string s(values.size() * 8, '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

}  // namespace

MergeRunResult run_merge(const Comm& comm, const MergeTask& task, const MergeRunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  if (task.plan.block_count != blocking.blocks.size()) {
    throw InputError("plan covers " + std::to_string(task.plan.block_count) +
                     " blocks but the inputs have " + std::to_string(blocking.blocks.size()) +
                     " (plan made for another blocking)");
  }
  const std::vector<TensorInfo> out_tensors = task.output_tensors();
  const std::vector<BlockRange> ranges =
      partition_by_cost(block_costs(task, blocking), comm.size());
  const BlockRange mine = ranges[static_cast<std::size_t>(comm.rank())];

  ExecutionJob job = make_execution_job(task, blocking);
  job.threads = options.threads;
  job.prefetch_depth = options.prefetch_depth;
  job.allow_nonfinite = options.allow_nonfinite;

  const auto expert_access = task.full_read ? io::CheckpointBlockReader::ExpertAccess::kWholeFiles
                                            : io::CheckpointBlockReader::ExpertAccess::kExactRanges;
  io::global_byte_counters().reset();
  MergeRunResult result;
  ExecutionStats stats;
  InfoHints hints(options.mpiio_hints);

  // Every rank streams its blocks into the sink; the sink is finished collectively only once
  // every rank is known to have succeeded.
  auto stream_into = [&](auto& sink) {
    auto failure = capture_failure([&] {
      io::CheckpointBlockReader reader(task.base, task.experts, io::global_byte_counters(),
                                       expert_access);
      stats = execute_blocks(job, mine.begin, mine.end, reader, sink);
    });
    comm.check(failure, "merge");
    sink.finish();
  };
  if (task.format == OutputFormat::kSafetensors) {
    const io::OutputLayout layout = io::make_output_layout(out_tensors, task.max_shard_bytes);
    result.files = layout.shard_names;
    SafetensorsSink sink(comm, layout, options.output_dir, hints);
    stream_into(sink);
  } else {
    result.files = {kHdf5OutputName};
    Hdf5Sink sink(comm, out_tensors, options.output_dir + "/" + kHdf5OutputName);
    stream_into(sink);
  }

  // Output hashes: every rank's block hashes, in block order, on rank 0.
  const auto parts = comm.gather(pack_u64(stats.block_hashes), 0, "gather output hashes");
  if (comm.is_root()) {
    std::vector<std::uint64_t> all(blocking.blocks.size());
    for (int r = 0; r < comm.size(); ++r) {
      const auto& p = parts[static_cast<std::size_t>(r)];
      if (p.size() != (ranges[r].end - ranges[r].begin) * 8)
        throw IoError("output hashes lost in gather");
      std::memcpy(all.data() + ranges[r].begin, p.data(), p.size());
    }
    for (std::size_t t = 0; t < task.tensors.size(); ++t) {
      result.tensor_hashes.push_back(combine_block_hashes(
          std::span(all).subspan(blocking.first_block[t], blocking.block_count[t])));
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
  result.merge_seconds = comm.allreduce_max(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      "reduce timings");
  result.max_rss_bytes = comm.allreduce_max(peak_rss_bytes(), "reduce rss");
  return result;
}

}  // namespace mergepipe::mpi
