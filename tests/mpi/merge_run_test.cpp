// Distributed merge at 1, 2 and 4 ranks: the output bytes and hashes equal a serial in-process
// reference whatever the rank count, and a failure on one rank ends every rank with its message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "mergepipe/blocking.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/executor.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/checkpoint_location.hpp"
#include "mergepipe/io/checkpoint_reader.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/io/resume_journal.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/mpi/merge_run.hpp"
#include "mergepipe/planner.hpp"

using namespace mergepipe;
namespace fs = std::filesystem;

namespace {

const std::vector<TensorInfo> kTensors = {
    {"model.embed_tokens.weight", DType::kBF16, {96, 32}},
    {"model.layers.0.mlp.up_proj.weight", DType::kBF16, {64, 32}},
    {"model.norm.weight", DType::kBF16, {32}},
    {"lm_head.weight", DType::kBF16, {96, 32}}};

std::vector<std::byte> bf16_values(const TensorInfo& t, std::mt19937& rng,
                                   const std::vector<std::byte>* base) {
  std::normal_distribution<float> dist(0.0f, base ? 0.003f : 0.02f);
  std::vector<std::byte> bytes(t.nbytes());
  for (std::uint64_t i = 0; i < t.numel(); ++i) {
    float v = dist(rng);
    if (base) {
      std::uint16_t b;
      std::memcpy(&b, base->data() + 2 * i, 2);
      v += bf16_to_f32(b);
    }
    const std::uint16_t h = f32_to_bf16(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

// Rank 0 writes base + 3 experts under a folder every rank agrees on.
std::string make_family(const mpi::Comm& comm) {
  std::string dir;
  if (comm.is_root()) {
    dir = (fs::temp_directory_path() / ("mergepipe-mpi-merge-" + std::to_string(::getpid())))
              .string();
    fs::remove_all(dir);
    std::mt19937 rng(17);
    std::vector<std::vector<std::byte>> base;
    for (const auto& t : kTensors) base.push_back(bf16_values(t, rng, nullptr));
    for (int c = 0; c < 4; ++c) {
      const std::string folder = dir + (c == 0 ? "/base" : "/expert" + std::to_string(c - 1));
      fs::create_directories(folder);
      std::vector<std::vector<std::byte>> data;
      for (std::size_t t = 0; t < kTensors.size(); ++t)
        data.push_back(c == 0 ? base[t] : bf16_values(kTensors[t], rng, &base[t]));
      std::vector<std::span<const std::byte>> spans(data.begin(), data.end());
      io::write_safetensors(folder + "/model.safetensors", kTensors, spans);
    }
  }
  comm.broadcast(dir, 0, "family dir");
  return dir;
}

MergeTask make_task(const std::string& dir) {
  MergeTask task;
  task.spec.method = MergeMethod::kTies;
  task.spec.base_model = dir + "/base";
  for (int k = 0; k < 3; ++k)
    task.spec.experts.push_back({dir + "/expert" + std::to_string(k), 1.0 + k, 0.4});
  const Checkpoint base = io::open_checkpoint(task.spec.base_model);
  task.tensors = base.tensor_infos();
  task.block_bytes = 512;
  task.base = io::locate_tensors(base, task.tensors);
  for (const auto& e : task.spec.experts)
    task.experts.push_back(io::locate_tensors(io::open_checkpoint(e.path), task.tensors));
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  task.plan = make_full_read_plan(task.spec, task.tensors, blocking, "test");
  // Omit a deterministic pattern of pairs, as a budget would.
  for (std::size_t b = 0; b < blocking.blocks.size(); b += 3)
    task.plan.mask[1].words[b / 64] &= ~(std::uint64_t{1} << (b % 64));
  task.plan.thresholds.assign(3 * task.tensors.size(), 0.002f);
  task.plan.hash = compute_plan_hash(task.plan);
  task.out_dtypes.assign(task.tensors.size(), DType::kBF16);
  task.max_shard_bytes = 12000;  // several shards, so tensors land in different files
  return task;
}

// make_task as a --full-read of `method`: every pair admitted, no thresholds given.
MergeTask full_read_task(const std::string& dir, MergeMethod method) {
  MergeTask task = make_task(dir);
  task.spec.method = method;
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  task.full_read = true;
  task.plan = make_full_read_plan(task.spec, task.tensors, blocking, "test");
  task.plan.hash = compute_plan_hash(task.plan);
  return task;
}

// Cuts the end off the last expert's file once every rank has opened the inputs: only the
// ranks whose blocks reach its end fail.
void truncate_last_expert(const mpi::Comm& comm, const std::string& dir) {
  comm.barrier("every rank has opened the inputs");
  if (comm.is_root()) {
    const std::string victim = dir + "/expert2/model.safetensors";
    fs::resize_file(victim, fs::file_size(victim) - 100);
  }
  comm.barrier("truncate");
}

// The exit code and message every rank ends with when a merge fails (0 and "" if it did not).
struct Failure {
  int code = 0;
  std::string message;
};
Failure failure_of(const mpi::Comm& comm, const MergeTask& task,
                   const mpi::MergeRunOptions& options) {
  try {
    mpi::run_merge(comm, task, options);
  } catch (const mpi::CollectiveError& e) {
    return {static_cast<int>(e.code()), e.what()};
  }
  return {};
}

// Collects merged bytes per tensor in memory.
class MemorySink : public OutputSink {
 public:
  explicit MemorySink(const std::vector<TensorInfo>& tensors) {
    for (const auto& t : tensors) bytes.emplace_back(t.nbytes());
  }
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> data) override {
    std::memcpy(bytes[tensor].data() + elem_begin * 2, data.data(), data.size());
  }
  std::vector<std::vector<std::byte>> bytes;
};

bool serial_reference_matches(const MergeTask& task, const std::string& out,
                              const mpi::MergeRunResult& result) {
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  const ExecutionJob job = make_execution_job(task, blocking);
  io::ByteCounters counters;
  io::CheckpointBlockReader reader(task.base, task.experts, counters);
  MemorySink sink(task.tensors);
  const ExecutionStats stats =
      execute_blocks(job, block_range(0, std::uint32_t(blocking.blocks.size())), reader, sink);
  bool ok = true;
  for (std::size_t t = 0; t < task.tensors.size(); ++t) {
    const std::string expect = combine_block_hashes(
        std::span(stats.block_hashes).subspan(blocking.first_block[t], blocking.block_count[t]));
    ok &= expect == result.tensor_hashes[t];
  }
  // The bytes in the shard files are the reference bytes.
  for (const auto& f : result.files) {
    const auto header = io::read_safetensors_header(out + "/" + f);
    io::File file(out + "/" + f, io::File::Mode::kRead);
    for (const auto& st : header.tensors) {
      std::size_t t = 0;
      while (task.tensors[t].name != st.info.name) ++t;
      std::vector<std::byte> got(st.length);
      file.read_at(st.offset, got);
      ok &= got == sink.bytes[t];
    }
  }
  return ok;
}

// The model files of an output folder. The resume journals are left out: which rank merged
// (and journaled) a block depends on timing, as the ranks of a node draw chunks of its share.
std::string output_digest(const std::string& dir) {
  Hasher128 h;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("journal-", 0) != 0)
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    const std::string bytes = io::read_text_file(dir + "/" + n);
    h.update(n.data(), n.size());
    h.update(bytes.data(), bytes.size());
  }
  return h.hex();
}

}  // namespace

