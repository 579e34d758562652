#include "commands.hpp"

namespace mergepipe::app {

int cmd_replay(CommandContext&) { throw UsageError("replay: not built yet"); }

}  // namespace mergepipe::app
