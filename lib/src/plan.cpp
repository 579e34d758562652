#include "mergepipe/plan.hpp"

#include <bit>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cmath>
#include <limits>
#include <sstream>

#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"

namespace mergepipe {

std::size_t Plan::threshold_rows() const {
  const auto m = parse_merge_method(method);
  return m && uses_band_trim(*m) ? 2 : 1;
}

std::size_t ExpertMask::count() const {
  std::size_t n = 0;
  for (std::uint64_t w : words) n += static_cast<std::size_t>(std::popcount(w));
  return n;
}

ExpertMask ExpertMask::empty(std::uint64_t blocks) {
  ExpertMask m;
  m.words.assign((blocks + 63) / 64, 0);
  return m;
}

// ---------------------------------------------------------------------------------------------
// Binary form. One field list for writing and reading, in a fixed order; every integer has a
// fixed width and the archive a fixed (little-endian) byte order, so the bytes do not depend on
// the process, platform or compiler.
namespace {

template <class Archive, class Vec, class Fn>
void sized_vector(Archive& ar, Vec& v, bool loading, Fn&& element) {
  std::uint64_t n = v.size();
  ar(n);
  if (loading) v.resize(n);
  for (auto& e : v) element(e);
}

template <class Archive, class P>
void plan_fields(Archive& ar, P& p, bool loading) {
  std::string format = kPlanFormat;
  ar(format);
  if (loading && format != kPlanFormat) {
    throw InputError("plan: format '" + format + "' is not " + kPlanFormat);
  }
  ar(p.family_id, p.method, p.base_dir, p.expert_dirs, p.catalog_expert, p.weights, p.densities,
     p.alpha, p.lambda, p.normalize, p.seed);
  ar(p.tensor_count, p.block_count, p.budget_bytes);
  bool has_max_error = p.max_error.has_value();
  double max_error = p.max_error.value_or(0.0);
  ar(has_max_error, max_error);
  if (loading) p.max_error = has_max_error ? std::optional<double>(max_error) : std::nullopt;
  ar(p.planned_expert_bytes, p.full_expert_bytes, p.error_bound, p.bound_is_guarantee,
     p.deviation_estimate, p.pairs_admitted, p.pairs_total, p.pairs_zero);
  sized_vector(ar, p.mask, loading, [&](auto& m) { ar(m.words); });
  ar(p.thresholds);
  auto coverage = [&](auto& c) {
    ar(c.admitted_pairs, c.nonzero_pairs, c.total_pairs, c.admitted_bytes, c.nonzero_bytes,
       c.total_bytes);
  };
  sized_vector(ar, p.expert_coverage, loading, coverage);
  ar(p.tensor_names);
  sized_vector(ar, p.tensor_coverage, loading, coverage);
}

std::string write_binary(const Plan& plan, bool with_hash_and_timing) {
  std::ostringstream os(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive ar(
        os, cereal::PortableBinaryOutputArchive::Options::LittleEndian());
    Plan& p = const_cast<Plan&>(plan);  // the writer only reads the fields
    plan_fields(ar, p, false);
    // Method parameters added after the format was fixed: hashed only when one differs from
    // its default, so the plans (and manifests) written before them keep their hashes; always
    // sent to the ranks, after the hash.
    bool has_t = p.t.has_value(), has_base_weight = p.base_weight.has_value();
    double t = p.t.value_or(0.0), base_weight = p.base_weight.value_or(0.0);
    const auto later_fields = [&] {
      ar(p.rescale, has_t, t, has_base_weight, base_weight, p.base_is_reference);
    };
    const bool varies = !p.varying_parameters.empty();
    bool has_scale = p.scale.has_value();
    double scale = p.scale.value_or(1.0);
    if (with_hash_and_timing) {
      ar(p.hash, p.planning_seconds);
      later_fields();
      ar(p.varying_parameters, has_scale, scale, p.linear_forms, p.method_options, p.gammas);
    } else if (!p.rescale || has_t || has_base_weight || p.base_is_reference || varies ||
               has_scale || !p.linear_forms.empty() || !p.method_options.empty() ||
               !p.gammas.empty()) {
      later_fields();
      if (varies || has_scale) ar(p.varying_parameters);
      if (has_scale) ar(scale);
      if (!p.linear_forms.empty()) ar(p.linear_forms);
      if (!p.method_options.empty()) ar(p.method_options);
      if (!p.gammas.empty()) ar(p.gammas);
    }
  }
  return std::move(os).str();
}

// Checks the sizes that make the plan usable (mask and thresholds indexed by expert and block).
void check_shape(const Plan& p, const std::string& source) {
  const std::size_t k = p.expert_dirs.size();
  auto bad = [&](const std::string& what) {
    throw InputError(source + ": inconsistent plan: " + what);
  };
  if (p.catalog_expert.size() != k || p.weights.size() != k || p.densities.size() != k ||
      p.alpha.size() != k || p.mask.size() != k || p.expert_coverage.size() != k) {
    bad("per-expert lists differ in length");
  }
  for (const ExpertMask& m : p.mask) {
    if (m.words.size() != (p.block_count + 63) / 64)
      bad("a mask does not cover block_count blocks");
    if (p.block_count % 64 != 0 && !m.words.empty() &&
        (m.words.back() >> (p.block_count % 64)) != 0) {
      bad("a mask admits a block beyond block_count");
    }
  }
  if (!p.thresholds.empty() && p.thresholds.size() != p.threshold_rows() * k * p.tensor_count) {
    bad(p.threshold_rows() == 1 ? "thresholds are not experts × tensors"
                                : "thresholds are not 2 × experts × tensors");
  }
  const auto method = parse_merge_method(p.method);
  if (!p.gammas.empty() ? p.gammas.size() != k : method && uses_band_trim(*method))
    bad("gammas are not one per expert");
  if (!p.linear_forms.empty() && p.linear_forms.size() != (k + 1) * p.tensor_count) {
    bad("linear_forms are not tensors × (experts + 1)");
  }
  if (p.tensor_names.size() != p.tensor_count || p.tensor_coverage.size() != p.tensor_count) {
    bad("per-tensor lists differ from tensor_count");
  }
}

}  // namespace

std::string canonical_plan_bytes(const Plan& plan) {
  return write_binary(plan, false);
}

std::string compute_plan_hash(const Plan& plan) {
  const std::string bytes = canonical_plan_bytes(plan);
  return hash128_hex(bytes.data(), bytes.size());
}

std::string serialize_plan(const Plan& plan) {
  return write_binary(plan, true);
}

Plan deserialize_plan(const std::string& bytes) {
  Plan p;
  try {
    std::istringstream is(bytes, std::ios::binary);
    cereal::PortableBinaryInputArchive ar(
        is, cereal::PortableBinaryInputArchive::Options::LittleEndian());
    plan_fields(ar, p, true);
    bool has_t = false, has_base_weight = false;
    double t = 0, base_weight = 0;
    ar(p.hash, p.planning_seconds);
    ar(p.rescale, has_t, t, has_base_weight, base_weight, p.base_is_reference);
    bool has_scale = false;
    double scale = 1.0;
    ar(p.varying_parameters, has_scale, scale, p.linear_forms, p.method_options, p.gammas);
    if (has_scale) p.scale = scale;
    if (has_t) p.t = t;
    if (has_base_weight) p.base_weight = base_weight;
    if (is.tellg() != static_cast<std::streamoff>(bytes.size())) {
      throw InputError("plan: trailing bytes after the serialised plan");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw InputError(std::string("plan: malformed serialised plan (") + e.what() + ")");
  }
  check_shape(p, "plan");
  if (compute_plan_hash(p) != p.hash) throw InputError("plan: hash does not match its content");
  return p;
}

// ---------------------------------------------------------------------------------------------
// Mask encodings.

std::string mask_to_hex(const ExpertMask& mask, std::uint64_t blocks) {
  static const char* kDigits = "0123456789abcdef";
  const std::uint64_t nbytes = (blocks + 7) / 8;
  std::string out;
  out.reserve(2 * nbytes);
  for (std::uint64_t i = 0; i < nbytes; ++i) {
    const auto byte = static_cast<unsigned>((mask.words[i / 8] >> (8 * (i % 8))) & 0xffu);
    out += kDigits[byte >> 4];
    out += kDigits[byte & 15];
  }
  return out;
}

ExpertMask mask_from_hex(const std::string& hex, std::uint64_t blocks) {
  const std::uint64_t nbytes = (blocks + 7) / 8;
  if (hex.size() != 2 * nbytes) {
    throw InputError("access mask: " + std::to_string(hex.size()) + " hex digits for " +
                     std::to_string(blocks) + " blocks (expected " + std::to_string(2 * nbytes) +
                     ")");
  }
  auto digit = [&](char c) -> std::uint64_t {
    if (c >= '0' && c <= '9') return static_cast<std::uint64_t>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<std::uint64_t>(c - 'a' + 10);
    throw InputError(std::string("access mask: '") + c + "' is not a lowercase hex digit");
  };
  ExpertMask m = ExpertMask::empty(blocks);
  for (std::uint64_t i = 0; i < nbytes; ++i) {
    const std::uint64_t byte = digit(hex[2 * i]) << 4 | digit(hex[2 * i + 1]);
    m.words[i / 8] |= byte << (8 * (i % 8));
  }
  if (blocks % 64 != 0 && !m.words.empty() && (m.words.back() >> (blocks % 64)) != 0) {
    throw InputError("access mask: bits set beyond block " + std::to_string(blocks));
  }
  return m;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> mask_runs(const ExpertMask& mask,
                                                               std::uint64_t blocks) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    if (!mask.test(b)) continue;
    if (!runs.empty() && runs.back().first + runs.back().second == b) {
      ++runs.back().second;
    } else {
      runs.emplace_back(b, 1);
    }
  }
  return runs;
}

// ---------------------------------------------------------------------------------------------
// JSON form.
namespace {

using nlohmann::json;

json coverage_json(const Coverage& c) {
  return {{"admitted_pairs", c.admitted_pairs},
          {"nonzero_pairs", c.nonzero_pairs},
          {"total_pairs", c.total_pairs},
          {"admitted_bytes", c.admitted_bytes},
          {"nonzero_bytes", c.nonzero_bytes},
          {"total_bytes", c.total_bytes},
          {"coverage", c.fraction()}};
}

// JSON has no infinity: a threshold that keeps nothing is written as the string "inf".
json threshold_json(float t) {
  return std::isinf(t) ? json("inf") : json(static_cast<double>(t));
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError(source_ + ": plan key '" + key + "': " + why);
  }
  const json& at(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj.is_object()) fail(path, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(path + key, "missing");
    return *it;
  }
  std::uint64_t u64(const json& obj, const std::string& key, const std::string& path = "") const {
    const json& v = at(obj, key, path);
    if (!v.is_number_unsigned()) fail(path + key, "expected a non-negative integer");
    return v.get<std::uint64_t>();
  }
  double real(const json& obj, const std::string& key, const std::string& path = "") const {
    const json& v = at(obj, key, path);
    if (!v.is_number()) fail(path + key, "expected a number");
    return v.get<double>();
  }
  bool boolean(const json& obj, const std::string& key, const std::string& path = "") const {
    const json& v = at(obj, key, path);
    if (!v.is_boolean()) fail(path + key, "expected true or false");
    return v.get<bool>();
  }
  std::string str(const json& obj, const std::string& key, const std::string& path = "") const {
    const json& v = at(obj, key, path);
    if (!v.is_string()) fail(path + key, "expected a string");
    return v.get<std::string>();
  }
  const json& array(const json& obj, const std::string& key, std::size_t size,
                    const std::string& path = "") const {
    const json& v = at(obj, key, path);
    if (!v.is_array()) fail(path + key, "expected an array");
    if (v.size() != size) {
      fail(path + key,
           "expected " + std::to_string(size) + " entries, found " + std::to_string(v.size()));
    }
    return v;
  }
  Coverage coverage(const json& obj, const std::string& path) const {
    Coverage c;
    c.admitted_pairs = u64(obj, "admitted_pairs", path);
    c.nonzero_pairs = u64(obj, "nonzero_pairs", path);
    c.total_pairs = u64(obj, "total_pairs", path);
    c.admitted_bytes = u64(obj, "admitted_bytes", path);
    c.nonzero_bytes = u64(obj, "nonzero_bytes", path);
    c.total_bytes = u64(obj, "total_bytes", path);
    return c;
  }
  float threshold(const json& v, const std::string& path) const {
    if (v.is_string() && v.get<std::string>() == "inf")
      return std::numeric_limits<float>::infinity();
    if (!v.is_number()) fail(path, "expected a number or \"inf\"");
    const double d = v.get<double>();
    const auto f = static_cast<float>(d);
    if (static_cast<double>(f) != d) fail(path, "not a single-precision value");
    return f;
  }

