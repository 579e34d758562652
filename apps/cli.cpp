#include "cli.hpp"

#include <iostream>

#include "mergepipe/error.hpp"

namespace mergepipe::app {

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
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(command + ": " + e.what() + " (see 'mergepipe " + command + " --help')");
  }
  return vm;
}

}  // namespace mergepipe::app
