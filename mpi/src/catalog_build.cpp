#include "mergepipe/mpi/catalog_build.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "mergepipe/block_stats.hpp"
#include "mergepipe/dtype.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/checkpoint_location.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/mpi/cpu_placement.hpp"
#include "mergepipe/mpi/packing.hpp"
#include "mergepipe/mpi/partition.hpp"
#include "mergepipe/mpi/run_monitor.hpp"
#include "mergepipe/structure_match.hpp"
#include "mergepipe/thread_name.hpp"
#include "mergepipe/worker_pool.hpp"

namespace mergepipe::mpi {

namespace {

// Pieces of fewer elements are computed on the calling thread.
constexpr std::uint64_t kParallelMinElems = 1u << 16;

// The file holding a tensor, for messages (the folder when the checkpoint lacks the tensor).
std::string tensor_file_name(const Checkpoint& ckpt, std::optional<std::size_t> index) {
  return index ? ckpt.tensors[*index].file : ckpt.dir;
}

void check_mergeable(const std::vector<TensorInfo>& tensors, const Checkpoint& base) {
  for (const TensorInfo& t : tensors) {
    if (!is_mergeable(t.dtype)) {
      throw InputError(tensor_file_name(base, base.find(t.name)) + ": tensor '" + t.name +
                       "' has dtype " + std::string(dtype_name(t.dtype)) +
                       ", which cannot be merged (F64, F32, F16 and BF16 can)");
    }
  }
}

Checkpoint open_expert(const std::string& dir, const std::vector<TensorInfo>& base_tensors) {
  Checkpoint ckpt = io::open_checkpoint(dir);
  if (auto mm = find_structure_mismatch(base_tensors, ckpt.tensor_infos())) {
    throw InputError(tensor_file_name(ckpt, mm->other_index) + ": tensor '" + mm->tensor + "' " +
                     mm->what +
                     " (an expert must have the base's tensor names, shapes and dtypes)");
  }
  return ckpt;
}

// A run of consecutive blocks of one tensor, read with one request per checkpoint.
struct Piece {
  std::uint32_t tensor = 0;
  std::uint32_t block_begin = 0, block_end = 0;
  std::uint64_t elem_begin = 0, elem_count = 0;
  std::uint64_t byte_begin = 0, byte_length = 0;
};

std::vector<Piece> make_pieces(const Blocking& blocking, BlockRange range,
                               std::uint64_t max_bytes) {
  std::vector<Piece> pieces;
  for (std::uint32_t b = range.begin; b < range.end; ++b) {
    const Block& blk = blocking.blocks[b];
    if (!pieces.empty()) {
      Piece& p = pieces.back();
      if (p.tensor == blk.tensor && p.byte_length + blk.byte_length <= max_bytes) {
        p.block_end = b + 1;
        p.elem_count += blk.elem_count;
        p.byte_length += blk.byte_length;
        continue;
      }
    }
    pieces.push_back(
        {blk.tensor, b, b + 1, blk.elem_begin, blk.elem_count, blk.byte_begin, blk.byte_length});
  }
  return pieces;
}

// Read side of one checkpoint: its shards opened once, reads counted under one category.
class Source {
 public:
  Source(const CheckpointLocation& loc, io::ByteCategory category)
      : loc_(&loc), category_(category) {
    for (const std::string& name : loc.shard_names)
      files_.emplace_back(loc.dir + "/" + name, io::File::Mode::kRead);
  }
  void read(const Piece& p, std::byte* dst) const {
    const io::File& f = files_.at(loc_->tensor_file[p.tensor]);
    f.read_at(loc_->tensor_offset[p.tensor] + p.byte_begin, std::span(dst, p.byte_length));
    io::global_byte_counters().add(category_, p.byte_length);
  }
  const CheckpointLocation& location() const { return *loc_; }

