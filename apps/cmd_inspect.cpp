#include "commands.hpp"

namespace mergepipe::app {

int cmd_inspect(CommandContext&) { throw UsageError("inspect: not built yet"); }

}  // namespace mergepipe::app
