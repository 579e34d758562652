#include "mergepipe/manifest.hpp"

#include "mergepipe/error.hpp"

namespace mergepipe {

namespace {

using ojson = nlohmann::ordered_json;

ojson location_json(const CheckpointLocation& loc) {
  ojson files = ojson::array();
  for (std::size_t i = 0; i < loc.files.size(); ++i) {
    const FileIdentity& f = loc.files[i];
    files.push_back({{"name", loc.shard_names[i]},
                     {"size", f.size},
                     {"mtime_ns", f.mtime_ns},
                     {"header_hash", f.header_hash}});
  }
  return {{"path", loc.dir},
          {"files", files},
          {"tensor_file", loc.tensor_file},
          {"tensor_offset", loc.tensor_offset}};
}

CheckpointLocation location_from_json(const nlohmann::json& j) {
  CheckpointLocation loc;
  loc.dir = j.at("path").get<std::string>();
  for (const auto& f : j.at("files")) {
    FileIdentity id;
    loc.shard_names.push_back(f.at("name").get<std::string>());
    id.path = loc.dir + "/" + loc.shard_names.back();
    id.size = f.at("size").get<std::uint64_t>();
    id.mtime_ns = f.at("mtime_ns").get<std::int64_t>();
    id.header_hash = f.at("header_hash").get<std::string>();
    loc.files.push_back(id);
  }
  loc.tensor_file = j.at("tensor_file").get<std::vector<std::uint32_t>>();
  loc.tensor_offset = j.at("tensor_offset").get<std::vector<std::uint64_t>>();
  return loc;
}

}  // namespace

ojson make_manifest(const ManifestRecord& r) {
  const MergeTask& task = *r.task;
  const MergeSpec& spec = task.spec;
  ojson models = ojson::array();
  for (const auto& e : spec.experts) {
    models.push_back({{"model", e.path}, {"weight", e.weight}, {"density", e.density}});
    if (uses_band_trim(spec.method)) models.back()["gamma"] = e.gamma;
  }
  ojson parameters = {{"normalize", spec.effective_normalize()},
                      {"lambda", spec.lambda},
                      {"models", models},
                      {"base_model", spec.base_model}};
  if (spec.out_dtype) parameters["dtype"] = torch_dtype_name(*spec.out_dtype);
  if (spec.rescale) parameters["rescale"] = *spec.rescale;
  if (spec.t) parameters["t"] = *spec.t;
  if (spec.base_weight) parameters["base_weight"] = *spec.base_weight;
  if (spec.base_is_reference) parameters["base_is_reference"] = true;
  if (spec.scale) parameters["scale"] = *spec.scale;
  for (const auto& [name, value] : spec.method_options) parameters["options"][name] = value;
  if (!spec.slices.empty()) {
    ojson slices = ojson::array();
    for (const SliceSource& s : spec.slices)
      slices.push_back({{"model", s.model}, {"layer_range", {s.first_layer, s.end_layer}}});
    parameters["slices"] = slices;
  }
  if (spec.tokenizer_source) parameters["tokenizer_source"] = *spec.tokenizer_source;
  if (spec.chat_template) parameters["chat_template"] = *spec.chat_template;
  if (!spec.model_names.empty()) {
    ojson names = ojson::object();
    for (const auto& [path, name] : spec.model_names) names[path] = name;
    parameters["model_names"] = names;
  }
  if (spec.varies_by_tensor()) parameters["varying"] = ojson::parse(spec.varying_json().dump());

  ojson tensors = ojson::array();
  ojson tensor_hashes = ojson::object();
  for (std::size_t t = 0; t < task.tensors.size(); ++t) {
    const TensorInfo& info = task.tensors[t];
    tensors.push_back({{"name", info.name},
                       {"dtype", std::string(dtype_name(info.dtype))},
                       {"out_dtype", std::string(dtype_name(task.out_dtypes[t]))},
                       {"shape", info.shape}});
    tensor_hashes[info.name] = t < r.tensor_hashes.size() ? r.tensor_hashes[t] : "";
  }
  ojson experts = ojson::array();
  for (const auto& e : task.experts) experts.push_back(location_json(e));

  ojson m;
  m["format"] = kManifestFormat;
  m["tool_version"] = MERGEPIPE_VERSION;
  m["plan_hash"] = task.plan.hash;
  m["method"] = std::string(merge_method_name(spec.method));
  m["parameters"] = parameters;
  m["seed"] = spec.seed;
  m["budget"] = spec.budget.value_or(task.full_read ? "full-read" : "100%");
  m["budget_bytes"] = task.plan.budget_bytes;
  m["planned_expert_bytes"] = task.plan.planned_expert_bytes;
  m["full_expert_bytes"] = task.plan.full_expert_bytes;
  m["bytes_read"] = {{"base", r.bytes_base},
                     {"expert", r.bytes_expert},
                     {"catalog", r.bytes_catalog},
                     {"output_written", r.bytes_output}};
  m["error_bound"] = task.plan.error_bound;
  m["access_mask"] =
      r.plan_json.contains("access_mask") ? r.plan_json["access_mask"] : nlohmann::json();
  m["full_read"] = task.full_read;
  m["inputs"] = {{"base", location_json(task.base)},
                 {"experts", experts},
                 {"catalog", r.catalog_path.empty() ? ojson() : ojson(r.catalog_path)}};
  m["outputs"] = {{"format", task.format == OutputFormat::kHdf5 ? "hdf5" : "safetensors"},
                  {"files", r.output_files},
                  {"max_shard_bytes", task.max_shard_bytes},
                  {"block_bytes", task.block_bytes},
                  {"hash_scheme", kOutputHashScheme},
                  {"tensor_hashes", tensor_hashes}};
  m["tensors"] = tensors;
  m["lineage"] = {{"parents", r.lineage_parents}};
  if (!r.replay_of.empty()) m["lineage"]["replay_of"] = r.replay_of;
  m["ranks"] = r.ranks;
  m["threads"] = r.threads;
  ojson timings = ojson::object();
  for (const auto& [k, v] : r.timings) timings[k] = v;
  m["timings"] = timings;
  m["peak_rss_bytes"] = r.max_rss_bytes;
  for (const auto& [key, value] : r.extra.items()) m[key] = value;
  m["plan"] = r.plan_json;
  return m;
}

ManifestReplayInfo parse_manifest(const std::string& text, const std::string& source) {
  ManifestReplayInfo info;
  try {
    const nlohmann::json m = nlohmann::json::parse(text);
    if (m.value("format", "") != kManifestFormat)
      throw InputError(source + ": not a MergePipe manifest (format key)");
    const auto method = parse_merge_method(m.at("method").get<std::string>());
    if (!method) throw InputError(source + ": unknown method " + m.at("method").dump());
    info.spec.method = *method;
    const auto& p = m.at("parameters");
    info.spec.normalize = p.at("normalize").get<bool>();
    info.spec.lambda = p.at("lambda").get<double>();
    info.spec.base_model = p.at("base_model").get<std::string>();
    if (p.contains("rescale")) info.spec.rescale = p.at("rescale").get<bool>();
    if (p.contains("t")) info.spec.t = p.at("t").get<double>();
    if (p.contains("base_weight")) info.spec.base_weight = p.at("base_weight").get<double>();
    info.spec.base_is_reference = p.value("base_is_reference", false);
    if (p.contains("scale")) info.spec.scale = p.at("scale").get<double>();
    if (p.contains("options"))
      for (const auto& [name, value] : p.at("options").items())
        info.spec.method_options[name] = value.get<double>();
    if (p.contains("slices")) {
      for (const auto& s : p.at("slices")) {
        const auto range = s.at("layer_range").get<std::vector<std::uint64_t>>();
        if (range.size() != 2) throw InputError(source + ": a slice's layer_range is not [a, b]");
        info.spec.slices.push_back({s.at("model").get<std::string>(), range[0], range[1]});
      }
    }
    if (p.contains("tokenizer_source"))
      info.spec.tokenizer_source = p.at("tokenizer_source").get<std::string>();
    if (p.contains("chat_template"))
      info.spec.chat_template = p.at("chat_template").get<std::string>();
    if (p.contains("model_names"))
      info.spec.model_names = p.at("model_names").get<std::map<std::string, std::string>>();
    if (p.contains("dtype"))
      info.spec.out_dtype = parse_output_dtype(p.at("dtype").get<std::string>());
    for (const auto& e : p.at("models")) {
      info.spec.experts.push_back({e.at("model").get<std::string>(), e.at("weight").get<double>(),
                                   e.at("density").get<double>()});
      if (e.contains("gamma")) info.spec.experts.back().gamma = e.at("gamma").get<double>();
    }
    if (p.contains("varying")) {
      try {
        info.spec.set_varying(p.at("varying"));
      } catch (const std::invalid_argument& e) {
        throw InputError(source + ": parameters.varying: " + e.what());
      }
    }
    info.spec.seed = m.at("seed").get<std::uint64_t>();
    info.spec.budget = m.at("budget").get<std::string>();
    info.plan_json = m.at("plan");
    info.plan_hash = m.at("plan_hash").get<std::string>();
    for (const auto& t : m.at("tensors")) {
      TensorInfo ti;
      ti.name = t.at("name").get<std::string>();
      const auto in = parse_dtype(t.at("dtype").get<std::string>());
      const auto out = parse_dtype(t.at("out_dtype").get<std::string>());
      if (!in || !out) throw InputError(source + ": tensor '" + ti.name + "' has an unknown dtype");
      ti.dtype = *in;
      ti.shape = t.at("shape").get<std::vector<std::uint64_t>>();
      info.tensors.push_back(ti);
      info.out_dtypes.push_back(*out);
    }
    const auto& outputs = m.at("outputs");
    info.block_bytes = outputs.at("block_bytes").get<std::uint64_t>();
    info.max_shard_bytes = outputs.at("max_shard_bytes").get<std::uint64_t>();
    info.format = outputs.at("format").get<std::string>() == "hdf5" ? OutputFormat::kHdf5
                                                                    : OutputFormat::kSafetensors;
    for (const auto& [name, hash] : outputs.at("tensor_hashes").items())
      info.tensor_hashes[name] = hash.get<std::string>();
    info.full_read = m.value("full_read", false);
    if (m.contains("output_folder")) {
      const auto& folder = m.at("output_folder");
      info.copy_tokenizer = folder.at("copy_tokenizer").get<bool>();
      info.write_model_card = folder.at("write_model_card").get<bool>();
      info.config_text = folder.at("config_text").get<std::string>();
      info.card_title = folder.value("card_title", "");
    }
    info.base = location_from_json(m.at("inputs").at("base"));
    for (const auto& e : m.at("inputs").at("experts"))
      info.experts.push_back(location_from_json(e));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": malformed manifest: " + e.what());
  }
  return info;
}

}  // namespace mergepipe
