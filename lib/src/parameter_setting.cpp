#include "mergepipe/parameter_setting.hpp"

#include "mergepipe/layer_names.hpp"

#include <algorithm>
#include <stdexcept>

namespace mergepipe {

ParameterSetting ParameterSetting::constant(double value) {
  ParameterSetting s;
  s.rules.push_back({std::nullopt, {value}});
  return s;
}

double gradient_value(const std::vector<double>& values, double t) {
  if (values.empty()) throw std::invalid_argument("gradient_value: no values");
  const double scaled = t * static_cast<double>(values.size() - 1);
  const auto i0 = static_cast<std::size_t>(scaled);
  const std::size_t i1 = std::min(values.size() - 1, i0 + 1);
  const double frac = scaled - static_cast<double>(i0);
  return (1 - frac) * values[std::min(i0, values.size() - 1)] + frac * values[i1];
}

std::optional<double> ParameterSetting::evaluate(std::string_view tensor_name, double t) const {
  for (const Rule& r : rules) {
    const bool matches = !r.filter || *r.filter == "*" ||
                         (!tensor_name.empty() && tensor_name.find(*r.filter) != std::string::npos);
    if (matches) return gradient_value(r.values, t);
  }
  return std::nullopt;
}

std::vector<double> ParameterSetting::listed_values() const {
  std::vector<double> out;
  for (const Rule& r : rules) out.insert(out.end(), r.values.begin(), r.values.end());
  return out;
}

namespace {

std::vector<double> values_from_json(const nlohmann::json& v) {
  if (v.is_number()) return {v.get<double>()};
  if (v.is_array() && !v.empty() &&
      std::all_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_number(); }))
    return v.get<std::vector<double>>();
  throw std::invalid_argument("expected a number or a list of numbers");
}

nlohmann::json values_to_json(const std::vector<double>& values) {
  return values.size() == 1 ? nlohmann::json(values[0]) : nlohmann::json(values);
}

}  // namespace

nlohmann::json setting_to_json(const ParameterSetting& setting) {
  if (!setting.conditional) return values_to_json(setting.rules.at(0).values);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : setting.rules) {
    out.push_back({{"filter", r.filter ? nlohmann::json(*r.filter) : nlohmann::json()},
                   {"value", values_to_json(r.values)}});
  }
  return out;
}

ParameterSetting setting_from_json(const nlohmann::json& json) {
  ParameterSetting s;
  if (json.is_array() && !json.empty() && json.front().is_object()) {
    s.conditional = true;
    for (const auto& c : json) {
      if (!c.is_object() || !c.contains("value"))
        throw std::invalid_argument("a conditional needs a 'value'");
      ParameterSetting::Rule r;
      if (c.contains("filter") && !c["filter"].is_null()) r.filter = c["filter"].get<std::string>();
      r.values = values_from_json(c["value"]);
      s.rules.push_back(std::move(r));
    }
    return s;
  }
  s.rules.push_back({std::nullopt, values_from_json(json)});
  return s;
}

nlohmann::json table_to_json(const ParameterTable& table) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, setting] : table) out[name] = setting_to_json(setting);
  return out;
}

ParameterTable table_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw std::invalid_argument("expected an object of parameters");
  ParameterTable table;
  for (const auto& [name, value] : json.items()) table[name] = setting_from_json(value);
  return table;
}

std::vector<double> gradient_positions(const std::vector<std::string>& tensor_names) {
  std::size_t layers = 0;
  for (const auto& n : tensor_names)
    if (auto l = tensor_layer(n)) layers = std::max(layers, *l + 1);
  std::vector<double> out;
  out.reserve(tensor_names.size());
  for (const auto& n : tensor_names) {
    if (auto l = tensor_layer(n)) {
      out.push_back(layers > 1 ? static_cast<double>(*l) / static_cast<double>(layers - 1) : 1.0);
    } else {
      out.push_back(0.0);  // mergekit plans its pre- and post-weights at t = 0
    }
  }
  return out;
}

}  // namespace mergepipe
