#include "mergepipe/mpi/threshold_prepass.hpp"

#include <cstring>

#include "mergepipe/block_stats.hpp"
#include "mergepipe/blocking.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/checkpoint_reader.hpp"
#include "mergepipe/magnitude_sketch.hpp"
#include "mergepipe/mpi/partition.hpp"

namespace mergepipe::mpi {

std::vector<float> compute_thresholds_from_data(const Comm& comm, const MergeTask& task) {
  const std::size_t tensors = task.tensors.size();
  const std::size_t experts = task.experts.size();
  const Blocking blocking = make_blocking(task.tensors, task.block_bytes);
  std::vector<std::uint64_t> costs(tensors);
  for (std::size_t t = 0; t < tensors; ++t) costs[t] = task.tensors[t].nbytes() + 1;
  const BlockRange mine =
      partition_by_cost(costs, comm.size())[static_cast<std::size_t>(comm.rank())];

  // Packed (tensor, expert, threshold) triples computed here.
  std::string packed;
  auto failure = capture_failure([&] {
    io::CheckpointBlockReader reader(task.base, task.experts, io::global_byte_counters(),
                                     io::CheckpointBlockReader::ExpertAccess::kWholeFiles);
    std::vector<std::byte> base_raw, expert_raw;
    std::vector<float> base, delta;
    for (std::uint32_t t = mine.begin; t < mine.end; ++t) {
      std::vector<MagnitudeSketch> sketches(experts);
      const DType dtype = task.tensors[t].dtype;
      for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i) {
        const Block& blk = blocking.blocks[blocking.first_block[t] + i];
        base_raw.resize(blk.byte_length);
        expert_raw.resize(blk.byte_length);
        base.resize(blk.elem_count);
        delta.resize(blk.elem_count);
        reader.read(SourceId{}, t, blk.byte_begin, base_raw);
        convert_to_f32(dtype, base_raw.data(), base.data(), blk.elem_count);
        for (std::size_t k = 0; k < experts; ++k) {
          reader.read(SourceId{static_cast<int>(k)}, t, blk.byte_begin, expert_raw);
          convert_to_f32(dtype, expert_raw.data(), delta.data(), blk.elem_count);
          compute_delta(base.data(), delta.data(), delta.data(), blk.elem_count);
          sketches[k].add(delta.data(), blk.elem_count);
        }
      }
      for (std::size_t k = 0; k < experts; ++k) {
        const float threshold = sketches[k].threshold(task.spec.experts[k].density);
        const std::uint32_t key[2] = {t, static_cast<std::uint32_t>(k)};
        packed.append(reinterpret_cast<const char*>(key), sizeof key);
        packed.append(reinterpret_cast<const char*>(&threshold), sizeof threshold);
      }
    }
  });
  comm.check(failure, "threshold pre-pass");

  std::vector<float> thresholds(experts * tensors, 0.0f);
  for (const std::string& part : comm.allgather(packed, "gather thresholds")) {
    for (std::size_t pos = 0; pos + 12 <= part.size(); pos += 12) {
      std::uint32_t key[2];
      float threshold;
      std::memcpy(key, part.data() + pos, sizeof key);
      std::memcpy(&threshold, part.data() + pos + 8, sizeof threshold);
      thresholds[static_cast<std::size_t>(key[1]) * tensors + key[0]] = threshold;
    }
  }
  return thresholds;
}

}  // namespace mergepipe::mpi
