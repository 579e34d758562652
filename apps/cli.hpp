#pragma once
// Shared option-parsing helpers for subcommands.
#include <boost/program_options.hpp>
#include <cstdint>
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

// A size in mergekit's units (its parse_kmb): digits, optionally followed by K, M or B (thousand,
// million, billion; either case): "5B" is 5,000,000,000 bytes. UsageError naming `what` otherwise.
std::uint64_t parse_mergekit_size(const std::string& text, const std::string& what);

}  // namespace mergepipe::app
