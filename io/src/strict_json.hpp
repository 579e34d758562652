#pragma once
// JSON parsing that refuses duplicate object keys (nlohmann keeps the last one silently; a
// differential between readers on duplicates has been a real security issue for safetensors).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace mergepipe::io::detail {

// Parses `text`. On a syntax error or a duplicate key throws InputError "<what>: <problem>".
// A duplicate key at the top level is reported as "duplicate <top_level_noun> 'k'"; nested
// duplicates as "duplicate key 'k' in '<parent top-level key>'".
nlohmann::json parse_strict_json(std::string_view text, const std::string& what,
                                 const std::string& top_level_noun = "key");

// A JSON value for an error message: compact, and cut to about `max_chars` characters so a
// hostile header cannot make a message (or its formatting) huge.
std::string brief_dump(const nlohmann::json& value, std::size_t max_chars = 80);

// A name taken from a file (tensor, shard), as shown in a message: control characters escaped
// (`\x0a`), so the message stays one line, and cut after `max_bytes` bytes ("...").
std::string printable(std::string_view name, std::size_t max_bytes = 200);

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string json_error_text(const std::exception& e);

}  // namespace mergepipe::io::detail