TEST(MPI, MergeOutputIsIndependentOfRankCount) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  const MergeTask task = make_task(dir);
  const std::string out = dir + "/out-np" + std::to_string(comm.size());
  if (comm.is_root()) fs::create_directories(out);
  comm.barrier("mkdir");
  mpi::MergeRunOptions options;
  options.output_dir = out;
  options.threads = 2;
  options.input_io = io::InputIo::kDirect;  // expert pieces held (the files are in the cache)
  const mpi::MergeRunResult result = mpi::run_merge(comm, task, options);

  // A second run with other thread and prefetch settings gives the same files.
  const std::string out2 = dir + "/out2-np" + std::to_string(comm.size());
  if (comm.is_root()) fs::create_directories(out2);
  comm.barrier("mkdir");
  options.output_dir = out2;
  options.threads = 1;
  options.prefetch_depth = 5;
  options.io_threads = 3;  // cached files take one reader by default: keep several in flight
  options.input_io = io::InputIo::kBuffered;  // expert slices read as they merge: no pieces
  const mpi::MergeRunResult again = mpi::run_merge(comm, task, options);
  // And with pieces so small that some blocks are read alone, unheld, between held pieces.
  const std::string out3 = dir + "/out3-np" + std::to_string(comm.size());
  if (comm.is_root()) fs::create_directories(out3);
  comm.barrier("mkdir");
  options.output_dir = out3;
  options.io_threads = 0;
  options.input_io = io::InputIo::kDirect;
  options.expert_piece_bytes = 1000;
  const mpi::MergeRunResult small = mpi::run_merge(comm, task, options);
  // And from the page cache with the default readers: one, where every file is cached.
  const std::string out4 = dir + "/out4-np" + std::to_string(comm.size());
  if (comm.is_root()) fs::create_directories(out4);
  comm.barrier("mkdir");
  bool root_reads_from_memory = false;
  if (comm.is_root()) {
    io::ByteCounters probe_counters;
    root_reads_from_memory =
        io::CheckpointBlockReader(task.base, task.experts, probe_counters,
                                  io::CheckpointBlockReader::ExpertAccess::kExactRanges,
                                  io::InputIo::kBuffered)
            .reads_from_memory();
  }
  options.output_dir = out4;
  options.input_io = io::InputIo::kBuffered;
  const mpi::MergeRunResult cached = mpi::run_merge(comm, task, options);

  int ok = 1;
  std::string digest;
  if (comm.is_root()) {
    digest = output_digest(out);
    ok &= digest == output_digest(out2);
    ok &= digest == output_digest(out3);
    ok &= digest == output_digest(out4);
    ok &= result.tensor_hashes == again.tensor_hashes;
    ok &= result.tensor_hashes == small.tensor_hashes;
    ok &= result.tensor_hashes == cached.tensor_hashes;
    // Readers: the device's number for files read with O_DIRECT, the number asked for, and
    // one for files read from the page cache.
    // (A file system that refuses O_DIRECT reads them from the cache too.)
    ok &= result.input_files_direct == 0 || result.io_threads == mpi::kDeviceIoThreads;
    ok &= small.input_files_direct == 0 || small.io_threads == mpi::kDeviceIoThreads;
    ok &= again.io_threads == 3;
    ok &= cached.io_threads == (root_reads_from_memory ? 1 : mpi::kDeviceIoThreads);
    // Held: every chunk one piece (64 MiB is more than the family); plain: no pieces; small:
    // both kinds.
    ok &= result.held_pieces > 0 && result.held_pieces == result.expert_pieces;
    ok &= again.expert_pieces == 0;
    ok &= small.held_pieces > 0 && small.held_pieces < small.expert_pieces;
    ok &= small.bytes.expert == result.bytes.expert && again.bytes.expert == result.bytes.expert;
    ok &= result.tensor_hashes.size() == task.tensors.size();
    // Every output shard parses and holds the tensors with the right sizes.
    std::uint64_t tensors_found = 0;
    for (const auto& f : result.files) {
      const auto header = io::read_safetensors_header(out + "/" + f);
      tensors_found += header.tensors.size();
    }
    ok &= tensors_found == task.tensors.size();
    // Bytes: every admitted expert block read exactly once over all ranks.
    std::uint64_t expect_expert = 0;
    const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t b = 0; b < blocking.blocks.size(); ++b)
        if (task.plan.admitted(k, b)) expect_expert += blocking.blocks[b].byte_length;
    ok &= result.bytes.expert == expect_expert;
    std::uint64_t base_bytes = 0;
    for (const auto& t : task.tensors) base_bytes += t.nbytes();
    ok &= result.bytes.base == base_bytes;
    // The journals, whichever rank wrote each record, claim every block once with its hash.
    const io::JournalContents journals =
        io::read_journals(out, static_cast<std::uint32_t>(blocking.blocks.size()),
                          static_cast<std::uint32_t>(task.tensors.size()), 3);
    ok &= journals.blocks.size() == blocking.blocks.size() && journals.discarded == 0 &&
          journals.records >= blocking.blocks.size();
  }
  // The serial reference: the same blocks merged in this process, no MPI, no partition.
  if (comm.is_root()) {
    ok &= serial_reference_matches(task, out, result);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  comm.broadcast(digest, 0, "digest");
  EXPECT_EQ(1, ok) << "outputs differ between settings, from the serial reference, or from the "
                      "expected byte counts";
}