 private:
  std::string source_;
};

}  // namespace

json plan_to_json(const Plan& p) {
  json j;
  j["format"] = kPlanFormat;
  j["plan_hash"] = p.hash;
  j["family_id"] = p.family_id;
  j["method"] = p.method;
  j["base_model"] = p.base_dir;
  j["parameters"] = {{"lambda", p.lambda}, {"normalize", p.normalize}, {"seed", p.seed}};
  if (!p.rescale) j["parameters"]["rescale"] = false;
  if (p.t) j["parameters"]["t"] = *p.t;
  if (p.scale) j["parameters"]["scale"] = *p.scale;
  for (const auto& [name, value] : p.method_options) j["parameters"]["options"][name] = value;
  if (p.base_weight) j["parameters"]["base_weight"] = *p.base_weight;
  if (p.base_is_reference) j["base_is_reference"] = true;
  if (!p.varying_parameters.empty()) j["parameters"]["varying"] = json::parse(p.varying_parameters);
  j["budget_bytes"] = p.budget_bytes;
  j["max_error"] = p.max_error ? json(*p.max_error) : json(nullptr);
  j["planned_expert_bytes"] = p.planned_expert_bytes;
  j["full_expert_bytes"] = p.full_expert_bytes;
  j["planned_fraction"] = p.full_expert_bytes ? static_cast<double>(p.planned_expert_bytes) /
                                                    static_cast<double>(p.full_expert_bytes)
                                              : 0.0;
  j["error_bound"] = p.error_bound;
  j["bound_is_guarantee"] = p.bound_is_guarantee;
  j["deviation_estimate"] = p.deviation_estimate;
  j["pairs_admitted"] = p.pairs_admitted;
  j["pairs_total"] = p.pairs_total;
  j["pairs_zero"] = p.pairs_zero;
  j["tensor_count"] = p.tensor_count;
  j["block_count"] = p.block_count;
  j["planning_seconds"] = p.planning_seconds;

  check_shape(p, "plan");
  // "none": not computed yet; "zero": the method does not trim; "per_expert": in experts[k].
  bool any_threshold = false;
  for (float t : p.thresholds) any_threshold = any_threshold || t != 0.0f;
  j["threshold_form"] = p.thresholds.empty() ? "none" : any_threshold ? "per_expert" : "zero";
  json experts = json::array();
  json mask_experts = json::array();
  for (std::size_t k = 0; k < p.expert_count(); ++k) {
    json e = {{"index", k},
              {"path", p.expert_dirs[k]},
              {"catalog_expert", p.catalog_expert[k]},
              {"weight", p.weights[k]},
              {"density", p.densities[k]},
              {"alpha", p.alpha[k]}};
    if (!p.gammas.empty()) e["gamma"] = p.gammas[k];
    e.update(coverage_json(p.expert_coverage[k]));
    if (any_threshold) {
      json t = json::array();
      for (std::size_t i = 0; i < p.tensor_count; ++i)
        t.push_back(threshold_json(p.threshold(k, i)));
      e["thresholds"] = std::move(t);
      if (p.threshold_rows() == 2) {
        json u = json::array();
        for (std::size_t i = 0; i < p.tensor_count; ++i)
          u.push_back(threshold_json(p.upper_threshold(k, i)));
        e["upper_thresholds"] = std::move(u);
      }
    }
    experts.push_back(std::move(e));
    json runs = json::array();
    for (const auto& [first, count] : mask_runs(p.mask[k], p.block_count))
      runs.push_back({first, count});
    mask_experts.push_back({{"admitted", p.mask[k].count()},
                            {"bitmap_hex", mask_to_hex(p.mask[k], p.block_count)},
                            {"runs", std::move(runs)}});
  }
  j["experts"] = std::move(experts);
  json tensors = json::array();
  for (std::size_t i = 0; i < p.tensor_count; ++i) {
    json t = {{"name", p.tensor_names[i]}};
    t.update(coverage_json(p.tensor_coverage[i]));
    if (!p.linear_forms.empty()) {
      const std::size_t width = p.expert_count() + 1;
      json form = json::array();
      for (std::size_t c = 0; c < width; ++c)
        form.push_back(static_cast<double>(p.linear_forms[i * width + c]));
      t["linear_form"] = std::move(form);
    }
    tensors.push_back(std::move(t));
  }
  j["tensors"] = std::move(tensors);
  j["access_mask"] = {{"encoding",
                       "bitmap_hex: byte i = blocks 8i..8i+7, bit j = block 8i+j; "
                       "runs: [first_block, count] of admitted blocks"},
                      {"blocks", p.block_count},
                      {"experts", std::move(mask_experts)}};
  return j;
}

