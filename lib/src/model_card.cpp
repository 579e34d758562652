#include "mergepipe/model_card.hpp"

#include <cstdio>
#include <sstream>

#include "mergepipe/number_text.hpp"

namespace mergepipe {

namespace {

// Bytes in the decimal units the Hugging Face hub shows.
std::string bytes(std::uint64_t n) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(n);
  std::size_t u = 0;
  while (v >= 1000 && u + 1 < std::size(units)) v /= 1000, ++u;
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return text;
}

// A YAML flow scalar that survives any path: double-quoted, with quotes and backslashes escaped.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string make_model_card(const MergeTask& task, const std::string& title,
                            const std::string& config_text) {
  const MergeSpec& spec = task.spec;
  const Plan& plan = task.plan;
  // Models as the config named them (hub ids stay hub ids), else their folders.
  const auto name = [&](const std::string& path) {
    const auto it = spec.model_names.find(path);
    return it == spec.model_names.end() ? path : it->second;
  };
  const auto param = [&](const ParameterTable& own, const char* key, double value) {
    return own.count(key) || spec.varying.count(key) ? std::string("varies by tensor")
                                                     : number_text(value);
  };
  std::ostringstream card;
  card << "---\nbase_model:\n- " << quoted(name(spec.base_model)) << "\n";
  for (const ExpertSpec& e : spec.experts) card << "- " << quoted(name(e.path)) << "\n";
  card << "library_name: transformers\ntags:\n- mergekit\n- merge\n- mergepipe\n---\n";
  card << "# " << title << "\n\n";
  card << "This is a merge of pre-trained language models made with MergePipe, which runs "
          "mergekit configurations as a distributed job and reads only the expert blocks its "
          "read budget admits.\n\n";
  card << "## Merge Details\n\n### Merge Method\n\n";
  card << "This model was merged using the " << merge_method_name(spec.method) << " merge method";
  if (spec.base_is_reference) {
    card << ", with " << name(spec.base_model)
         << " as the reference model (the configuration names no base model: its first model "
            "is the one the others' differences are taken against)";
  } else {
    card << " using " << name(spec.base_model) << " as a base";
  }
  card << ".\n\n### Models Merged\n\nThe following models were included in the merge:\n";
  if (spec.base_is_reference || spec.base_weight)
    card << "* " << name(spec.base_model) << " (weight "
         << param(spec.base_varying, "weight", spec.base_weight.value_or(1.0)) << ")\n";
  for (const ExpertSpec& e : spec.experts) {
    card << "* " << name(e.path) << " (weight " << param(e.varying, "weight", e.weight);
    if (e.density != 1.0 || e.varying.count("density") || spec.varying.count("density"))
      card << ", density " << param(e.varying, "density", e.density);
    card << ")\n";
  }
  card << "\n### Reads\n\n";
  if (task.full_read) {
    card << "Every expert block was read (`--full-read`).";
  } else {
    const double share = plan.full_expert_bytes
                             ? 100.0 * static_cast<double>(plan.planned_expert_bytes) /
                                   static_cast<double>(plan.full_expert_bytes)
                             : 0.0;
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.1f%%", share);
    card << "The merge read " << bytes(plan.planned_expert_bytes) << " of the experts' "
         << bytes(plan.full_expert_bytes) << " (" << pct << ", budget " << bytes(plan.budget_bytes)
         << "); the bound on the omitted update is " << number_text(plan.error_bound)
         << (plan.bound_is_guarantee ? " (a guarantee)" : " (an estimate)") << ".";
  }
  card << " Plan `" << plan.hash
       << "`; `mergepipe.manifest.json` records the inputs, the plan and every output tensor's "
          "hash (`mergepipe verify`, `mergepipe replay`).\n";
  if (!config_text.empty()) {
    card << "\n### Configuration\n\nThe following YAML configuration was used to produce this "
            "model:\n\n```yaml\n"
         << config_text << (config_text.back() == '\n' ? "" : "\n") << "```\n";
  }
  return card.str();
}

}  // namespace mergepipe
