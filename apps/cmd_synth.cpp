#include "commands.hpp"

namespace mergepipe::app {

int cmd_synth(CommandContext&) { throw UsageError("synth: not built yet"); }

}  // namespace mergepipe::app
