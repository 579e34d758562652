#include "mergepipe/io/merge_config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/model_reference.hpp"
#include "mergepipe/merge_task.hpp"
#include "mergepipe/number_text.hpp"

namespace mergepipe::io {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Builds messages "FILE:LINE: key 'a.b': problem" and reads typed values.
class ConfigReader {
 public:
  explicit ConfigReader(std::string source) : source_(std::move(source)) {}

  // Lines for MergeSpec::config_warnings, gathered while reading.
  mutable std::vector<std::string> warnings;

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& why) const {
    std::string where = source_;
    const YAML::Mark mark = at.Mark();
    if (!mark.is_null()) where += ":" + std::to_string(mark.line + 1);
    throw UsageError(where + ": " + (key.empty() ? "" : "key '" + key + "': ") + why);
  }

  // The entries of a mapping, with unknown and duplicate keys rejected.
  std::vector<std::pair<std::string, YAML::Node>> entries(
      const YAML::Node& map, const std::string& path, const std::set<std::string>& allowed) const {
    if (!map.IsMap()) fail(map, path, "expected a mapping of keys");
    std::vector<std::pair<std::string, YAML::Node>> out;
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar()) fail(it->first, path, "keys must be plain names");
      const std::string key = it->first.Scalar();
      const std::string full = path.empty() ? key : path + "." + key;
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(it->first, full, "unknown key (expected one of: " + list + ")");
      }
      if (!seen.insert(key).second) fail(it->first, full, "given twice");
      out.emplace_back(key, it->second);
    }
    return out;
  }

  std::string scalar(const YAML::Node& v, const std::string& key, const char* what) const {
    if (!v.IsScalar()) fail(v, key, std::string("expected ") + what);
    return v.Scalar();
  }

  std::string string(const YAML::Node& v, const std::string& key) const {
    std::string s = scalar(v, key, "a string");
    if (s.empty()) fail(v, key, "must not be empty");
    return s;
  }

  double number(const YAML::Node& v, const std::string& key) const {
    const std::string s = scalar(v, key, "a number");
    const std::string l = lower(s);
    const std::string bare = (!l.empty() && (l[0] == '+' || l[0] == '-')) ? l.substr(1) : l;
    if (bare == ".inf" || bare == "inf" || bare == "infinity" || bare == ".nan" || bare == "nan") {
      fail(v, key, "'" + s + "' is not a finite number");
    }
    errno = 0;
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size())
      fail(v, key, "expected a number, got '" + s + "'");
    if (errno == ERANGE || !std::isfinite(d)) fail(v, key, "'" + s + "' is not a finite number");
    return d;
  }

  bool boolean(const YAML::Node& v, const std::string& key) const {
    const std::string s = lower(scalar(v, key, "true or false"));
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
    fail(v, key, "expected true or false, got '" + v.Scalar() + "'");
  }

  std::uint64_t unsigned_integer(const YAML::Node& v, const std::string& key) const {
    const std::string s = scalar(v, key, "a non-negative integer");
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
      fail(v, key, "expected a non-negative integer, got '" + s + "'");
    }
    errno = 0;
    const unsigned long long n = std::strtoull(s.c_str(), nullptr, 10);
    if (errno == ERANGE) fail(v, key, "'" + s + "' does not fit in 64 bits");
    return n;
  }

  // mergekit's parameter setting: a number, a gradient (a list of numbers), one conditional
  // {filter, value} or a list of them. A density's every value must lie in (0, 1].
  ParameterSetting setting(const YAML::Node& v, const std::string& key) const {
    const bool is_density = key.size() >= 7 && key.compare(key.size() - 7, 7, "density") == 0;
    const bool is_gamma = key.size() >= 5 && key.compare(key.size() - 5, 5, "gamma") == 0;
    const auto numbers = [&](const YAML::Node& n, const std::string& k) {
      std::vector<double> out;
      if (n.IsScalar()) {
        out.push_back(number(n, k));
      } else if (n.IsSequence() && n.size() > 0) {
        for (const YAML::Node& x : n) {
          if (!x.IsScalar())
            fail(x, k, "a gradient is a list of numbers (or use a list of {filter, value})");
          out.push_back(number(x, k));
        }
      } else {
        fail(n, k,
             "expected a number, a list of numbers (a gradient) or a list of {filter, value}");
      }
      if (is_density)
        for (double d : out)
          if (!(d > 0.0 && d <= 1.0))
            fail(n, k, "density " + number_text(d) + " is outside (0, 1]");
      if (is_gamma)
        for (double g : out)
          if (!(g >= 0.0 && g <= 1.0)) fail(n, k, "gamma " + number_text(g) + " is outside [0, 1]");
      return out;
    };
    ParameterSetting s;
    const auto conditional = [&](const YAML::Node& c, const std::string& k) {
      ParameterSetting::Rule rule;
      bool have_value = false;
      for (const auto& [ckey, cvalue] : entries(c, k, {"filter", "value", "pattern"})) {
        if (ckey == "filter") {
          if (!cvalue.IsNull()) rule.filter = string(cvalue, k + ".filter");
        } else if (ckey == "pattern") {
          // mergekit's own gradient-slerp example spells it so, and its config model drops the
          // key without a word: the entry then matches every tensor. The same here, said aloud.
          const YAML::Mark mark = cvalue.Mark();
          warnings.push_back(source_ + (mark.is_null() ? "" : ":" + std::to_string(mark.line + 1)) +
                             ": '" + k +
                             ".pattern' is not a key mergekit reads: it drops it, so this entry "
                             "applies to every tensor, here too (write 'filter' to restrict it)");
        } else {
          rule.values = numbers(cvalue, k + ".value");
          have_value = true;
        }
      }
      if (!have_value) fail(c, k + ".value", "missing");
      s.rules.push_back(std::move(rule));
    };
    if (v.IsMap()) {
      s.conditional = true;
      conditional(v, key);
    } else if (v.IsSequence() && v.size() > 0 && v[0].IsMap()) {
      s.conditional = true;
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!v[i].IsMap()) fail(v[i], key, "mixes conditionals {filter, value} with plain values");
        conditional(v[i], key + "[" + std::to_string(i) + "]");
      }
    } else {
      s.rules.push_back({std::nullopt, numbers(v, key)});
    }
    return s;
  }

  // A true/false parameter: mergekit evaluates no gradient or filter of one here.
  bool flag(const YAML::Node& v, const std::string& key) const {
    if (!v.IsScalar())
      fail(v, key, "takes true or false; a gradient or per-tensor filter of it is not supported");
    return boolean(v, key);
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

// The number a table gives `name` when that setting is a plain number.
std::optional<double> constant_of(const ParameterTable& table, const std::string& name) {
  const auto it = table.find(name);
  if (it == table.end()) return std::nullopt;
  return it->second.rules[0].values[0];
}

// Settings are parsed into the spec's varying tables (the top level, the base's, each model's).
// A parameter whose every setting there is one number is folded into the scalars (the model's own
// value, else the top level's, else the default) and leaves the tables: only what really varies
// by tensor stays (MergeSpec::varying).
void fold_constant_settings(MergeSpec& spec) {
  const auto constant = [&](const std::string& name) {
    const auto ok = [&](const ParameterTable& t) {
      const auto it = t.find(name);
      return it == t.end() || it->second.is_constant();
    };
    bool all = ok(spec.varying) && ok(spec.base_varying);
    for (const ExpertSpec& e : spec.experts) all = all && ok(e.varying);
    return all;
  };
  for (const std::string name : {"weight", "density", "gamma"}) {
    if (!constant(name)) continue;
    const std::optional<double> top = constant_of(spec.varying, name);
    for (ExpertSpec& e : spec.experts) {
      double& field = name == "weight" ? e.weight : name == "density" ? e.density : e.gamma;
      field = constant_of(e.varying, name).value_or(top.value_or(field));
      e.varying.erase(name);
    }
    if (name == "weight" && spec.base_weight)
      spec.base_weight = constant_of(spec.base_varying, name).value_or(top.value_or(1.0));
    spec.base_varying.erase(name);
    spec.varying.erase(name);
  }
  if (constant("lambda")) {
    spec.lambda = constant_of(spec.varying, "lambda").value_or(spec.lambda);
    spec.varying.erase("lambda");
  }
  if (constant("scale")) {
    if (auto scale = constant_of(spec.varying, "scale")) spec.scale = scale;
    spec.varying.erase("scale");
  }
  if (constant("t")) {
    if (auto t = constant_of(spec.varying, "t")) spec.t = t;
    spec.varying.erase("t");
  }
}

// mergekit's `slices` for passthrough: each slice one source, layers [a, b) of one model.
template <typename ModelPath>
void read_passthrough_slices(const ConfigReader& r, const YAML::Node& slices, MergeSpec& spec,
                             const ModelPath& model_path) {
  if (!slices.IsSequence() || slices.size() == 0)
    r.fail(slices, "slices", "expected a list of slices");
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const std::string path = "slices[" + std::to_string(i) + "]";
    std::optional<YAML::Node> sources;
    for (const auto& [key, value] :
         r.entries(slices[i], path, {"sources", "base_model", "residual_weight", "parameters"})) {
      if (key == "sources") {
        sources = value;
      } else if (!value.IsNull()) {
        r.fail(value, path + "." + key,
               "a slice's own " + key + " is not supported yet (passthrough slices copy layers)");
      }
    }
    if (!sources) r.fail(slices[i], path + ".sources", "missing");
    if (!sources->IsSequence() || sources->size() != 1) {
      r.fail(*sources, path + ".sources",
             "passthrough copies one source per slice; a slice of " +
                 std::to_string(sources->IsSequence() ? sources->size() : 0) +
                 " sources merges them (a per-slice merge), which is not supported yet");
    }
    const YAML::Node source = (*sources)[0];
    const std::string spath = path + ".sources[0]";
    SliceSource slice;
    bool have_model = false, have_range = false;
    for (const auto& [key, value] :
         r.entries(source, spath, {"model", "layer_range", "parameters"})) {
      if (key == "model") {
        slice.model = model_path(value, spath + ".model");
        have_model = true;
      } else if (key == "layer_range") {
        if (!value.IsSequence() || value.size() != 2)
          r.fail(value, spath + ".layer_range", "expected [first, end] (end not included)");
        slice.first_layer = r.unsigned_integer(value[0], spath + ".layer_range");
        slice.end_layer = r.unsigned_integer(value[1], spath + ".layer_range");
        if (slice.end_layer <= slice.first_layer)
          r.fail(value, spath + ".layer_range", "the end must be after the first layer");
        have_range = true;
      } else if (!value.IsNull()) {
        r.fail(value, spath + ".parameters",
               "a source's own parameters are not supported yet (give 'scale' at the top level)");
      }
    }
    if (!have_model) r.fail(source, spath + ".model", "missing");
    if (!have_range) r.fail(source, spath + ".layer_range", "missing");
    spec.slices.push_back(std::move(slice));
  }
}

