#include "output_style.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"

namespace mergepipe::app {

namespace {

bool is_terminal_path(const std::string& target) {
  return target.rfind("/dev/pts/", 0) == 0 || target.rfind("/dev/tty", 0) == 0;
}

// Under mpirun a rank's stderr is a pipe to the launcher even in an interactive shell, so look
// at where the launcher's own stderr goes (Linux /proc; the local ranks are its children).
bool stderr_reaches_terminal() {
  if (::isatty(STDERR_FILENO)) return true;
  std::error_code ec;
  const auto parent =
      std::filesystem::read_symlink("/proc/" + std::to_string(::getppid()) + "/fd/2", ec);
  return !ec && is_terminal_path(parent.string());
}

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

struct Figures {
  double fraction, rate, eta;
};
Figures figures(const ProgressSnapshot& p) {
  const double done = static_cast<double>(p.done_bytes);
  const double total = static_cast<double>(p.total_bytes);
  const double rate = p.elapsed_seconds > 0 ? done / p.elapsed_seconds : 0;
  return {total > 0 ? std::min(1.0, done / total) : 1.0, rate,
          rate > 0 ? (total - done) / rate : -1.0};
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / 1e9);
  return buf;
}

// A bar redrawn in place at most five times a second.
class TerminalBar : public ProgressListener {
 public:
  void update(const ProgressSnapshot& p) override {
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    draw(p);
  }
  void finish(const ProgressSnapshot& p, bool success) override {
    draw(p);
    std::fprintf(stderr, success ? "\n" : "  (stopped)\n");
    std::fflush(stderr);
  }

 private:
  void draw(const ProgressSnapshot& p) {
    constexpr int kWidth = 28;
    const Figures f = figures(p);
    const int filled = static_cast<int>(f.fraction * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %3.0f%%  %s/%s GB  %s GB/s  ETA %s  ", p.phase.c_str(),
                 bar.c_str(), 100 * f.fraction, gb(static_cast<double>(p.done_bytes)).c_str(),
                 gb(static_cast<double>(p.total_bytes)).c_str(), gb(f.rate).c_str(),
                 clock_text(f.eta).c_str());
    std::fflush(stderr);
    drawn_ = true;
  }
  std::chrono::steady_clock::time_point last_{};
  bool drawn_ = false;
};

// One line every `interval` seconds: what a log file (a Slurm job's output) wants.
class LogLines : public ProgressListener {
 public:
  LogLines(double interval, bool json) : interval_(interval), json_(json) {}
  void update(const ProgressSnapshot& p) override {
    if (p.elapsed_seconds < next_) return;
    next_ = p.elapsed_seconds + interval_;
    print(p, "progress");
  }
  void finish(const ProgressSnapshot& p, bool success) override {
    print(p, success ? "done" : "stopped");
  }

 private:
  void print(const ProgressSnapshot& p, const char* state) {
    const Figures f = figures(p);
    if (json_) {
      print_json_line(
          {{"event", "progress"},
           {"phase", p.phase},
           {"state", state},
           {"done_bytes", p.done_bytes},
           {"total_bytes", p.total_bytes},
           {"fraction", f.fraction},
           {"bytes_per_second", f.rate},
           {"eta_seconds", f.eta < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(f.eta)},
           {"elapsed_seconds", p.elapsed_seconds},
           {"ranks", p.ranks},
           {"ranks_finished", p.ranks_finished}});
      return;
    }
    std::fprintf(stderr, "mergepipe: %s %5.1f%% | %s of %s GB | %s GB/s | ETA %s | elapsed %s%s\n",
                 p.phase.c_str(), 100 * f.fraction, gb(static_cast<double>(p.done_bytes)).c_str(),
                 gb(static_cast<double>(p.total_bytes)).c_str(), gb(f.rate).c_str(),
                 clock_text(f.eta).c_str(), clock_text(p.elapsed_seconds).c_str(),
                 std::string(state) == "progress" ? "" : (std::string(" | ") + state).c_str());
    std::fflush(stderr);
  }
  const double interval_;
  const bool json_;
  double next_ = 0;
};

}  // namespace

void add_output_options(po::options_description& desc, OutputStyleText& text) {
  desc.add_options()("quiet", po::bool_switch(&text.quiet), "print nothing on success")(
      "log-format", po::value(&text.log_format)->default_value("text"),
      "text, or json: progress and the result as JSON lines on stdout, errors as JSON on stderr")(
      "progress", po::value(&text.progress)->default_value("auto"),
      "auto (a bar on a terminal, lines otherwise), bar, lines or none")(
      "progress-interval", po::value(&text.interval_seconds)->default_value(5.0),
      "seconds between progress lines in a log (lines, json)");
}

OutputStyle parse_output_style(const OutputStyleText& text, const std::string& command) {
  OutputStyle style;
  style.quiet = text.quiet;
  if (text.log_format != "text" && text.log_format != "json")
    throw UsageError(command + ": --log-format must be text or json");
  style.json = text.log_format == "json";
  if (text.progress == "auto") {
    style.progress = ProgressMode::kAuto;
  } else if (text.progress == "bar") {
    style.progress = ProgressMode::kBar;
  } else if (text.progress == "lines") {
    style.progress = ProgressMode::kLines;
  } else if (text.progress == "none") {
    style.progress = ProgressMode::kNone;
  } else {
    throw UsageError(command + ": --progress must be auto, bar, lines or none");
  }
  if (!(text.interval_seconds > 0) || text.interval_seconds > 86400)
    throw UsageError(command + ": --progress-interval must be a number of seconds > 0");
  style.interval_seconds = text.interval_seconds;
  return style;
}

bool wants_json_log(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--log-format=json") return true;
    if (args[i] == "--log-format" && i + 1 < args.size() && args[i + 1] == "json") return true;
  }
  return false;
}

std::unique_ptr<ProgressListener> make_progress_display(const OutputStyle& style, bool root) {
  if (!root || style.quiet || style.progress == ProgressMode::kNone) return nullptr;
  if (style.json) return std::make_unique<LogLines>(style.interval_seconds, true);
  const bool bar = style.progress == ProgressMode::kBar ||
                   (style.progress == ProgressMode::kAuto && stderr_reaches_terminal());
  if (bar) return std::make_unique<TerminalBar>();
  return std::make_unique<LogLines>(style.interval_seconds, false);
}

void print_warning(const OutputStyle& style, const std::string& message) {
  if (style.quiet) return;
  if (style.json) {
    print_json_line({{"event", "warning"}, {"message", message}});
    return;
  }
  std::fprintf(stderr, "mergepipe: warning: %s\n", message.c_str());
  std::fflush(stderr);
}

void print_json_line(const nlohmann::ordered_json& event, bool to_stderr) {
  std::FILE* out = to_stderr ? stderr : stdout;
  // Invalid UTF-8 from hostile input (a tensor name) is replaced, never thrown.
  const std::string text =
      event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::fprintf(out, "%s\n", text.c_str());
  std::fflush(out);
}

}  // namespace mergepipe::app