Plan plan_from_json(const json& j, const std::string& source) {
  const Reader r(source);
  Plan p;
  if (r.str(j, "format") != kPlanFormat) r.fail("format", "not " + std::string(kPlanFormat));
  p.hash = r.str(j, "plan_hash");
  p.family_id = r.str(j, "family_id");
  p.method = r.str(j, "method");
  if (!parse_merge_method(p.method)) r.fail("method", "unknown method '" + p.method + "'");
  p.base_dir = r.str(j, "base_model");
  const json& params = r.at(j, "parameters", "");
  p.lambda = r.real(params, "lambda", "parameters.");
  p.normalize = r.boolean(params, "normalize", "parameters.");
  p.seed = r.u64(params, "seed", "parameters.");
  if (params.contains("rescale")) p.rescale = r.boolean(params, "rescale", "parameters.");
  if (params.contains("t")) p.t = r.real(params, "t", "parameters.");
  if (params.contains("scale")) p.scale = r.real(params, "scale", "parameters.");
  if (params.contains("options")) {
    if (!params["options"].is_object()) r.fail("parameters.options", "expected an object");
    for (const auto& [name, value] : params["options"].items())
      p.method_options[name] = r.real(params["options"], name, "parameters.options.");
  }
  if (params.contains("base_weight")) p.base_weight = r.real(params, "base_weight", "parameters.");
  if (j.contains("base_is_reference")) p.base_is_reference = r.boolean(j, "base_is_reference");
  if (params.contains("varying")) {
    if (!params["varying"].is_object()) r.fail("parameters.varying", "expected an object");
    p.varying_parameters = params["varying"].dump();
  }
  p.budget_bytes = r.u64(j, "budget_bytes");
  const json& max_error = r.at(j, "max_error", "");
  if (!max_error.is_null()) p.max_error = r.real(j, "max_error");
  p.planned_expert_bytes = r.u64(j, "planned_expert_bytes");
  p.full_expert_bytes = r.u64(j, "full_expert_bytes");
  p.error_bound = r.real(j, "error_bound");
  p.bound_is_guarantee = r.boolean(j, "bound_is_guarantee");
  p.deviation_estimate = r.real(j, "deviation_estimate");
  p.pairs_admitted = r.u64(j, "pairs_admitted");
  p.pairs_total = r.u64(j, "pairs_total");
  p.pairs_zero = r.u64(j, "pairs_zero");
  p.tensor_count = r.u64(j, "tensor_count");
  p.block_count = r.u64(j, "block_count");
  p.planning_seconds = r.real(j, "planning_seconds");

  const json& experts = r.at(j, "experts", "");
  if (!experts.is_array()) r.fail("experts", "expected an array");
  const std::size_t k_count = experts.size();
  const json& mask_experts =
      r.array(r.at(j, "access_mask", ""), "experts", k_count, "access_mask.");
  if (r.u64(r.at(j, "access_mask", ""), "blocks", "access_mask.") != p.block_count) {
    r.fail("access_mask.blocks", "differs from block_count");
  }
  if (k_count > 0 && p.tensor_count > std::numeric_limits<std::size_t>::max() / k_count) {
    r.fail("tensor_count", "too large");
  }
  const std::string threshold_form = r.str(j, "threshold_form");
  if (threshold_form != "none" && threshold_form != "zero" && threshold_form != "per_expert") {
    r.fail("threshold_form", "expected none, zero or per_expert");
  }
  const std::size_t rows = p.threshold_rows();
  if (threshold_form != "none") p.thresholds.assign(rows * k_count * p.tensor_count, 0.0f);
  for (std::size_t k = 0; k < k_count; ++k) {
    const std::string path = "experts[" + std::to_string(k) + "].";
    const json& e = experts[k];
    p.expert_dirs.push_back(r.str(e, "path", path));
    const std::uint64_t ce = r.u64(e, "catalog_expert", path);
    if (ce > UINT32_MAX) r.fail(path + "catalog_expert", "too large");
    p.catalog_expert.push_back(static_cast<std::uint32_t>(ce));
    p.weights.push_back(r.real(e, "weight", path));
    p.densities.push_back(r.real(e, "density", path));
    if (rows == 2) p.gammas.push_back(r.real(e, "gamma", path));
    p.alpha.push_back(r.real(e, "alpha", path));
    p.expert_coverage.push_back(r.coverage(e, path));
    if (threshold_form == "per_expert") {
      const json& t = r.array(e, "thresholds", p.tensor_count, path);
      for (std::size_t i = 0; i < p.tensor_count; ++i) {
        p.thresholds[k * p.tensor_count + i] =
            r.threshold(t[i], path + "thresholds[" + std::to_string(i) + "]");
      }
      if (rows == 2) {
        const json& u = r.array(e, "upper_thresholds", p.tensor_count, path);
        for (std::size_t i = 0; i < p.tensor_count; ++i) {
          p.thresholds[(k_count + k) * p.tensor_count + i] =
              r.threshold(u[i], path + "upper_thresholds[" + std::to_string(i) + "]");
        }
      }
    }
    const std::string mpath = "access_mask.experts[" + std::to_string(k) + "].";
    p.mask.push_back(mask_from_hex(r.str(mask_experts[k], "bitmap_hex", mpath), p.block_count));
    // The run-length form is redundant; when present it must agree with the bitmap.
    if (mask_experts[k].contains("runs")) {
      json runs = json::array();
      for (const auto& [first, count] : mask_runs(p.mask[k], p.block_count))
        runs.push_back({first, count});
      if (runs != mask_experts[k]["runs"]) r.fail(mpath + "runs", "disagrees with bitmap_hex");
    }
  }
  const json& tensors = r.array(j, "tensors", p.tensor_count);
  for (std::size_t i = 0; i < p.tensor_count; ++i) {
    const std::string path = "tensors[" + std::to_string(i) + "].";
    p.tensor_names.push_back(r.str(tensors[i], "name", path));
    p.tensor_coverage.push_back(r.coverage(tensors[i], path));
    // A Gram method's per-tensor coefficients: on every tensor or on none.
    if (i == 0 && tensors[i].contains("linear_form"))
      p.linear_forms.assign(p.tensor_count * (k_count + 1), 0.0f);
    if (p.linear_forms.empty()) continue;
    const json& form = r.array(tensors[i], "linear_form", k_count + 1, path);
    for (std::size_t c = 0; c <= k_count; ++c) {
      const float v = r.threshold(form[c], path + "linear_form[" + std::to_string(c) + "]");
      if (!std::isfinite(v)) r.fail(path + "linear_form", "not finite");
      p.linear_forms[i * (k_count + 1) + c] = v;
    }
  }
  check_shape(p, source);
  if (compute_plan_hash(p) != p.hash) {
    throw InputError(source + ": plan_hash " + p.hash + " does not match the plan's content");
  }
  return p;
}

}  // namespace mergepipe