 private:
  const CheckpointLocation* loc_;
  io::ByteCategory category_;
  std::vector<io::File> files_;
};

// What one rank computed for the new experts over its block range.
struct PartialSketch {
  std::uint32_t tensor = 0;
  std::vector<std::uint16_t> keys;
  std::vector<std::uint64_t> counts;
};
struct RankResult {
  BlockRange range;
  std::vector<std::uint64_t> base_hashes;            // [block - range.begin]
  std::vector<std::vector<BlockStats>> stats;        // [expert][block - range.begin]
  std::vector<std::vector<PartialSketch>> sketches;  // [expert]: tensors touched, in order
  std::vector<std::uint64_t> nonfinite;              // [expert]
};

std::string pack(const RankResult& r) {
  Packer p;
  p.put(r.range.begin);
  p.put(r.range.end);
  p.put_vector(r.base_hashes);
  p.put<std::uint64_t>(r.stats.size());
  for (std::size_t k = 0; k < r.stats.size(); ++k) {
    for (const BlockStats& s : r.stats[k]) {
      p.put(s.l2);
      p.put(s.max_abs);
      p.put(s.nonzero);
      p.put(s.hash);
      p.put(s.octave_sumsq);
    }
    p.put<std::uint64_t>(r.sketches[k].size());
    for (const PartialSketch& ps : r.sketches[k]) {
      p.put(ps.tensor);
      p.put_vector(ps.keys);
      p.put_vector(ps.counts);
    }
    p.put(r.nonfinite[k]);
  }
  return std::move(p.out);
}

// Adds one rank's result into the new experts of `catalog` (rank 0).
void unpack_into(const std::string& bytes, Catalog& catalog, std::size_t first_new) {
  Unpacker u(bytes, "catalog build: rank result");
  BlockRange range;
  range.begin = u.get<std::uint32_t>();
  range.end = u.get<std::uint32_t>();
  const auto base_hashes = u.get_vector<std::uint64_t>();
  const auto experts = u.get<std::uint64_t>();
  if (first_new + experts != catalog.experts.size() || range.end > catalog.block_count() ||
      range.end < range.begin || (experts > 0 && base_hashes.size() != range.end - range.begin)) {
    throw std::runtime_error("catalog build: rank result does not match the catalog");
  }
  for (std::uint32_t b = range.begin; b < range.end && experts > 0; ++b)
    catalog.base_block_hashes[b] = base_hashes[b - range.begin];
  for (std::size_t k = 0; k < experts; ++k) {
    ExpertCatalog& e = catalog.experts[first_new + k];
    for (std::uint32_t b = range.begin; b < range.end; ++b) {
      BlockStats& s = e.blocks[b];
      s.l2 = u.get<double>();
      s.max_abs = u.get<float>();
      s.nonzero = u.get<std::uint64_t>();
      s.hash = u.get<std::uint64_t>();
      s.octave_sumsq = u.get<decltype(s.octave_sumsq)>();
    }
    const auto n = u.get<std::uint64_t>();
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto tensor = u.get<std::uint32_t>();
      const auto keys = u.get_vector<std::uint16_t>();
      const auto counts = u.get_vector<std::uint64_t>();
      // Integer counts: merging the parts in any order gives the same sketch.
      e.sketches.at(tensor).merge(MagnitudeSketch::from_sparse(keys, counts));
    }
    e.nonfinite += u.get<std::uint64_t>();
  }
}

// Computes this rank's share: reads base and expert pieces (the next read overlapping the
// current computation) and fills a RankResult.
class RangeWorker {
 public:
  RangeWorker(const Catalog& catalog, std::size_t first_new, BlockRange range,
              const CatalogBuildOptions& opt, int threads)
      : cat_(catalog), first_new_(first_new), range_(range), opt_(opt), pool_(threads) {}

  std::function<void(std::uint64_t)> on_read;  // after each read, with its bytes
  std::function<bool()> stop_requested;        // polled after each read

  RankResult run() {
    const std::size_t experts = cat_.experts.size() - first_new_;
    RankResult result;
    result.range = range_;
    result.stats.assign(experts, std::vector<BlockStats>(range_.end - range_.begin));
    result.sketches.resize(experts);
    result.nonfinite.assign(experts, 0);
    result.base_hashes.assign(range_.end - range_.begin, 0);
    const std::vector<Piece> pieces = make_pieces(cat_.blocking, range_, opt_.read_bytes);
    if (pieces.empty() || experts == 0) return result;

    Source base(cat_.base, io::ByteCategory::kBase);
    std::vector<Source> sources;
    sources.reserve(experts);
    for (std::size_t k = 0; k < experts; ++k)
      sources.emplace_back(cat_.experts[first_new_ + k].location, io::ByteCategory::kExpert);

    std::uint64_t max_bytes = 0, max_elems = 0;
    for (const Piece& p : pieces) {
      max_bytes = std::max(max_bytes, p.byte_length);
      max_elems = std::max(max_elems, p.elem_count);
    }
    std::vector<std::byte> buffers[2] = {std::vector<std::byte>(max_bytes),
                                         std::vector<std::byte>(max_bytes)};
    base_f32_.resize(max_elems);
    expert_f32_.resize(max_elems);
    worker_sketch_.resize(static_cast<std::size_t>(pool_.size()));
    worker_nonfinite_.assign(static_cast<std::size_t>(pool_.size()), 0);
    tensor_sketch_.assign(experts, MagnitudeSketch());
    tensor_nonfinite_.assign(experts, 0);

    // Task i: piece i / (experts + 1), source i % (experts + 1) (0 = base, k + 1 = expert k).
    const std::size_t per_piece = experts + 1;
    const std::size_t tasks = pieces.size() * per_piece;
    const auto read_task = [&](std::size_t i) {
      name_this_thread("mp-read");
      const Piece& p = pieces[i / per_piece];
      const std::size_t s = i % per_piece;
      (s == 0 ? base : sources[s - 1]).read(p, buffers[i % 2].data());
    };
    std::future<void> pending = std::async(std::launch::async, read_task, 0);
    for (std::size_t i = 0; i < tasks; ++i) {
      pending.get();
      if (on_read) on_read(pieces[i / per_piece].byte_length);
      if (stop_requested && stop_requested()) return result;  // another rank failed
      if (i + 1 < tasks) pending = std::async(std::launch::async, read_task, i + 1);
      const Piece& p = pieces[i / per_piece];
      const std::size_t s = i % per_piece;
      if (s == 0) {
        convert_base(p, buffers[i % 2].data(), result);
      } else {
        compute_expert(p, s - 1, buffers[i % 2].data(), result);
      }
      const bool tensor_ends =
          i / per_piece + 1 == pieces.size() || pieces[i / per_piece + 1].tensor != p.tensor;
      if (s != 0 && tensor_ends) finish_tensor(p.tensor, s - 1, result);
    }
    return result;
  }