TEST(MPI, FailureOnOneRankEndsAllRanksWithItsMessage) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  MergeTask task = make_task(dir);
  truncate_last_expert(comm, dir);
  if (comm.is_root()) fs::create_directories(dir + "/out");
  comm.barrier("mkdir");
  mpi::MergeRunOptions options;
  options.output_dir = dir + "/out";
  const auto [code, message] = failure_of(comm, task, options);
  const int local_ok = code == 3 && message.find("expert2") != std::string::npos;
  int all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (comm.is_root()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  EXPECT_EQ(all_ok, 1) << "rank " << comm.rank() << " got code " << code << ": " << message;
}

// A run whose journal claims part of the blocks: the claims that the staged bytes bear out are
// kept, a claim whose bytes were damaged is merged again, and the output equals a fresh run.
TEST(MPI, ResumeKeepsCheckedBlocksAndRedoesTheRest) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  const MergeTask task = make_task(dir);
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  const std::string ref = dir + "/ref", out = dir + "/resumed";
  if (comm.is_root()) {
    fs::create_directories(ref);
    fs::create_directories(out);
  }
  comm.barrier("mkdir");
  mpi::MergeRunOptions options;
  options.output_dir = ref;
  const mpi::MergeRunResult fresh = mpi::run_merge(comm, task, options);

  // The "interrupted" attempt: every other block's record kept, the output of one of those
  // overwritten, everything else zeroed as if never written.
  std::uint64_t damaged = 0;
  if (comm.is_root()) {
    const io::JournalContents all =
        io::read_journals(ref, std::uint32_t(blocking.blocks.size()), 0, 0);
    io::JournalWriter keep(out, 7);
    for (const auto& [block, hash] : all.blocks)
      if (block % 2 == 0) keep.block_done(block, hash);
    for (const std::string& f : fresh.files) {
      const std::string bytes = io::read_text_file(ref + "/" + f);
      io::write_text_file(out + "/" + f, std::string(bytes.size(), '\0'));
    }
    // Copy the claimed blocks' bytes back, damaging block 4.
    const io::OutputLayout layout =
        io::make_output_layout(task.output_tensors(), task.max_shard_bytes);
    for (std::uint32_t b = 0; b < blocking.blocks.size(); b += 2) {
      const Block& blk = blocking.blocks[b];
      const std::string name = layout.shard_names[layout.tensor_shard[blk.tensor]];
      const std::uint64_t offset = layout.tensor_offset[blk.tensor] + blk.elem_begin * 2;
      std::vector<std::byte> bytes(blk.elem_count * 2);
      io::File(ref + "/" + name, io::File::Mode::kRead).read_at(offset, bytes);
      if (b == 4) {
        bytes[0] ^= std::byte{1};
        ++damaged;
      }
      io::File(out + "/" + name, io::File::Mode::kReadWrite).write_at(offset, bytes);
    }
  }
  comm.barrier("prepare the interrupted attempt");
  options.output_dir = out;
  options.resume = true;
  const mpi::MergeRunResult resumed = mpi::run_merge(comm, task, options);

  int ok = 1;
  if (comm.is_root()) {
    const std::uint64_t claimed = (blocking.blocks.size() + 1) / 2;
    ok &= resumed.blocks_resumed == claimed - damaged;
    ok &= resumed.blocks_rejected == damaged;
    ok &= resumed.tensor_hashes == fresh.tensor_hashes;
    for (const std::string& f : fresh.files)
      ok &= io::read_text_file(ref + "/" + f) == io::read_text_file(out + "/" + f);
    // Only the unclaimed and the damaged blocks were read again.
    std::uint64_t base_expected = 0;
    for (std::uint32_t b = 0; b < blocking.blocks.size(); ++b)
      if (b % 2 == 1 || b == 4) base_expected += blocking.blocks[b].byte_length;
    ok &= resumed.bytes.base == base_expected;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_ok, 1) << "resumed " << resumed.blocks_resumed << ", rejected "
                       << resumed.blocks_rejected;
}

