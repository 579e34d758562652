#pragma once
// Subcommands of the `mergepipe` binary. Each parses its own options (Boost.Program_options),
// throws mergepipe::Error on failure and returns the exit code on success.
#include <string>
#include <vector>

#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::app {

struct CommandContext {
  std::vector<std::string> args;  // arguments after the subcommand name
  mpi::Comm& comm;
};

int cmd_synth(CommandContext& ctx);
int cmd_inspect(CommandContext& ctx);
int cmd_catalog(CommandContext& ctx);
int cmd_plan(CommandContext& ctx);
int cmd_merge(CommandContext& ctx);
int cmd_replay(CommandContext& ctx);
int cmd_verify(CommandContext& ctx);

}  // namespace mergepipe::app
