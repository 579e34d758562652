#include "cli.hpp"

#include <iostream>

#include "mergepipe/error.hpp"
#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::app {

namespace {

// A multi-value option given no value takes the next option as one (`--experts --out cat`
// would make `--out` and `cat` expert folders and then report `--out` as missing).
void reject_options_taken_as_values(const std::string& command,
                                    const po::options_description& options,
                                    const po::variables_map& vm) {
  for (const auto& [name, value] : vm) {
    const auto* tokens = boost::any_cast<std::vector<std::string>>(&value.value());
    if (tokens == nullptr) continue;
    for (const std::string& token : *tokens) {
      if (token.size() < 3 || token.compare(0, 2, "--") != 0) continue;
      const std::string option = token.substr(2, token.find('=') - 2);
      if (options.find_nothrow(option, false) == nullptr && option != "help") continue;
      throw UsageError(command + ": --" + name + " needs at least one value before --" + option +
                       " (see 'mergepipe " + command + " --help')");
    }
  }
}

}  // namespace

std::optional<po::variables_map> parse_command_line(
    const std::string& command, const std::string& synopsis, po::options_description options,
    const po::positional_options_description& positional, const std::vector<std::string>& args,
    bool print) {
  options.add_options()("help,h", "show this help");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    if (vm.count("help")) {
      if (print)
        std::cout << "usage: mergepipe " << command << " " << synopsis << "\n\n" << options << "\n";
      return std::nullopt;
    }
    reject_options_taken_as_values(command, options, vm);
    po::notify(vm);
  } catch (const po::error& e) {
    // Every rank parses the same arguments and fails alike: a collective failure already, so
    // rank 0 alone reports it and no rank aborts the job.
    throw mpi::CollectiveError(
        ExitCode::kUsage, command + ": " + e.what() + " (see 'mergepipe " + command + " --help')",
        0);
  } catch (const UsageError& e) {
    throw mpi::CollectiveError(ExitCode::kUsage, e.what(), 0);
  }
  return vm;
}

std::uint64_t parse_mergekit_size(const std::string& text, const std::string& what) {
  std::string digits = text;
  std::uint64_t unit = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'k':
      case 'K':
        unit = 1000;
        break;
      case 'm':
      case 'M':
        unit = 1000 * 1000;
        break;
      case 'b':
      case 'B':
        unit = 1000 * 1000 * 1000;
        break;
      default:
        break;
    }
    if (unit != 1) digits.pop_back();
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      digits.size() > 12) {
    throw UsageError(what + " '" + text +
                     "': expected a whole number with an optional K, M or B (thousand, million, "
                     "billion), as mergekit: 5B, 500M");
  }
  const std::uint64_t n = std::stoull(digits) * unit;
  if (n == 0) throw UsageError(what + " '" + text + "': a shard holds at least one byte");
  return n;
}

}  // namespace mergepipe::app
