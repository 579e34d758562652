#include "commands.hpp"

namespace mergepipe::app {

int cmd_plan(CommandContext&) { throw UsageError("plan: not built yet"); }

}  // namespace mergepipe::app
