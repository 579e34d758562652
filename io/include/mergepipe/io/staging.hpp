#pragma once
// Atomic publication of an output folder (SPEC §2): everything is written under a staging folder
// next to the target, fsynced, then renamed onto the target. A failed or killed run never leaves
// a folder at the target path. An exclusive lock inside the staging folder makes a second merge
// to the same target fail cleanly instead of interleaving with the first.
#include <string>

namespace mergepipe::io {

class StagingFolder {
 public:
  // Refuses an existing target unless `replace` (UsageError). Creates (or reclaims a leftover)
  // `<parent>/.<name>.mergepipe-staging` and locks it (IoError if another process holds it).
  StagingFolder(const std::string& target, bool replace);
  ~StagingFolder();  // removes the staging folder unless published
  StagingFolder(const StagingFolder&) = delete;
  StagingFolder& operator=(const StagingFolder&) = delete;

  const std::string& path() const noexcept { return path_; }
  const std::string& target() const noexcept { return target_; }
  // fsyncs every file and the folder, renames it onto the target (replacing an existing target
  // when allowed), fsyncs the parent.
  void publish();

 private:
  std::string target_, path_;
  bool replace_ = false;
  bool published_ = false;
  int lock_fd_ = -1;
};

// Path of the staging folder for a target (without creating it).
std::string staging_path_for(const std::string& target);
// Removes a folder tree (no error if absent).
void remove_tree(const std::string& path);
// Copies a file (small files: tokenizer, generation config), fsyncs the copy.
void copy_file(const std::string& from, const std::string& to);

}  // namespace mergepipe::io
