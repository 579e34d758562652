#pragma once
// Shared option-parsing helpers for subcommands.
#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <vector>

namespace mergepipe::app {

namespace po = boost::program_options;

// Parses args against `options` (+ positional). Adds --help. Returns nullopt after printing help
// (on rank 0 only); throws UsageError naming the bad option otherwise.
std::optional<po::variables_map> parse_command_line(
    const std::string& command, const std::string& synopsis, po::options_description options,
    const po::positional_options_description& positional, const std::vector<std::string>& args,
    bool print);

}  // namespace mergepipe::app
