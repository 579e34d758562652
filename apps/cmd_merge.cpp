#include "commands.hpp"

namespace mergepipe::app {

int cmd_merge(CommandContext&) { throw UsageError("merge: not built yet"); }

}  // namespace mergepipe::app
