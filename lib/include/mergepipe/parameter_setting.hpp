#pragma once
// mergekit's parameter settings: a value that may vary by tensor. A setting is a number, a
// gradient (a list of numbers interpolated over the layers) or a list of conditionals
// {filter, value} where the first whose filter occurs in the tensor's name gives the value.
// docs/mergekit.md ("Gradients and filters") states the rules; the golden vectors of
// tests/data/golden check them.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mergepipe {

struct ParameterSetting {
  struct Rule {
    std::optional<std::string> filter;  // unset or "*": every tensor
    std::vector<double> values;         // one: a constant; more: a gradient over t in [0, 1]
    bool operator==(const Rule&) const = default;
  };
  std::vector<Rule> rules;
  bool conditional = false;  // written as a list of {filter, value}

  static ParameterSetting constant(double value);
  // A single number, the same for every tensor.
  bool is_constant() const {
    return !conditional && rules.size() == 1 && rules[0].values.size() == 1;
  }
  // The value for one tensor at gradient position t, or nullopt when no conditional matches
  // (the lookup then falls through to the next level, as in mergekit).
  std::optional<double> evaluate(std::string_view tensor_name, double t) const;
  // Every number the setting can produce lies between the smallest and largest listed value
  // (interpolation never leaves that range): what range checks look at.
  std::vector<double> listed_values() const;
  bool operator==(const ParameterSetting&) const = default;
};

// mergekit's interpolation of a gradient: position t·(n-1) between its two nearest points.
double gradient_value(const std::vector<double>& values, double t);

// Settings by parameter name ("weight", "density", "lambda", ...).
using ParameterTable = std::map<std::string, ParameterSetting>;

// The JSON form, as the YAML is written: a number, a list of numbers, or a list of
// {"filter": name or null, "value": number or list}. from_json throws std::invalid_argument.
nlohmann::json setting_to_json(const ParameterSetting& setting);
ParameterSetting setting_from_json(const nlohmann::json& json);
nlohmann::json table_to_json(const ParameterTable& table);
ParameterTable table_from_json(const nlohmann::json& json);

// Where mergekit evaluates gradients for each tensor: t = i / (n - 1) for layer i of n (1 when
// n = 1), and 0 for every tensor outside the layers (mergekit's pre-weights, the embeddings, and
// its post-weights, the final norm and the head, share one reader at t = 0). n counts the layers
// the names show.
std::vector<double> gradient_positions(const std::vector<std::string>& tensor_names);

}  // namespace mergepipe
