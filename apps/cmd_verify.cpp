#include "commands.hpp"

namespace mergepipe::app {

int cmd_verify(CommandContext&) { throw UsageError("verify: not built yet"); }

}  // namespace mergepipe::app
