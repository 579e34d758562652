#include "strict_json.hpp"

#include <cstdio>
#include <optional>
#include <unordered_set>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe::io::detail {

std::string json_error_text(const std::exception& e) {
  // The parser quotes the offending token, which hostile input can make megabytes long.
  constexpr std::size_t kMaxChars = 200;
  std::string text = e.what();
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find("] ");
    if (close != std::string::npos) text.erase(0, close + 2);
  }
  if (text.size() > kMaxChars) {
    text.resize(kMaxChars);
    text += "...";
  }
  return text;
}

namespace {

void append_brief(const nlohmann::json& value, std::string& out, std::size_t limit, int depth) {
  using nlohmann::json;
  constexpr int kMaxDepth = 4;
  if (out.size() >= limit) return;
  if (value.is_string()) {
    // Only a prefix of a long string; `replace` keeps a cut UTF-8 sequence from throwing.
    const std::string& s = value.get_ref<const std::string&>();
    out += json(s.substr(0, limit - out.size() + 1))
               .dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  if (!value.is_structured()) {
    out += value.dump();
    return;
  }
  const bool array = value.is_array();
  if (depth >= kMaxDepth) {
    out += array ? "[...]" : "{...}";
    return;
  }
  out += array ? '[' : '{';
  bool first = true;
  for (auto it = value.begin(); it != value.end() && out.size() < limit; ++it) {
    if (!first) out += ',';
    first = false;
    if (!array) {
      append_brief(json(it.key()), out, limit, depth + 1);
      out += ':';
    }
    append_brief(*it, out, limit, depth + 1);
  }
  out += array ? ']' : '}';
}

}  // namespace

std::string brief_dump(const nlohmann::json& value, std::size_t max_chars) {
  std::string out;
  append_brief(value, out, max_chars, 0);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}

std::string printable(std::string_view name, std::size_t max_bytes) {
  std::string shown;
  for (std::size_t i = 0; i < name.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += hex;
    } else {
      shown += name[i];
    }
  }
  if (name.size() > max_bytes) shown += "...";
  return shown;
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
