#pragma once
// The YAML merge description (SPEC §4) in the form users of the common merging toolkit write:
//
//   merge_method: ties                 # linear | task_arithmetic | ties | dare_linear | dare_ties
//   base_model: /path/base
//   models:
//     - model: /path/expert00
//       parameters: {weight: 1.0, density: 0.5}
//     - /path/expert01                 # a plain string: default parameters
//   parameters: {normalize: true, lambda: 1.0, weight: 1.0, density: 1.0}  # global defaults
//   dtype: bfloat16                    # bfloat16|float16|float32 (also bf16/fp16/fp32)
//   budget: 25%                        # ours: default expert read budget
//   seed: 42                           # ours: DARE mask seed
//
// Relative paths are resolved against the config file's folder. Unknown keys, unsupported
// methods, wrong types, bad values and bad YAML are UsageErrors naming the file, the key and
// the line.
#include <string>

#include "mergepipe/merge_spec.hpp"

namespace mergepipe::io {

// Reads and parses a config file (UsageError when it does not exist, IoError when it cannot be
// read).
MergeSpec load_merge_config(const std::string& path);

// Parses config text; `source_name` is the file name used in messages and the folder relative
// paths are resolved against (its parent; the working directory when it has none).
MergeSpec parse_merge_config(const std::string& yaml_text, const std::string& source_name);

}  // namespace mergepipe::io
