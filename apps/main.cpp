// mergepipe: budgeted, distributed merging of LLM checkpoint families.
// Wires subcommands; turns every error into one line on rank 0 and an exit code (SPEC §4).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "commands.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/mpi/comm.hpp"
#include "output_style.hpp"

namespace {

using mergepipe::app::CommandContext;

struct Command {
  int (*run)(CommandContext&);
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"synth", {mergepipe::app::cmd_synth, "generate a synthetic checkpoint family"}},
      {"inspect",
       {mergepipe::app::cmd_inspect, "describe a checkpoint, catalog, plan or manifest"}},
      {"catalog", {mergepipe::app::cmd_catalog, "build or extend a family's block catalog"}},
      {"plan", {mergepipe::app::cmd_plan, "choose the expert blocks to read under a budget"}},
      {"merge", {mergepipe::app::cmd_merge, "run a budgeted merge"}},
      {"replay", {mergepipe::app::cmd_replay, "re-run a merge from its manifest"}},
      {"verify", {mergepipe::app::cmd_verify, "compare merged models or check output hashes"}},
  };
  return table;
}

void print_usage(std::FILE* out) {
  std::fprintf(
      out, "usage: mergepipe <command> [options]   (mergepipe <command> --help)\n\ncommands:\n");
  for (const auto& [name, cmd] : commands())
    std::fprintf(out, "  %-9s %s\n", name.c_str(), cmd.summary);
}

// Levenshtein distance, for "did you mean" on a mistyped command.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The command closest to `typed`, when it is close enough to be a typo.
std::string closest_command(const std::string& typed) {
  std::string best;
  std::size_t best_distance = 3;  // at most two edits
  for (const auto& [name, cmd] : commands()) {
    const std::size_t d = edit_distance(typed, name);
    if (d < best_distance) best = name, best_distance = d;
  }
  return best;
}

// Errors are printed as exactly one line: control characters from hostile input (a tensor name
// holding a newline, say) are shown escaped.
std::string one_line(const char* message) {
  std::string out;
  for (const char* p = message; *p; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += *p;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  mergepipe::mpi::Environment env(argc, argv);
  mergepipe::mpi::Comm comm = mergepipe::mpi::Comm::world();
  const bool root = comm.is_root();

  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    if (root) print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0) {
    if (root) std::printf("mergepipe %s\n", MERGEPIPE_VERSION);
    return 0;
  }
  // `help` alone lists the commands; `help CMD` is `CMD --help`.
  const bool help = std::strcmp(argv[1], "help") == 0;
  if (help && argc == 2) {
    if (root) print_usage(stdout);
    return 0;
  }
  const std::string name = argv[help ? 2 : 1];
  auto it = commands().find(name);
  if (it == commands().end()) {
    if (root) {
      const std::string guess = closest_command(name);
      std::fprintf(stderr, "mergepipe: error: unknown command '%s'%s\n",
                   one_line(name.c_str()).c_str(),
                   guess.empty() ? "" : (" (did you mean '" + guess + "'?)").c_str());
      print_usage(stderr);
    }
    return 2;
  }
  CommandContext ctx{
      help ? std::vector<std::string>{"--help"} : std::vector<std::string>(argv + 2, argv + argc),
      comm};
  const bool json = mergepipe::app::wants_json_log(ctx.args);
  // One line on stderr: plain text, or a JSON object for --log-format json.
  auto report = [&](const char* kind, const char* message, int code) {
    if (json) {
      mergepipe::app::print_json_line(
          {{"event", "error"}, {"command", name}, {"code", code}, {"message", message}}, true);
    } else {
      std::fprintf(stderr, "mergepipe: %s: %s\n", kind, one_line(message).c_str());
      std::fflush(stderr);
    }
  };
  try {
    return it->second.run(ctx);
  } catch (const mergepipe::mpi::CollectiveError& e) {
    // Every rank knows; rank 0 speaks for the job.
    if (root) report("error", e.what(), static_cast<int>(e.code()));
    return static_cast<int>(e.code());
  } catch (const mergepipe::Error& e) {
    // Only this rank knows: report it and take the job down so no rank waits forever.
    report("error", e.what(), static_cast<int>(e.code()));
    if (comm.size() > 1) MPI_Abort(MPI_COMM_WORLD, static_cast<int>(e.code()));
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    report("internal error", e.what(), 1);
    if (comm.size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
