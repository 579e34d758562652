#include "strict_json.hpp"

#include <optional>
#include <unordered_set>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe::io::detail {

std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find("] ");
    if (close != std::string::npos) text.erase(0, close + 2);
  }
  return text;
}

nlohmann::json parse_strict_json(std::string_view text, const std::string& what,
                                 const std::string& top_level_noun) {
  using nlohmann::json;
  // One key set per open object or array (arrays keep an empty set so the stack stays aligned).
  std::vector<std::unordered_set<std::string>> open;
  std::string top_key;
  std::optional<std::string> duplicate;
  auto track = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (open.size() == 1) top_key = key;
        if (!open.empty() && !open.back().insert(key).second && !duplicate) {
          duplicate = open.size() == 1 ? "duplicate " + top_level_noun + " '" + key + "'"
                                       : "duplicate key '" + key + "' in '" + top_key + "'";
        }
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), track);
  } catch (const json::exception& e) {
    throw InputError(what + ": not valid JSON: " + json_error_text(e));
  }
  if (duplicate) throw InputError(what + ": " + *duplicate);
  return doc;
}

}  // namespace mergepipe::io::detail
