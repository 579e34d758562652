#pragma once
// Everything every rank needs to run its part of a merge, built once on rank 0 (from a catalog
// and a plan, from full-read inputs, or from a manifest) and broadcast as bytes.
#include <cstdint>
#include <string>
#include <vector>

#include "mergepipe/catalog.hpp"
#include "mergepipe/executor.hpp"
#include "mergepipe/merge_spec.hpp"
#include "mergepipe/plan.hpp"

namespace mergepipe {

enum class OutputFormat { kSafetensors, kHdf5 };

struct MergeTask {
  MergeSpec spec;
  Plan plan;                        // mask and thresholds over `tensors` x blocks
  std::vector<TensorInfo> tensors;  // input tensors in base order
  std::uint64_t block_bytes = 0;    // blocking = make_blocking(tensors, block_bytes)
  CheckpointLocation base;
  std::vector<CheckpointLocation> experts;  // plan order
  std::vector<DType> out_dtypes;            // per tensor
  OutputFormat format = OutputFormat::kSafetensors;
  std::uint64_t max_shard_bytes = 0;
  bool full_read = false;  // naive baseline: every expert block read
  // Catalog content hashes (hash64 of the stored bytes) to check reads against: per plan expert
  // and block, and per block of the base. Empty when unknown (full reads, old catalogs).
  std::vector<std::vector<std::uint64_t>> expert_block_hashes;
  std::vector<std::uint64_t> base_block_hashes;

  std::vector<TensorInfo> output_tensors() const;  // tensors with out_dtypes applied
};

// Tensor `tensor`'s linear form (Gram methods) as a plan records them (plan.linear_forms
// non-empty).
OperatorConfig::LinearForm linear_form_of(const Plan& plan, std::size_t tensor);

// The executor's view of a task over its blocking (which must outlive the job, as must the task).
ExecutionJob make_execution_job(const MergeTask& task, const Blocking& blocking);

std::string serialize_task(const MergeTask& task);
// What makes two tasks produce the same output files: everything but timings, as 32 hex digits.
// A staging folder left by a killed run is resumed only by a task with the same identity.
std::string task_identity(const MergeTask& task);
MergeTask deserialize_task(const std::string& bytes);

// Output dtype for a config dtype name ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32").
DType parse_output_dtype(const std::string& name);

}  // namespace mergepipe
