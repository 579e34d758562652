#include "mergepipe/io/merge_config.hpp"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/merge_task.hpp"

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

  double density(const YAML::Node& v, const std::string& key) const {
    const double d = number(v, key);
    if (!(d > 0.0 && d <= 1.0)) fail(v, key, "density " + v.Scalar() + " is outside (0, 1]");
    return d;
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

std::string resolve_path(const std::string& path, const fs::path& folder) {
  fs::path p(path);
  if (p.is_relative()) p = folder / p;
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  std::string s = (ec ? p : abs).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

struct Defaults {
  double weight = 1.0;
  double density = 1.0;
};

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
  Defaults defaults;
  // Parameters given explicitly (a key that changes nothing for the method is reported).
  bool gave_lambda = false, gave_normalize = false, gave_density = false, gave_weight = false,
       gave_rescale = false, gave_int8_mask = false;
  bool have_method = false, have_base = false, have_models = false;
  YAML::Node models;
  for (const auto& [key, value] : r.entries(
           root, "",
           {"merge_method", "base_model", "models", "parameters", "dtype", "budget", "seed"})) {
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
      spec.base_model = resolve_path(r.string(value, key), folder);
      have_base = true;
    } else if (key == "models") {
      models = value;
      have_models = true;
    } else if (key == "parameters") {
      if (value.IsNull()) continue;
      for (const auto& [pkey, pvalue] :
           r.entries(value, key,
                     {"normalize", "lambda", "weight", "density", "rescale", "t", "int8_mask"})) {
        const std::string full = key + "." + pkey;
        gave_lambda |= pkey == "lambda";
        gave_normalize |= pkey == "normalize";
        gave_density |= pkey == "density";
        gave_weight |= pkey == "weight";
        gave_rescale |= pkey == "rescale";
        gave_int8_mask |= pkey == "int8_mask";
        if (pkey == "normalize") spec.normalize = r.boolean(pvalue, full);
        if (pkey == "rescale") spec.rescale = r.boolean(pvalue, full);
        if (pkey == "t") spec.t = r.number(pvalue, full);
        // mergekit's int8_mask stores its sign masks as int8 to save memory; the merge is the
        // same, and masks here are never materialised: accepted, it changes nothing.
        if (pkey == "int8_mask") (void)r.boolean(pvalue, full);
        if (pkey == "lambda") spec.lambda = r.number(pvalue, full);
        if (pkey == "weight") defaults.weight = r.number(pvalue, full);
        if (pkey == "density") defaults.density = r.density(pvalue, full);
      }
    } else if (key == "dtype") {
      const std::string name = r.string(value, key);
      try {
        spec.out_dtype = parse_output_dtype(name);
      } catch (const UsageError&) {
        r.fail(value, key, "unsupported dtype '" + name + "' (use bfloat16, float16 or float32)");
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
  if (!have_base && spec.method != MergeMethod::kLinear) {
    r.fail(root, "base_model",
           "missing (" + std::string(merge_method_name(spec.method)) +
               " merges deltas against a base; only linear takes none)");
  }
  if (!have_models) r.fail(root, "models", "missing");
  if (!models.IsSequence()) r.fail(models, "models", "expected a list of models");

  for (std::size_t i = 0; i < models.size(); ++i) {
    const YAML::Node entry = models[i];
    const std::string path = "models[" + std::to_string(i) + "]";
    ExpertSpec e;
    e.weight = defaults.weight;
    e.density = defaults.density;
    if (entry.IsScalar()) {
      e.path = resolve_path(r.string(entry, path), folder);
    } else {
      bool have_model = false;
      for (const auto& [key, value] : r.entries(entry, path, {"model", "parameters"})) {
        if (key == "model") {
          e.path = resolve_path(r.string(value, path + ".model"), folder);
          have_model = true;
        } else if (!value.IsNull()) {
          for (const auto& [pkey, pvalue] :
               r.entries(value, path + ".parameters", {"weight", "density"})) {
            const std::string full = path + ".parameters." + pkey;
            gave_weight |= pkey == "weight";
            gave_density |= pkey == "density";
            if (pkey == "weight") e.weight = r.number(pvalue, full);
            if (pkey == "density") e.density = r.density(pvalue, full);
          }
        }
      }
      if (!have_model) r.fail(entry, path + ".model", "missing");
    }
    spec.experts.push_back(std::move(e));
  }
  if (!have_base && !spec.experts.empty()) {
    spec.base_model = spec.experts.front().path;
    spec.base_weight = spec.experts.front().weight;
    spec.base_is_reference = true;
    spec.experts.erase(spec.experts.begin());
  } else {
    // The base listed among the models too (mergekit allows it): linear averages it with its
    // weight; the task-vector methods take nothing from it (its delta is zero), as mergekit.
    for (auto it = spec.experts.begin(); it != spec.experts.end(); ++it) {
      if (it->path != spec.base_model) continue;
      if (spec.method == MergeMethod::kLinear) spec.base_weight = it->weight;
      spec.experts.erase(it);
      break;
    }
  }
  const std::string method(merge_method_name(spec.method));
  const auto ignored = [&](bool given, const char* key, const std::string& why) {
    if (given)
      spec.ignored_keys.push_back(source_name + ": '" + key + "' changes nothing for " + method +
                                  " (" + why + ")");
  };
  const bool nearswap = spec.method == MergeMethod::kNearswap;
  ignored(gave_lambda && (spec.method == MergeMethod::kLinear || nearswap), "lambda",
          nearswap ? "it moves each entry by t" : "a weighted average has no scale");
  ignored(gave_density && (is_additive(spec.method) || nearswap), "density",
          "it keeps every entry; ties, dare_linear and dare_ties trim or drop by it");
  ignored(gave_weight && nearswap, "weight", "it takes one model and moves it by t");
  ignored(gave_normalize && nearswap, "normalize", "it takes one model");
  ignored(gave_rescale && spec.method == MergeMethod::kTaskArithmetic, "rescale",
          "it drops no entries to rescale, as in mergekit");
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
