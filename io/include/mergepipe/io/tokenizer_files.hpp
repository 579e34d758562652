#pragma once
// The output folder's tokenizer, as mergekit's tokenizer_source and chat_template choose it.
// docs/mergekit.md ("Tokenizer") states what is supported and what is refused.
#include <string>
#include <vector>

#include "mergepipe/merge_spec.hpp"

namespace mergepipe::io {

// The folder whose tokenizer files the output carries: the base's unless tokenizer_source names
// a model. UsageError when the choice cannot be honoured without resizing the embeddings: a
// model whose vocabulary size (config.json) differs from the base's, a model without tokenizer
// files, or `union` over tokenizers that are not all identical to the base's.
std::string tokenizer_folder(const MergeSpec& spec);

// The chat template to write: "auto" is the one most of the models' tokenizer_config.json carry
// (the first in config order on a tie; none carried: nothing to write, ""), "chatml" the ChatML
// template, anything else the template as given.
std::string resolve_chat_template(const MergeSpec& spec);

// tokenizer_config.json with its chat_template set to `chat_template`.
std::string with_chat_template(const std::string& tokenizer_config_json,
                               const std::string& chat_template, const std::string& source);

}  // namespace mergepipe::io
