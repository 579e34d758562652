#pragma once
// The README.md model card of a merged folder, as mergekit writes one (front matter with the
// models and tags, the method, the models and their parameters, the configuration as given) and
// what only a budgeted merge can say: how much of the experts it read, under which plan.
// Deterministic: the same merge gives the same card (no dates, no host names).
#include <string>

#include "mergepipe/merge_task.hpp"

namespace mergepipe {

// `title`: the output folder's name; `config_text`: the YAML as the user wrote it ("" when not
// known: a replay of a manifest written before the text was recorded).
std::string make_model_card(const MergeTask& task, const std::string& title,
                            const std::string& config_text);

}  // namespace mergepipe