// A merge written as one slice whose sources all take the same layers (the form of mergekit's
// slerp examples): its sources are the models, each with its own parameters, and the range
// must be every layer of them (checked against the models: check_whole_model_slice). Slices
// that merge part of the layers, or several slices, are refused.
YAML::Node whole_model_slice(const ConfigReader& r, const YAML::Node& slices, MergeSpec& spec) {
  const std::string method(merge_method_name(spec.method));
  if (!slices.IsSequence() || slices.size() == 0)
    r.fail(slices, "slices", "expected a list of slices");
  if (slices.size() != 1) {
    r.fail(slices, "slices",
           std::to_string(slices.size()) + " slices merged by " + method +
               " (per-slice merges) are not supported yet; one slice of every layer of the "
               "models is, as are passthrough slices (frankenmerges) and 'models'");
  }
  std::optional<YAML::Node> sources;
  for (const auto& [key, value] : r.entries(
           slices[0], "slices[0]", {"sources", "base_model", "residual_weight", "parameters"})) {
    if (key == "sources") {
      sources = value;
    } else if (!value.IsNull()) {
      r.fail(value, "slices[0]." + key,
             "a slice's own " + key + " is not supported yet (give it at the top level)");
    }
  }
  if (!sources) r.fail(slices[0], "slices[0].sources", "missing");
  if (!sources->IsSequence() || sources->size() == 0)
    r.fail(*sources, "slices[0].sources", "expected a list of sources");
  YAML::Node models(YAML::NodeType::Sequence);
  std::optional<std::pair<std::uint64_t, std::uint64_t>> range;
  for (std::size_t i = 0; i < sources->size(); ++i) {
    const YAML::Node source = (*sources)[i];
    const std::string path = "slices[0].sources[" + std::to_string(i) + "]";
    YAML::Node model(YAML::NodeType::Map);
    for (const auto& [key, value] :
         r.entries(source, path, {"model", "layer_range", "parameters"})) {
      if (key == "layer_range") {
        if (!value.IsSequence() || value.size() != 2)
          r.fail(value, path + ".layer_range", "expected [first, end] (end not included)");
        const std::pair<std::uint64_t, std::uint64_t> here{
            r.unsigned_integer(value[0], path + ".layer_range"),
            r.unsigned_integer(value[1], path + ".layer_range")};
        if (range && *range != here) {
          r.fail(value, path + ".layer_range",
                 "differs from the first source's: merging different layers of the models (a "
                 "per-slice merge) is not supported yet");
        }
        range = here;
      } else {
        model[key] = value;
      }
    }
    if (!range) r.fail(source, path + ".layer_range", "missing");
    models.push_back(model);
  }
  spec.merge_layer_range = range;
  return models;
}

}  // namespace