// A linear full read whose experts are read around the page cache holds pieces of whole
// blocks (every expert admitted); streaming whole files through the cache, and pieces so small
// that only the norm's block is held, write the same bytes and read every expert byte once.
TEST(MPI, FullReadLinearHoldsExpertPieces) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  const MergeTask task = full_read_task(dir, MergeMethod::kLinear);
  std::uint64_t all_experts = 0;
  for (const auto& t : task.tensors) all_experts += 3 * t.nbytes();
  struct Case {
    const char* name;
    bool hold;
    std::uint64_t window;
  };
  std::vector<mpi::MergeRunResult> results;
  std::vector<std::string> digests;
  for (const Case c : {Case{"held", true, std::uint64_t{256} << 20}, Case{"streamed", false, 0},
                       Case{"mixed", true, 1000}}) {
    const std::string out = dir + "/full-" + c.name;
    if (comm.is_root()) fs::create_directories(out);
    comm.barrier("mkdir");
    mpi::MergeRunOptions options;
    options.output_dir = out;
    options.input_io = io::InputIo::kDirect;
    options.hold_windows = c.hold;
    if (c.window) options.window_bytes = c.window;
    results.push_back(mpi::run_merge(comm, task, options));
    if (comm.is_root()) digests.push_back(output_digest(out));
  }
  int ok = 1;
  if (comm.is_root()) {
    const auto& held = results[0];
    const auto& streamed = results[1];
    const auto& mixed = results[2];
    ok &= digests[0] == digests[1] && digests[0] == digests[2];
    ok &= held.tensor_hashes == streamed.tensor_hashes;
    ok &= held.expert_piece_bytes == std::uint64_t{256} << 20;
    ok &= held.held_pieces > 0 && held.held_pieces == held.expert_pieces;
    ok &= held.held_piece_bytes == all_experts;
    ok &= streamed.expert_piece_bytes == 0 && streamed.expert_pieces == 0;
    // 1000-byte pieces: 3 x 512-byte blocks exceed them, the norm's 3 x 64 bytes do not.
    ok &= mixed.held_pieces > 0 && mixed.held_pieces < mixed.expert_pieces;
    for (const auto& r : results) ok &= r.bytes.expert == all_experts;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_ok, 1) << "held " << results[0].held_pieces << "/" << results[0].expert_pieces
                       << " bytes " << results[0].held_piece_bytes << ", mixed "
                       << results[2].held_pieces << "/" << results[2].expert_pieces;
}

