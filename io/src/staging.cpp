#include "mergepipe/io/staging.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/folder_lock.hpp"

namespace mergepipe::io {

namespace fs = std::filesystem;

namespace {
constexpr const char* kReplacedSuffix = ".replaced";
constexpr const char* kResumeName = "mergepipe.resume.json";
constexpr const char* kResumeFormat = "mergepipe-resume-1";

// Files of the staging folder that are bookkeeping, not output.
bool is_bookkeeping(const std::string& name) {
  return name == kFolderLockName || name == kResumeName || name.rfind("journal-", 0) == 0;
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
  if (fs::exists(fs::symlink_status(target_, ec)) && !replace_) {
    throw UsageError(target_ + ": output folder already exists (pass --force to replace it)");
  }
  const fs::path parent = fs::path(path_).parent_path();
  if (!fs::is_directory(parent, ec))
    throw IoError(parent.string() + ": output parent folder does not exist");
  // A symbolic link planted at the staging path would have us write, and on failure delete,
  // through it: never follow one (mkdir does not; the checks below refuse it).
  const std::string keep_path = path_;
  path_.clear();  // not ours until locked: never remove it
  refuse_link_or_non_folder(keep_path, "staging folder");
  if (::mkdir(keep_path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw IoError(keep_path + ": cannot create staging folder: " + std::strerror(errno));
  }
  lock_.emplace(keep_path, target_ + ": another merge is writing this output right now");
  path_ = keep_path;
  // From here on the folder is ours: a failure (a full disk while writing the resume record)
  // removes it again, as the destructor of a constructed folder would.
  try {
    reclaim_replaced();
    if (fs::exists(fs::symlink_status(target_, ec)) && !replace_) {
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
        if (entry.path().filename() != kFolderLockName) fs::remove_all(entry.path());
      }
      if (!options.resume_key.empty())
        write_text_file(record_path, resume_record(options.resume_key));
    }
  } catch (...) {
    remove_tree(path_);
    lock_.reset();
    throw;
  }
}

// A run killed between the two renames of a publish without RENAME_EXCHANGE left the old output
// at `<staging>.replaced` and nothing at the target: put it back (the target then holds the old
// output, as if the killed run had never published), or remove it when the target exists.
void StagingFolder::reclaim_replaced() {
  const std::string replaced = path_ + kReplacedSuffix;
  struct stat st {};
  if (::lstat(replaced.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    (void)::unlink(replaced.c_str());  // a link or a file: removes the entry, never its target
    return;
  }
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(target_, ec)) &&
      ::rename(replaced.c_str(), target_.c_str()) == 0) {
    sync_directory(fs::path(path_).parent_path().string());
    return;
  }
  remove_tree(replaced);
}

StagingFolder::~StagingFolder() {
  if (!published_ && !path_.empty()) remove_tree(path_);
}

void StagingFolder::publish_exactly(const std::set<std::string>& names) {
  std::vector<fs::path> strays;
  for (const auto& entry : fs::directory_iterator(path_)) {
    const std::string name = entry.path().filename().string();
    if (!is_bookkeeping(name) && !names.count(name)) strays.push_back(entry.path());
  }
  for (const fs::path& p : strays) remove_tree(p.string());
  publish();
}

void StagingFolder::publish() {
  for (const auto& entry : fs::directory_iterator(path_)) {
    const std::string name = entry.path().filename().string();
    if (name != kFolderLockName && is_bookkeeping(name)) fs::remove(entry.path());
  }
  for (const auto& entry : fs::directory_iterator(path_)) {
    if (entry.is_regular_file() && entry.path().filename() != kFolderLockName) {
      File(entry.path().string(), File::Mode::kRead).sync();
    }
  }
  // The lock file stays, and stays locked, through the rename: a second merge arriving meanwhile
  // must find the staging folder locked, not take it over. It is removed from the published
  // folder afterwards.
  sync_directory(path_);
  const std::string parent =
      fs::path(target_).has_parent_path() ? fs::path(target_).parent_path().string() : ".";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target_, ec))) {
    if (!replace_)
      throw UsageError(target_ +
                       ": output folder appeared while merging (pass --force to replace it)");
    refuse_link_or_non_folder(target_, "output");
    publish_replacing(parent);
  } else if (::rename(path_.c_str(), target_.c_str()) != 0) {
    throw IoError(target_ + ": cannot publish the output folder: " + std::strerror(errno));
  }
  published_ = true;
  lock_->release();
  (void)::unlink((target_ + "/" + kFolderLockName).c_str());
  sync_directory(target_);
  sync_directory(parent);
}

// The target always holds the old or the new output: the two folders trade places in one
// rename where the file system can (RENAME_EXCHANGE), and the old one, now at the staging path,
// is removed. Elsewhere the old one is moved aside first (a kill in between is repaired by the
// next run: reclaim_replaced).
void StagingFolder::publish_replacing(const std::string& parent) {
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    sync_directory(parent);
    remove_tree(path_);
    return;
  }
  const int exchange_errno = errno;
  if (exchange_errno != EINVAL && exchange_errno != ENOSYS && exchange_errno != ENOTSUP)
    throw IoError(target_ + ": cannot replace the old output: " + std::strerror(exchange_errno));
  const std::string displaced = path_ + kReplacedSuffix;
  remove_tree(displaced);
  if (::rename(target_.c_str(), displaced.c_str()) != 0)
    throw IoError(target_ + ": cannot move the old output aside: " + std::strerror(errno));
  if (::rename(path_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    (void)::rename(displaced.c_str(), target_.c_str());
    throw IoError(target_ + ": cannot publish the output folder: " + std::strerror(err));
  }
  sync_directory(parent);
  remove_tree(displaced);
}

}  // namespace mergepipe::io
