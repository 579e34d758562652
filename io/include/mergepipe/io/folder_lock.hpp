#pragma once
// An exclusive advisory lock (flock) on `<folder>/.mergepipe.lock`, the lock a merge's staging
// folder and a catalog being written both take: a second writer of the same folder fails at once
// (IoError, exit 4) instead of interleaving with the first. Neither the folder nor the lock file
// is followed if it is a symbolic link.
#include <string>

namespace mergepipe::io {

inline constexpr const char* kFolderLockName = ".mergepipe.lock";

class FolderLock {
 public:
  // `busy` is the message when another process holds the lock ("out: another merge is writing
  // this output right now"); the lock file's path is appended.
  FolderLock(const std::string& folder, const std::string& busy);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::string& path() const noexcept { return lock_path_; }
  // Closes the lock without removing the file (the folder was renamed and is gone from here).
  void release() noexcept;

 private:
  std::string lock_path_;
  int fd_ = -1;
};

// True when `folder` holds nothing but a lock file (left by a writer killed before it wrote).
bool holds_only_the_lock(const std::string& folder);

// UsageError when `path` exists and is a symbolic link or not a folder: writers never follow a
// link at a path they create or reclaim.
void refuse_link_or_non_folder(const std::string& path, const std::string& what);

}  // namespace mergepipe::io
