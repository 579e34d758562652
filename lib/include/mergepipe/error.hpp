#pragma once
// Error types. Everything below apps/ throws these; apps/ turns one into a single line and an
// exit code (SPEC §4: 2 usage/config, 3 input data, 4 I/O failure).
#include <stdexcept>
#include <string>

namespace mergepipe {

enum class ExitCode : int { kOk = 0, kInternal = 1, kUsage = 2, kInputData = 3, kIo = 4 };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// Bad command line, config file, budget or parameter.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(ExitCode::kUsage, message) {}
};

// Bad or inconsistent checkpoint, catalog or manifest content (including a stale catalog).
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(ExitCode::kInputData, message) {}
};

// The storage failed: open/read/write/fsync/rename errors, full disk, permissions.
class IoError : public Error {
 public:
  explicit IoError(const std::string& message) : Error(ExitCode::kIo, message) {}
};

}  // namespace mergepipe
