#pragma once
// Atomic publication of an output folder (SPEC §2): everything is written under a staging folder
// next to the target, fsynced, then renamed onto the target. A failed or killed run never leaves
// a folder at the target path. An exclusive lock inside the staging folder makes a second merge
// to the same target fail cleanly instead of interleaving with the first.
//
// Resume: the staging folder records which task it holds (`mergepipe.resume.json`). A run that
// was killed leaves its staging folder behind; the next run of the same task (same resume key)
// keeps what is there and continues (io/resume_journal.hpp), any other task starts it afresh. A
// run that fails with an error removes its staging folder.
#include <optional>
#include <set>
#include <string>

#include "mergepipe/io/folder_lock.hpp"

namespace mergepipe::io {

struct StagingOptions {
  bool replace = false;    // an existing target is replaced on publish (else a UsageError)
  bool resume = true;      // keep a leftover staging folder of the same task
  std::string resume_key;  // identity of the task (empty: never resume)
};

class StagingFolder {
 public:
  // Refuses an existing target unless `replace` (UsageError). Creates (or reclaims a leftover)
  // `<parent>/.<name>.mergepipe-staging` and locks it (IoError if another process holds it).
  StagingFolder(const std::string& target, const StagingOptions& options);
  StagingFolder(const std::string& target, bool replace)
      : StagingFolder(target, StagingOptions{replace, false, ""}) {}
  ~StagingFolder();  // removes the staging folder unless published
  StagingFolder(const StagingFolder&) = delete;
  StagingFolder& operator=(const StagingFolder&) = delete;

  const std::string& path() const noexcept { return path_; }
  const std::string& target() const noexcept { return target_; }
  // True when a leftover of the same task was kept: its journals say what is already done.
  bool resumed() const noexcept { return resumed_; }
  // Removes the resume bookkeeping, fsyncs every file and the folder, renames it onto the target
  // (replacing an existing target when allowed: the target holds the old output or the new one
  // at every instant), fsyncs the parent.
  void publish();
  // publish() of exactly the files named (names inside the folder): anything else in it is
  // removed first, such as the lock files Open MPI's MPI-IO leaves beside a shared file when a
  // run spanning nodes is killed (`model.safetensors-<job>-<pid>.lock`). So the target holds
  // what an uninterrupted run writes, whatever a killed one left.
  void publish_exactly(const std::set<std::string>& names);

 private:
  void reclaim_replaced();
  void publish_replacing(const std::string& parent);

  std::string target_, path_;
  bool replace_ = false;
  bool published_ = false;
  bool resumed_ = false;
  std::optional<FolderLock> lock_;
};

// Path of the staging folder for a target (without creating it).
std::string staging_path_for(const std::string& target);
// Removes a folder tree (no error if absent).
void remove_tree(const std::string& path);
// Copies a file (small files: tokenizer, generation config), fsyncs the copy.
void copy_file(const std::string& from, const std::string& to);

}  // namespace mergepipe::io