// --full-read TIES scans thresholds from the data window by window; the result equals a task
// that was given the same thresholds up front, at any rank count and window size, whether the
// parts of a share too large for a window merge at once with guessed thresholds (checked, and
// merged again where a guess trimmed a value differently) or are read twice.
TEST(MPI, FullReadTiesScansThresholdsFromTheData) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  MergeTask task = full_read_task(dir, MergeMethod::kTies);
  ASSERT_TRUE(task.plan.thresholds.empty());
  int ok = 1;
  std::vector<std::string> hashes;
  std::vector<float> thresholds;
  std::uint64_t all_experts = 0;
  for (const auto& t : task.tensors) all_experts += 3 * t.nbytes();
  // Windows of one tensor (larger than the buffer: held in parts), of a few tensors (some
  // shares held whole, the others in parts, which ones depends on the rank count), and of
  // everything (all held whole); or none held, read twice through the page cache.
  bool saw_parts = false, saw_guess_redone = false;
  struct Case {
    bool hold, speculate;
  };
  for (const Case c : {Case{true, true}, Case{true, false}, Case{false, true}}) {
    for (std::uint64_t window : {std::uint64_t{1}, std::uint64_t{20000}, std::uint64_t{30000},
                                 std::uint64_t{60000}, std::uint64_t{1} << 30}) {
      const std::string out =
          dir + "/scan" + std::to_string(window) + (c.hold ? "h" : "") + (c.speculate ? "s" : "");
      if (comm.is_root()) fs::create_directories(out);
      comm.barrier("mkdir");
      mpi::MergeRunOptions options;
      options.output_dir = out;
      options.window_bytes = window;
      options.hold_windows = c.hold;
      options.speculative_merge = c.speculate;
      const mpi::MergeRunResult r = mpi::run_merge(comm, task, options);
      if (comm.is_root()) {
        ok &= r.thresholds.size() == 3 * task.tensors.size();
        if (!hashes.empty()) ok &= r.tensor_hashes == hashes && r.thresholds == thresholds;
        hashes = r.tensor_hashes;
        thresholds = r.thresholds;
        const bool all_whole = c.hold && window > (1u << 20);
        if (all_whole) ok &= r.held_shares >= r.windows && r.bytes.expert == all_experts;
        // Held or not, every input byte is read at least once; held, every read is into memory.
        ok &= r.bytes.expert >= all_experts;
        if (c.hold) ok &= r.held_bytes == r.bytes.base + r.bytes.expert;
        // Each window's one-block parts: scan parts, then merge parts read again (all but the
        // last scanned block, merged where it is held).
        if (c.hold && !c.speculate && window == 1) ok &= r.held_shares >= 2 * r.windows;
        if (!c.hold) ok &= r.held_shares == 0 && r.bytes.expert > all_experts;
        // Speculating, only the blocks whose guess did not hold are read again: when every
        // guess held, each expert byte is read once.
        ok &= r.speculative_redone <= r.speculative_blocks;
        if (!c.hold || !c.speculate || all_whole) ok &= r.speculative_blocks == 0;
        if (c.hold && c.speculate && r.speculative_redone == 0) ok &= r.bytes.expert == all_experts;
        if (r.speculative_redone > 0) ok &= r.bytes.expert > all_experts;
        saw_guess_redone = saw_guess_redone || r.speculative_redone > 0;
        saw_parts = saw_parts || (c.hold && !c.speculate && r.bytes.expert > all_experts);
      }
    }
  }
  // Deltas of many sizes in parts of a block or a few: some guesses from part of a tensor fail.
  if (comm.is_root()) ok &= saw_guess_redone;
  if (comm.is_root()) ok &= saw_parts;
  // The same task with those thresholds given reads every expert once and writes the same bytes.
  if (comm.is_root()) task.plan.thresholds = thresholds;
  std::string packed(reinterpret_cast<const char*>(thresholds.data()), thresholds.size() * 4);
  comm.broadcast(packed, 0, "thresholds");
  task.plan.thresholds.assign(packed.size() / 4, 0.0f);
  std::memcpy(task.plan.thresholds.data(), packed.data(), packed.size());
  const std::string out = dir + "/given";
  if (comm.is_root()) fs::create_directories(out);
  comm.barrier("mkdir");
  mpi::MergeRunOptions options;
  options.output_dir = out;
  const mpi::MergeRunResult given = mpi::run_merge(comm, task, options);
  if (comm.is_root()) {
    ok &= given.tensor_hashes == hashes;
    ok &= given.thresholds.empty();
    ok &= given.bytes.expert == all_experts;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_ok, 1);
}

