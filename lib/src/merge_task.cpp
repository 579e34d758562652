#include "mergepipe/merge_task.hpp"

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <sstream>

#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"

namespace mergepipe {

template <class Archive>
void serialize(Archive& ar, TensorInfo& t) {
  ar(t.name, t.dtype, t.shape);
}
template <class Archive>
void serialize(Archive& ar, FileIdentity& f) {
  ar(f.path, f.size, f.mtime_ns, f.ctime_ns, f.header_hash);
}
template <class Archive>
void serialize(Archive& ar, CheckpointLocation& c) {
  ar(c.dir, c.shard_names, c.files, c.tensor_file, c.tensor_offset);
}
template <class Archive>
void serialize(Archive& ar, ParameterSetting::Rule& r) {
  ar(r.filter, r.values);
}
template <class Archive>
void serialize(Archive& ar, ParameterSetting& s) {
  ar(s.rules, s.conditional);
}
template <class Archive>
void serialize(Archive& ar, SliceSource& s) {
  ar(s.model, s.first_layer, s.end_layer);
}
template <class Archive>
void serialize(Archive& ar, ExpertSpec& e) {
  ar(e.path, e.weight, e.density, e.gamma, e.varying);
}
template <class Archive>
void serialize(Archive& ar, MergeSpec& s) {
  ar(s.method, s.base_model, s.experts, s.normalize, s.lambda, s.out_dtype, s.seed, s.budget,
     s.rescale, s.t, s.base_weight, s.base_is_reference, s.varying, s.base_varying,
     s.tokenizer_source, s.chat_template, s.model_names, s.scale, s.slices, s.method_options);
}

std::vector<TensorInfo> MergeTask::output_tensors() const {
  std::vector<TensorInfo> out = tensors;
  for (std::size_t t = 0; t < out.size(); ++t) out[t].dtype = out_dtypes[t];
  return out;
}

OperatorConfig::LinearForm linear_form_of(const Plan& plan, std::size_t tensor) {
  const std::size_t width = plan.expert_count() + 1;
  const float* row = plan.linear_forms.data() + tensor * width;
  OperatorConfig::LinearForm form;
  form.base_scale = row[0];
  form.alpha.assign(row + 1, row + width);
  return form;
}

ExecutionJob make_execution_job(const MergeTask& task, const Blocking& blocking) {
  ExecutionJob job;
  job.blocking = &blocking;
  job.tensors = &task.tensors;
  job.out_dtypes = task.out_dtypes;
  job.op = OperatorConfig::from_spec(task.spec);
  if (task.spec.varies_by_tensor()) {
    std::vector<std::string> names;
    for (const auto& t : task.tensors) names.push_back(t.name);
    for (const MergeSpec& s : specs_by_tensor(task.spec, names))
      job.tensor_ops.push_back(OperatorConfig::from_spec(s));
  }
  for (const auto& t : task.tensors) job.name_keys.push_back(tensor_name_key(t.name));
  if (uses_magnitude_trim(task.spec.method)) job.thresholds = task.plan.thresholds;
  if (uses_tensor_statistics(task.spec.method)) {
    // Each tensor gets its own coefficients: from the plan, or from the data as the run sees it.
    if (job.tensor_ops.empty()) job.tensor_ops.assign(task.tensors.size(), job.op);
    if (!task.plan.linear_forms.empty())
      for (std::size_t t = 0; t < task.tensors.size(); ++t)
        job.tensor_ops[t].linear_form = linear_form_of(task.plan, t);
  }
  job.experts = task.experts.size();
  job.admitted = [&task](std::size_t k, std::size_t b) { return task.plan.admitted(k, b); };
  return job;
}

std::string serialize_task(const MergeTask& task) {
  std::ostringstream os;
  {
    cereal::PortableBinaryOutputArchive ar(os);
    MergeTask& t = const_cast<MergeTask&>(task);  // cereal's save path takes non-const refs here
    std::string plan = serialize_plan(t.plan);
    ar(t.spec, plan, t.tensors, t.block_bytes, t.base, t.experts, t.out_dtypes, t.format,
       t.max_shard_bytes, t.full_read, t.expert_block_hashes, t.base_block_hashes);
  }
  return os.str();
}

std::string task_identity(const MergeTask& task) {
  std::ostringstream os;
  {
    cereal::PortableBinaryOutputArchive ar(os);
    MergeTask& t = const_cast<MergeTask&>(task);
    std::string plan_hash = t.plan.hash;  // the canonical plan, without its timing
    ar(t.spec, plan_hash, t.tensors, t.block_bytes, t.base, t.experts, t.out_dtypes, t.format,
       t.max_shard_bytes, t.full_read);
  }
  const std::string bytes = os.str();
  return hash128_hex(bytes.data(), bytes.size());
}

MergeTask deserialize_task(const std::string& bytes) {
  MergeTask t;
  std::istringstream is(bytes);
  try {
    cereal::PortableBinaryInputArchive ar(is);
    std::string plan;
    ar(t.spec, plan, t.tensors, t.block_bytes, t.base, t.experts, t.out_dtypes, t.format,
       t.max_shard_bytes, t.full_read, t.expert_block_hashes, t.base_block_hashes);
    t.plan = deserialize_plan(plan);
  } catch (const cereal::Exception& e) {
    throw InputError(std::string("corrupt merge task: ") + e.what());
  }
  return t;
}

DType parse_output_dtype(const std::string& name) {
  if (name == "bfloat16" || name == "bf16" || name == "BF16") return DType::kBF16;
  if (name == "float16" || name == "fp16" || name == "half" || name == "F16") return DType::kF16;
  if (name == "float32" || name == "fp32" || name == "float" || name == "F32") return DType::kF32;
  throw UsageError("unsupported output dtype '" + name + "' (use bfloat16, float16 or float32)");
}

}  // namespace mergepipe