 private:
  // Small pieces run on the calling thread: waking the pool would cost more than it saves.
  bool use_pool(const Piece& p) const {
    return pool_.size() > 1 && p.block_end - p.block_begin > 1 && p.elem_count >= kParallelMinElems;
  }

  // Runs fn(block, worker) for every block of the piece, over the pool when use_pool(p).
  template <typename F>
  void for_blocks(const Piece& p, F&& fn) {
    if (!use_pool(p)) {
      for (std::uint32_t b = p.block_begin; b < p.block_end; ++b) fn(b, 0);
      return;
    }
    pool_.run([&](int w) {
      for (std::uint32_t b = p.block_begin + static_cast<std::uint32_t>(w); b < p.block_end;
           b += static_cast<std::uint32_t>(pool_.size()))
        fn(b, w);
    });
  }

  void convert_base(const Piece& p, const std::byte* bytes, RankResult& result) {
    const DType dtype = cat_.tensors[p.tensor].dtype;
    for_blocks(p, [&](std::uint32_t b, int) {
      const Block& blk = cat_.blocking.blocks[b];
      const std::byte* stored = bytes + (blk.byte_begin - p.byte_begin);
      result.base_hashes[b - range_.begin] = hash64(stored, blk.byte_length);
      convert_to_f32(dtype, stored, base_f32_.data() + (blk.elem_begin - p.elem_begin),
                     blk.elem_count);
    });
  }

  void compute_expert(const Piece& p, std::size_t k, const std::byte* bytes, RankResult& result) {
    const DType dtype = cat_.tensors[p.tensor].dtype;
    std::vector<BlockStats>& stats = result.stats[k];
    const bool inline_run = !use_pool(p);
    for_blocks(p, [&](std::uint32_t b, int w) {
      const Block& blk = cat_.blocking.blocks[b];
      const std::byte* stored = bytes + (blk.byte_begin - p.byte_begin);
      const std::size_t off = blk.elem_begin - p.elem_begin;
      float* delta = expert_f32_.data() + off;
      convert_to_f32(dtype, stored, delta, blk.elem_count);
      const std::uint64_t bad = count_nonfinite(std::span<const float>(delta, blk.elem_count));
      compute_delta(base_f32_.data() + off, delta, delta, blk.elem_count);
      stats[b - range_.begin] = compute_block_stats(std::span<const float>(delta, blk.elem_count),
                                                    std::span(stored, blk.byte_length));
      if (inline_run) {
        tensor_sketch_[k].add(delta, blk.elem_count);
        tensor_nonfinite_[k] += bad;
      } else {
        worker_sketch_[static_cast<std::size_t>(w)].add(delta, blk.elem_count);
        worker_nonfinite_[static_cast<std::size_t>(w)] += bad;
      }
    });
    if (!inline_run) {
      for (std::size_t w = 0; w < worker_sketch_.size(); ++w) {
        tensor_sketch_[k].merge(worker_sketch_[w]);
        worker_sketch_[w] = MagnitudeSketch();
        tensor_nonfinite_[k] += worker_nonfinite_[w];
        worker_nonfinite_[w] = 0;
      }
    }
  }