MergeSpec parse_merge_config(const std::string& yaml_text, const std::string& source_name) {
  const ConfigReader r(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    std::string where = source_name;
    if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1);
    throw UsageError(where + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) {
    throw UsageError(source_name + ": expected a mapping with merge_method, base_model and models");
  }
  const fs::path folder = fs::path(source_name).parent_path();

  MergeSpec spec;
  // A model reference as mergekit resolves it (model_reference.hpp); errors name the key.
  const auto model_path = [&](const YAML::Node& node, const std::string& key) -> std::string {
    const std::string reference = r.string(node, key);
    try {
      ResolvedModel m = resolve_model_reference(reference, folder.string());
      if (m.warning) {
        const std::string line = source_name + ": " + *m.warning;
        if (std::find(spec.config_warnings.begin(), spec.config_warnings.end(), line) ==
            spec.config_warnings.end())
          spec.config_warnings.push_back(line);
      }
      spec.model_names[m.path] = reference;
      return m.path;
    } catch (const UsageError& e) {
      r.fail(node, key, e.what());
    }
  };
  // Parameters given explicitly (a key that changes nothing for the method is reported).
  bool gave_lambda = false, gave_normalize = false, gave_density = false, gave_weight = false,
       gave_rescale = false, gave_int8_mask = false, gave_gamma = false;
  std::optional<bool> normalize_weights;  // multislerp's name for normalize
  bool have_method = false, have_base = false, have_models = false;
  std::optional<DType> compute_dtype, written_dtype;
  std::optional<YAML::Node> tokenizer_source, slices;
  YAML::Node models;
  for (const auto& [key, value] : r.entries(
           root, "",
           {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype", "budget",
            "seed", "slices", "modules", "tokenizer_source", "tokenizer", "chat_template"})) {
    if (key == "merge_method") {
      const std::string name = r.string(value, key);
      const auto method = parse_merge_method(name);
      if (!method) {
        r.fail(value, key,
               "unsupported method '" + name + "' (supported: " + supported_method_names() + ")");
      }
      spec.method = *method;
      have_method = true;
    } else if (key == "base_model") {
      spec.base_model = model_path(value, key);
      have_base = true;
    } else if (key == "models") {
      models = value;
      have_models = true;
    } else if (key == "parameters") {
      if (value.IsNull()) continue;
      for (const auto& [pkey, pvalue] :
           r.entries(value, key,
                     {"normalize", "lambda", "weight", "density", "gamma", "rescale", "t",
                      "int8_mask", "scale", "normalize_weights", "max_iter", "tol", "eps",
                      "filter_wise", "nuslerp_flatten", "nuslerp_row_wise", "epsilon"})) {
        const std::string full = key + "." + pkey;
        gave_lambda |= pkey == "lambda";
        gave_normalize |= pkey == "normalize";
        gave_density |= pkey == "density";
        gave_gamma |= pkey == "gamma";
        gave_weight |= pkey == "weight";
        gave_rescale |= pkey == "rescale";
        gave_int8_mask |= pkey == "int8_mask";
        if (pkey == "normalize") spec.normalize = r.flag(pvalue, full);
        if (pkey == "rescale") spec.rescale = r.flag(pvalue, full);
        // mergekit's int8_mask stores its sign masks as int8 to save memory; the merge is the
        // same, and masks here are never materialised: accepted, it changes nothing.
        if (pkey == "int8_mask") (void)r.flag(pvalue, full);
        if (pkey == "normalize_weights") normalize_weights = r.flag(pvalue, full);
        if (pkey == "filter_wise" || pkey == "nuslerp_flatten" || pkey == "nuslerp_row_wise")
          spec.method_options[pkey] = r.flag(pvalue, full) ? 1.0 : 0.0;
        if (pkey == "max_iter" || pkey == "tol" || pkey == "eps" || pkey == "epsilon")
          spec.method_options[pkey] = r.number(pvalue, full);
        if (pkey == "t" || pkey == "lambda" || pkey == "weight" || pkey == "density" ||
            pkey == "gamma" || pkey == "scale")
          spec.varying[pkey] = r.setting(pvalue, full);
      }
    } else if (key == "dtype" || key == "out_dtype") {
      const std::string name = r.string(value, key);
      DType dtype{};
      try {
        dtype = parse_output_dtype(name);
      } catch (const UsageError&) {
        r.fail(value, key,
               "unsupported " + key + " '" + name + "' (use bfloat16, float16 or float32)");
      }
      // mergekit computes in `dtype` and writes `out_dtype` (else `dtype`); the arithmetic here
      // is float32 whatever `dtype` says, so only the written dtype follows the config.
      (key == "dtype" ? compute_dtype : written_dtype) = dtype;
    } else if (key == "slices") {
      slices = value;  // read once the method is known
    } else if (key == "modules") {
      r.fail(value, key,
             "modules (separate merges of a model's parts) are not supported yet; list whole "
             "models under 'models', or passthrough 'slices'");
    } else if (key == "tokenizer_source") {
      tokenizer_source = value;
    } else if (key == "tokenizer") {
      for (const auto& [tkey, tvalue] :
           r.entries(value, key, {"source", "tokens", "pad_to_multiple_of"})) {
        if (tkey == "source") {
          tokenizer_source = tvalue;
        } else if (!tvalue.IsNull()) {
          r.fail(tvalue, key + "." + tkey,
                 tkey == "tokens" ? "adding or editing tokens (and their embedding rows) is not "
                                    "supported yet"
                                  : "padding the vocabulary (and its embedding rows) is not "
                                    "supported yet");
        }
      }
    } else if (key == "chat_template") {
      spec.chat_template = r.string(value, key);
      const std::string& t = *spec.chat_template;
      if (t != "auto" && t != "chatml" && t.find("{{") == std::string::npos &&
          t.find("{%") == std::string::npos) {
        r.fail(value, key,
               "unknown chat template '" + t +
                   "' (give auto, chatml, or the template itself in Jinja syntax)");
      }
    } else if (key == "budget") {
      const std::string text = r.string(value, key);
      try {
        Budget::parse(text);
      } catch (const UsageError& e) {
        r.fail(value, key, e.what());
      }
      spec.budget = text;
    } else if (key == "seed") {
      spec.seed = r.unsigned_integer(value, key);
    }
  }
  if (!have_method) r.fail(root, "merge_method", "missing");
  // linear is a weighted average of the models: mergekit needs no base for it. The first model
  // then serves as the reference the others' deltas are taken against.
  const bool passthrough = spec.method == MergeMethod::kPassthrough;
  if (slices && !passthrough) {
    if (have_models) r.fail(*slices, "slices", "give either 'models' or 'slices', not both");
    models = whole_model_slice(r, *slices, spec);
    have_models = true;
  }
  if (slices && passthrough) {
    if (have_models) r.fail(*slices, "slices", "give either 'models' or 'slices', not both");
    read_passthrough_slices(r, *slices, spec, model_path);
    if (!have_base) spec.base_model = spec.slices.front().model;
  } else {
    const bool base_optional =
        spec.method == MergeMethod::kLinear || spec.method == MergeMethod::kKarcher ||
        spec.method == MergeMethod::kMultislerp || spec.method == MergeMethod::kNuslerp;
    if (!have_base && !base_optional && !passthrough) {
      r.fail(root, "base_model",
             "missing (" + std::string(merge_method_name(spec.method)) +
                 " merges deltas against a base; only linear, karcher, multislerp and nuslerp take "
                 "none)");
    }
    if (!have_models) r.fail(root, "models", "missing");
    if (!models.IsSequence()) r.fail(models, "models", "expected a list of models");
  }

  for (std::size_t i = 0; i < models.size(); ++i) {
    const YAML::Node entry = models[i];
    const std::string path = "models[" + std::to_string(i) + "]";
    ExpertSpec e;
    if (entry.IsScalar()) {
      e.path = model_path(entry, path);
    } else {
      bool have_model = false;
      for (const auto& [key, value] : r.entries(entry, path, {"model", "parameters"})) {
        if (key == "model") {
          e.path = model_path(value, path + ".model");
          have_model = true;
        } else if (!value.IsNull()) {
          for (const auto& [pkey, pvalue] :
               r.entries(value, path + ".parameters", {"weight", "density", "gamma"})) {
            const std::string full = path + ".parameters." + pkey;
            gave_weight |= pkey == "weight";
            gave_density |= pkey == "density";
            gave_gamma |= pkey == "gamma";
            e.varying[pkey] = r.setting(pvalue, full);
          }
        }
      }
      if (!have_model) r.fail(entry, path + ".model", "missing");
    }
    spec.experts.push_back(std::move(e));
  }
  if (passthrough && !have_base && !spec.experts.empty()) {
    // passthrough of one model: that model is what is copied.
    spec.base_model = spec.experts.front().path;
    spec.experts.erase(spec.experts.begin());
  } else if (!have_base && !spec.experts.empty()) {
    spec.base_model = spec.experts.front().path;
    spec.base_weight = 1.0;  // its weight is folded in below
    spec.base_varying = std::move(spec.experts.front().varying);
    spec.base_varying.erase("density");
    spec.base_varying.erase("gamma");
    spec.base_is_reference = true;
    spec.experts.erase(spec.experts.begin());
  } else {
    // The base listed among the models too (mergekit allows it): linear averages it with its
    // weight; the task-vector methods take nothing from it (its delta is zero), as mergekit.
    for (auto it = spec.experts.begin(); it != spec.experts.end(); ++it) {
      if (it->path != spec.base_model) continue;
      if (spec.method == MergeMethod::kLinear) {
        spec.base_weight = 1.0;
        spec.base_varying = std::move(it->varying);
        spec.base_varying.erase("density");
        spec.base_varying.erase("gamma");
        spec.base_varying.erase("gamma");
      }
      spec.experts.erase(it);
      break;
    }
  }
  spec.config_warnings.insert(spec.config_warnings.end(), r.warnings.begin(), r.warnings.end());
  fold_constant_settings(spec);
  spec.out_dtype = written_dtype ? written_dtype : compute_dtype;
  if (written_dtype && compute_dtype && *compute_dtype != DType::kF32) {
    spec.config_warnings.push_back(
        source_name + ": 'dtype' (" + torch_dtype_name(*compute_dtype) +
        ") changes nothing: mergekit computes in it, mergepipe computes in float32 always and "
        "writes out_dtype");
  }
  if (tokenizer_source) {
    const std::string source = r.string(*tokenizer_source, "tokenizer_source");
    if (source == "base" || source == "union") {
      spec.tokenizer_source = source;
    } else {
      spec.tokenizer_source = model_path(*tokenizer_source, "tokenizer_source");
    }
  }
  const std::string method(merge_method_name(spec.method));
  const auto ignored = [&](bool given, const char* key, const std::string& why) {
    if (given)
      spec.config_warnings.push_back(source_name + ": '" + key + "' changes nothing for " + method +
                                     " (" + why + ")");
  };
  const bool nearswap = spec.method == MergeMethod::kNearswap;
  const bool geometric =
      spec.method == MergeMethod::kModelStock || spec.method == MergeMethod::kKarcher ||
      spec.method == MergeMethod::kMultislerp || spec.method == MergeMethod::kNuslerp;
  const bool weighted = spec.method == MergeMethod::kMultislerp ||
                        spec.method == MergeMethod::kNuslerp;  // their weights count
  if (spec.method == MergeMethod::kMultislerp) {
    // mergekit's multislerp reads normalize_weights (default true) and no `normalize`.
    ignored(gave_normalize, "normalize", "its weights are normalised by 'normalize_weights'");
    spec.normalize = normalize_weights;
  } else if (normalize_weights) {
    throw UsageError(source_name + ": parameter 'normalize_weights' belongs to multislerp; " +
                     method + " does not take it");
  }
  if (geometric) {
    if (spec.method != MergeMethod::kMultislerp) spec.normalize.reset();
    ignored(gave_lambda, "lambda", "its coefficients come from the models' geometry");
    ignored(gave_density, "density", "it keeps every entry");
    ignored(gave_normalize && spec.method != MergeMethod::kMultislerp, "normalize",
            "its coefficients come from the models' geometry");
    ignored(gave_weight && !weighted, "weight",
            spec.method == MergeMethod::kKarcher ? "karcher weighs every model equally"
                                                 : "it averages the experts equally");
  }
  ignored(spec.method == MergeMethod::kNuslerp && spec.method_options.count("nuslerp_row_wise") &&
              spec.option("nuslerp_flatten", 1) != 0,
          "nuslerp_row_wise", "the whole tensor is one vector while nuslerp_flatten is true");
  ignored(gave_lambda && (spec.method == MergeMethod::kLinear || nearswap), "lambda",
          nearswap ? "it moves each entry by t" : "a weighted average has no scale");
  ignored(gave_density && (is_additive(spec.method) || nearswap), "density",
          "it keeps every entry; ties, breadcrumbs and the dare methods trim or drop by it");
  ignored(gave_weight && nearswap, "weight", "it takes one model and moves it by t");
  ignored(gave_normalize && nearswap, "normalize", "it takes one model");
  ignored(gave_rescale && spec.method == MergeMethod::kTaskArithmetic, "rescale",
          "it drops no entries to rescale, as in mergekit");
  // Methods that read none of weight, density, lambda and normalize: each one given is said.
  const char* reads_none =
      passthrough ? "it copies tensors; only 'scale' applies"
      : spec.method == MergeMethod::kSlerp
          ? "it interpolates between the base and the other model by t"
      : spec.method == MergeMethod::kRam
          ? "it averages, per entry, the deltas larger than epsilon, unweighted"
          : nullptr;
  if (reads_none) {
    for (const auto& [given, key] : {std::pair{gave_weight, "weight"},
                                     {gave_density, "density"},
                                     {gave_lambda, "lambda"},
                                     {gave_normalize, "normalize"}})
      ignored(given, key, reads_none);
  }
  if (gave_gamma && !uses_band_trim(spec.method))
    throw UsageError(source_name +
                     ": parameter 'gamma' belongs to breadcrumbs and "
                     "breadcrumbs_ties; " +
                     method + " does not take it");
  if (spec.method == MergeMethod::kRam) spec.normalize.reset();  // nothing to normalise
  ignored(gave_int8_mask, "int8_mask",
          "a memory option of mergekit's; masks are never held whole here");
  try {
    spec.validate();
  } catch (const UsageError& e) {
    throw UsageError(source_name + ": " + e.what());
  }
  return spec;
}

MergeSpec load_merge_config(const std::string& path) {
  // A config that is not there is a mistake on the command line; one that cannot be read is a
  // storage (or permission) failure.
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec) throw UsageError(path + ": no such config file");
  if (fs::is_directory(path, ec))
    throw UsageError(path + ": is a folder, not a config file (the merge's YAML file)");
  return parse_merge_config(read_text_file(path), path);
}

}  // namespace mergepipe::io
