#pragma once
// How a long-running subcommand talks to its user on rank 0: a live progress bar on a terminal,
// periodic plain lines in a log file (Slurm), JSON lines for pipelines, or nothing (--quiet).
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "mergepipe/progress.hpp"

namespace mergepipe::app {

enum class ProgressMode { kAuto, kBar, kLines, kNone };

struct OutputStyle {
  bool quiet = false;  // nothing on success: no progress, no summary
  bool json = false;   // --log-format json: progress and summary as JSON lines
  ProgressMode progress = ProgressMode::kAuto;
  double interval_seconds = 5.0;  // between progress lines (lines and JSON)
};

// Adds --quiet, --log-format, --progress and --progress-interval to `desc`, bound to `text`.
struct OutputStyleText {
  bool quiet = false;
  std::string log_format = "text";
  std::string progress = "auto";
  double interval_seconds = 5.0;
};
void add_output_options(po::options_description& desc, OutputStyleText& text);
// Validates the options (UsageError naming the command).
OutputStyle parse_output_style(const OutputStyleText& text, const std::string& command);

// True when argv asks for JSON logs, so main() can print errors as JSON even when the options
// themselves fail to parse.
bool wants_json_log(const std::vector<std::string>& args);

// The progress display for rank 0 (nullptr for --quiet, --progress none, or other ranks).
// kAuto picks the bar when rank 0's stderr, or that of the mpirun that started it, is a
// terminal, and plain lines otherwise.
std::unique_ptr<ProgressListener> make_progress_display(const OutputStyle& style, bool root);

// A warning from rank 0: a line on stderr, a {"event": "warning"} line with --log-format json,
// nothing with --quiet.
void print_warning(const OutputStyle& style, const std::string& message);

// One JSON object per line, for --log-format json: events on stdout, errors on stderr.
void print_json_line(const nlohmann::ordered_json& event, bool to_stderr = false);

}  // namespace mergepipe::app