// Guesses that hold (density 1 keeps every value, whatever part the guess came from): the
// parts merged at once are done, none is read again, and the model is the one a full read
// that reads every part twice writes.
TEST(MPI, FullReadTiesGuessesThatHoldAreNotReadAgain) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  MergeTask task = full_read_task(dir, MergeMethod::kTies);
  for (ExpertSpec& e : task.spec.experts) e.density = 1.0;
  task.plan = make_full_read_plan(task.spec, task.tensors,
                                  make_blocking(task.tensors, task.block_bytes), "test");
  task.plan.hash = compute_plan_hash(task.plan);
  std::uint64_t all_experts = 0;
  for (const auto& t : task.tensors) all_experts += 3 * t.nbytes();
  std::vector<mpi::MergeRunResult> results;
  for (const bool speculate : {true, false}) {
    const std::string out = dir + "/dense" + (speculate ? "s" : "");
    if (comm.is_root()) fs::create_directories(out);
    comm.barrier("mkdir");
    mpi::MergeRunOptions options;
    options.output_dir = out;
    options.window_bytes = 1;  // parts of one block
    options.speculative_merge = speculate;
    results.push_back(mpi::run_merge(comm, task, options));
  }
  int ok = 1;
  if (comm.is_root()) {
    const mpi::MergeRunResult& guessed = results[0];
    const mpi::MergeRunResult& twice = results[1];
    ok &= guessed.tensor_hashes == twice.tensor_hashes && guessed.thresholds == twice.thresholds;
    // Every block but those of each window's last part, which merges after the combine.
    ok &= guessed.speculative_blocks > 0 && guessed.speculative_redone == 0;
    ok &= guessed.bytes.expert == all_experts && twice.bytes.expert > all_experts;
    ok &= guessed.held_shares < twice.held_shares;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_ok, 1) << "speculative " << results[0].speculative_blocks << " redone "
                       << results[0].speculative_redone << " expert bytes "
                       << results[0].bytes.expert << " / " << all_experts;
}

