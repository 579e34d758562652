#include "mergepipe/io/folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "mergepipe/error.hpp"

namespace mergepipe::io {

void refuse_link_or_non_folder(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode)) {
    throw UsageError(path + ": " + what +
                     " is a symbolic link; refusing to follow it (remove the link)");
  }
  if (!S_ISDIR(st.st_mode))
    throw UsageError(path + ": " + what + " exists and is not a folder (remove it)");
}

bool holds_only_the_lock(const std::string& folder) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec))
    if (entry.path().filename() != kFolderLockName) return false;
  return !ec;
}

FolderLock::FolderLock(const std::string& folder, const std::string& busy)
    : lock_path_(folder + "/" + kFolderLockName) {
  refuse_link_or_non_folder(folder, "folder to lock");
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) throw IoError(folder + ": cannot open folder: " + std::strerror(errno));
  fd_ = ::openat(dir, kFolderLockName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  const int open_errno = errno;
  ::close(dir);
  if (fd_ < 0) {
    throw open_errno == ELOOP
        ? Error(ExitCode::kUsage, lock_path_ + ": is a symbolic link; refusing to follow it")
        : Error(ExitCode::kIo, lock_path_ + ": cannot create lock: " + std::strerror(open_errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw IoError(busy + " (lock held on " + lock_path_ + ")");
  }
  // The folder may have been renamed away (published, replaced) between our open and our flock:
  // then the path no longer holds the file we locked.
  struct stat held {
  }, here{};
  if (::fstat(fd_, &held) != 0 || ::lstat(lock_path_.c_str(), &here) != 0 ||
      held.st_ino != here.st_ino || held.st_dev != here.st_dev) {
    ::close(fd_);
    fd_ = -1;
    throw IoError(busy + " (the folder was replaced while this run started)");
  }
}

FolderLock::~FolderLock() {
  release();
}

void FolderLock::release() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace mergepipe::io
