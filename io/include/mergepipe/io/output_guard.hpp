#pragma once
// The one rule every writing command checks before it reads or writes anything
// (docs/reliability.md, "Inputs are never outputs"): the target of a write, resolved through
// symbolic links, is not, does not contain and does not lie inside any input of the command, nor
// the current folder or a parent of it. A target that exists is replaced only when it is what that
// command writes.
#include <string>
#include <vector>

namespace mergepipe::io {

struct GuardedInput {
  std::string role;  // "base", "expert", "catalog", "config", "manifest", ...
  std::string path;  // as the user gave it
};

// `path` made absolute, with every symbolic link of its existing part resolved and `.`/`..`
// removed (the part that does not exist yet is appended as written).
std::string resolved_path(const std::string& path);

// UsageError naming `what` (e.g. "merge: --out") when `target` is empty, is or holds a symbolic
// link as its last component, names a path too long for its folder (with room for the staging
// suffix), or is, contains or lies inside one of `inputs`, the current folder or a parent of it.
void check_output_target(const std::string& what, const std::string& target,
                         const std::vector<GuardedInput>& inputs);

// An existing merge output may be replaced (`--force`) only when it is a folder a mergepipe merge
// wrote: it holds `mergepipe.manifest.json` of this format (or nothing at all). UsageError
// otherwise, naming what would have been deleted. Without `force` an existing target is a
// UsageError. No-op when the target does not exist.
void check_replaceable_merge_output(const std::string& target, bool force);

// A file `plan --out` may overwrite: absent, or a plan JSON this program wrote.
void check_replaceable_plan_file(const std::string& target);

}  // namespace mergepipe::io