// A full-read TIES that fails after merging parts with guessed thresholds, before their
// window's combine checked the guesses: those blocks were never journaled, so the resumed run
// merges them again with the tensor's own thresholds and writes the model of a run that did not
// fail (had a guess been journaled, its bytes would pass the resume check and stay).
TEST(MPI, FullReadTiesResumeRedoesUncheckedGuesses) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  const MergeTask task = full_read_task(dir, MergeMethod::kTies);
  const std::string ref = dir + "/ref", out = dir + "/resumed";
  const std::string victim = dir + "/expert2/model.safetensors";
  if (comm.is_root()) {
    fs::create_directories(ref);
    fs::create_directories(out);
    fs::copy_file(victim, victim + ".whole");
  }
  comm.barrier("mkdir");
  mpi::MergeRunOptions options;
  options.window_bytes = 1;  // parts of one block: every part but the last guesses
  options.output_dir = ref;
  const mpi::MergeRunResult fresh = mpi::run_merge(comm, task, options);
  // The last tensor in the files (lm_head) fails in its last part, after its other parts merged
  // with guesses, most of them wrong on this data.
  truncate_last_expert(comm, dir);
  options.output_dir = out;
  const Failure failure = failure_of(comm, task, options);
  if (comm.is_root())
    fs::copy_file(victim + ".whole", victim, fs::copy_options::overwrite_existing);
  comm.barrier("restore the expert");
  options.resume = true;
  const mpi::MergeRunResult resumed = mpi::run_merge(comm, task, options);
  int ok = failure.code != 0;
  if (comm.is_root()) {
    ok &= fresh.speculative_redone > 0;
    ok &= resumed.blocks_resumed > 0 && resumed.blocks_rejected == 0;
    ok &= resumed.tensor_hashes == fresh.tensor_hashes;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_ok, 1) << "failure " << failure.code << ", resumed " << resumed.blocks_resumed
                       << ", rejected " << resumed.blocks_rejected;
}

// A full-read TIES whose read fails in one rank's held part: ranks have different numbers of
// parts per window, so the failing rank must still meet the others at the window's collectives
// and every rank ends with its message (a hang here times the test out).
TEST(MPI, FullReadTiesFailureInAHeldPartEndsAllRanks) {
  mpi::Comm comm = mpi::Comm::world();
  const std::string dir = make_family(comm);
  const MergeTask task = full_read_task(dir, MergeMethod::kTies);
  truncate_last_expert(comm, dir);
  int local_ok = 1;
  // Parts of one block each, and of a few blocks.
  for (std::uint64_t window : {std::uint64_t{1}, std::uint64_t{30000}}) {
    const std::string out = dir + "/out" + std::to_string(window);
    if (comm.is_root()) fs::create_directories(out);
    comm.barrier("mkdir");
    mpi::MergeRunOptions options;
    options.output_dir = out;
    options.window_bytes = window;
    const Failure failure = failure_of(comm, task, options);
    local_ok &= failure.code == 3 && failure.message.find("expert2") != std::string::npos;
  }
  int all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (comm.is_root()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  EXPECT_EQ(all_ok, 1);
}
