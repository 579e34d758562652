#include "commands.hpp"

namespace mergepipe::app {

int cmd_catalog(CommandContext&) { throw UsageError("catalog: not built yet"); }

}  // namespace mergepipe::app
