#include "mergepipe/io/staging.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"

namespace mergepipe::io {

namespace fs = std::filesystem;

namespace {
constexpr const char* kLockName = ".mergepipe.lock";
constexpr const char* kResumeName = "mergepipe.resume.json";
constexpr const char* kResumeFormat = "mergepipe-resume-1";

// Files of the staging folder that are bookkeeping, not output.
bool is_bookkeeping(const std::string& name) {
  return name == kLockName || name == kResumeName || name.rfind("journal-", 0) == 0;
}

std::string resume_record(const std::string& key) {
  return std::string("{\"format\": \"") + kResumeFormat + "\", \"task\": \"" + key + "\"}\n";
}

std::string normalized(const std::string& target) {
  std::string t = target;
  while (t.size() > 1 && t.back() == '/') t.pop_back();
  return t;
}
}  // namespace

std::string staging_path_for(const std::string& target) {
  const fs::path t(normalized(target));
  const fs::path parent = t.has_parent_path() ? t.parent_path() : fs::path(".");
  return (parent / ("." + t.filename().string() + ".mergepipe-staging")).string();
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

void copy_file(const std::string& from, const std::string& to) {
  write_text_file(to, read_text_file(from));
}

StagingFolder::StagingFolder(const std::string& target, const StagingOptions& options)
    : target_(normalized(target)), path_(staging_path_for(target)), replace_(options.replace) {
  std::error_code ec;
  if (fs::exists(target_, ec) && !replace_) {
    throw UsageError(target_ + ": output folder already exists (pass --force to replace it)");
  }
  const fs::path parent = fs::path(path_).parent_path();
  if (!fs::is_directory(parent, ec))
    throw IoError(parent.string() + ": output parent folder does not exist");
  if (::mkdir(path_.c_str(), 0755) != 0 && errno != EEXIST) {
    throw IoError(path_ + ": cannot create staging folder: " + std::strerror(errno));
  }
  const std::string lock_path = path_ + "/" + kLockName;
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw IoError(lock_path + ": cannot create lock: " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    path_.clear();  // not ours: never remove it
    throw IoError(target_ + ": another merge is writing this output right now (lock held on " +
                  lock_path + ")");
  }
  // The lock may belong to a folder another merge has just published (renamed away) between our
  // open and our flock: then the staging path no longer holds our lock file.
  struct stat held {
  }, here{};
  if (::fstat(lock_fd_, &held) != 0 || ::stat(lock_path.c_str(), &here) != 0 ||
      held.st_ino != here.st_ino || held.st_dev != here.st_dev) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    path_.clear();
    throw IoError(target_ + ": another merge published this output while this one started");
  }
  // From here on the folder is ours: a failure (a full disk while writing the resume record)
  // removes it again, as the destructor of a constructed folder would.
  try {
    if (fs::exists(target_, ec) && !replace_) {
      throw UsageError(target_ + ": output folder already exists (pass --force to replace it)");
    }
    // A leftover from a killed run: keep it when it holds this very task, else start clean (keep
    // our lock file).
    const std::string record_path = path_ + "/" + kResumeName;
    if (options.resume && !options.resume_key.empty() && fs::exists(record_path, ec)) {
      resumed_ = read_text_file(record_path) == resume_record(options.resume_key);
    }
    if (!resumed_) {
      for (const auto& entry : fs::directory_iterator(path_)) {
        if (entry.path().filename() != kLockName) fs::remove_all(entry.path());
      }
      if (!options.resume_key.empty())
        write_text_file(record_path, resume_record(options.resume_key));
    }
  } catch (...) {
    remove_tree(path_);
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
}

StagingFolder::~StagingFolder() {
  if (!published_ && !path_.empty()) remove_tree(path_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void StagingFolder::publish() {
  for (const auto& entry : fs::directory_iterator(path_)) {
    const std::string name = entry.path().filename().string();
    if (name != kLockName && is_bookkeeping(name)) fs::remove(entry.path());
  }
  for (const auto& entry : fs::directory_iterator(path_)) {
    if (entry.is_regular_file() && entry.path().filename() != kLockName) {
      File(entry.path().string(), File::Mode::kRead).sync();
    }
  }
  // The lock file stays, and stays locked, through the rename: a second merge arriving meanwhile
  // must find the staging folder locked, not take it over. It is removed from the published
  // folder afterwards.
  sync_directory(path_);
  std::error_code ec;
  std::string displaced;
  if (fs::exists(target_, ec)) {
    if (!replace_)
      throw UsageError(target_ +
                       ": output folder appeared while merging (pass --force to replace it)");
    displaced = path_ + ".replaced";
    remove_tree(displaced);
    if (::rename(target_.c_str(), displaced.c_str()) != 0)
      throw IoError(target_ + ": cannot move the old output aside: " + std::strerror(errno));
  }
  if (::rename(path_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    if (!displaced.empty()) (void)::rename(displaced.c_str(), target_.c_str());
    throw IoError(target_ + ": cannot publish the output folder: " + std::strerror(err));
  }
  published_ = true;
  (void)::unlink((target_ + "/" + kLockName).c_str());
  sync_directory(target_);
  sync_directory(fs::path(target_).has_parent_path() ? fs::path(target_).parent_path().string()
                                                     : ".");
  if (!displaced.empty()) remove_tree(displaced);
}

}  // namespace mergepipe::io