  void finish_tensor(std::uint32_t tensor, std::size_t k, RankResult& result) {
    const ExpertCatalog& e = cat_.experts[first_new_ + k];
    if (tensor_nonfinite_[k] > 0 && !opt_.allow_nonfinite) {
      const CheckpointLocation& loc = e.location;
      throw InputError(loc.files[loc.tensor_file[tensor]].path + ": tensor '" +
                       cat_.tensors[tensor].name + "' of expert " + loc.dir +
                       " holds NaN or Inf values (--allow-nonfinite catalogs it anyway)");
    }
    result.nonfinite[k] += tensor_nonfinite_[k];
    tensor_nonfinite_[k] = 0;
    tensor_sketch_[k].compact();
    result.sketches[k].push_back({tensor, tensor_sketch_[k].keys(), tensor_sketch_[k].counts()});
    tensor_sketch_[k] = MagnitudeSketch();
  }

  const Catalog& cat_;
  std::size_t first_new_;
  BlockRange range_;
  const CatalogBuildOptions& opt_;
  WorkerPool pool_;
  std::vector<float> base_f32_, expert_f32_;
  std::vector<MagnitudeSketch> worker_sketch_;
  std::vector<std::uint64_t> worker_nonfinite_;
  std::vector<MagnitudeSketch> tensor_sketch_;   // [expert]: the current tensor's partial sketch
  std::vector<std::uint64_t> tensor_nonfinite_;  // [expert]
};

// Opens base and experts and lays out the catalog: structure, locations, empty statistics.
Catalog prepare(const CatalogBuildOptions& opt, std::size_t& first_new) {
  if (opt.expert_dirs.empty()) throw UsageError("catalog: no expert folders given");
  const std::string base_dir = normalize_checkpoint_dir(opt.base_dir);
  const Checkpoint base = io::open_checkpoint(base_dir);
  const std::vector<TensorInfo> tensors = base.tensor_infos();
  check_mergeable(tensors, base);

  Catalog cat;
  const std::string family_id = compute_family_id(tensors, base.files);
  if (opt.existing) {
    if (opt.existing->family_id != family_id || opt.existing->tensors != tensors) {
      throw InputError(base_dir + ": not the base this catalog was built from (" +
                       opt.existing->base.dir + "): family id differs; rebuild with --force");
    }
    cat = *opt.existing;
  } else {
    cat.family_id = family_id;
    cat.tensors = tensors;
    cat.blocking = make_blocking(tensors, opt.block_bytes);
  }
  cat.base = io::locate_tensors(base, tensors);
  first_new = cat.experts.size();

  std::set<std::string> seen;
  for (const ExpertCatalog& e : cat.experts) seen.insert(normalize_checkpoint_dir(e.location.dir));
  for (const std::string& given : opt.expert_dirs) {
    const std::string dir = normalize_checkpoint_dir(given);
    if (!seen.insert(dir).second) {
      throw UsageError("catalog: expert " + dir + " is listed twice or already catalogued");
    }
    const Checkpoint ckpt = open_expert(dir, tensors);
    ExpertCatalog e;
    e.location = io::locate_tensors(ckpt, tensors);
    cat.experts.push_back(std::move(e));
  }
  return cat;
}

}  // namespace

Catalog build_catalog(const Comm& comm, const CatalogBuildOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Catalog cat;
  std::size_t first_new = 0;
  comm.check(capture_failure([&] { cat = prepare(options, first_new); }),
             "catalog: opening checkpoints");

  std::vector<std::uint64_t> costs;
  costs.reserve(cat.block_count());
  for (const Block& b : cat.blocking.blocks) costs.push_back(b.byte_length);
  const BlockRange mine =
      partition_by_cost(costs, comm.size())[static_cast<std::size_t>(comm.rank())];
  const int threads = options.threads > 0 ? options.threads : default_threads(cpu_placement(comm));

  std::uint64_t total = 0;
  for (const Block& b : cat.blocking.blocks)
    total += b.byte_length * (cat.experts.size() - first_new + 1);
  RunMonitor monitor(comm, "catalog", total, options.progress);
  std::string packed;
  auto failure = capture_failure([&] {
    RangeWorker worker(cat, first_new, mine, options, threads);
    worker.on_read = [&](std::uint64_t bytes) { monitor.add(bytes); };
    worker.stop_requested = [&] { return monitor.stop_requested(); };
    packed = pack(worker.run());
  });
  monitor.finish(failure.has_value());
  comm.check(failure, "catalog: reading experts");

  const std::vector<std::string> parts = comm.gather(packed, 0, "catalog: gathering statistics");
  comm.check(capture_failure([&] {
               if (!comm.is_root()) return;
               cat.base_block_hashes.assign(cat.block_count(), 0);
               for (std::size_t k = first_new; k < cat.experts.size(); ++k) {
                 cat.experts[k].blocks.assign(cat.block_count(), BlockStats{});
                 cat.experts[k].sketches.assign(cat.tensors.size(), MagnitudeSketch());
               }
               for (const std::string& part : parts) unpack_into(part, cat, first_new);
             }),
             "catalog: assembling statistics");
  cat.build_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return cat;
}

}  // namespace mergepipe::mpi
