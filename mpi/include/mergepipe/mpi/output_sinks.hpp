#pragma once
// OutputSinks that write a rank's merged blocks into files shared by all ranks.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mergepipe/executor.hpp"
#include "mergepipe/io/async_writer.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/mpi/mpi_file.hpp"

namespace mergepipe::mpi {

// Where an output element's bytes lie on disk (the resume check reads them back from there).
struct OutputLocation {
  std::string path;
  std::uint64_t offset = 0;
};

// The output of a merge, written in place by every rank into files shared by all ranks.
class StagedOutput : public OutputSink {
 public:
  virtual OutputLocation locate(std::uint32_t tensor, std::uint64_t elem_begin) const = 0;
  virtual void finish() = 0;  // collective, on success only
};

// safetensors shards: collective MPI-IO open of every shard (creation, hints), rank 0 reserves
// every shard's blocks (fallocate) and writes the headers, every rank writes its blocks at
// offsets fixed by the layout from a writer thread (io::AsyncFileWriter: positioned POSIX
// writes, whole pages O_DIRECT as `output_io` says, early writeback), then fdatasync and a
// collective set_size + sync + close.
// Opening an existing shard (a resumed run) keeps its bytes. Up to kWriteQueueBytes of blocks
// (`largest_write` bytes or fewer each) wait for the writer thread.
class SafetensorsSink : public StagedOutput {
 public:
  // A full-read TIES merges a held share in a burst, faster than the device writes while it is
  // also reading the next share: with 4 blocks (16 MiB) queued, its merging thread waited
  // 1.4-1.8 s of a 7.5-8.4 s run (cold K = 10) for the writer, with 64 MiB 0.5-1.0 s.
  static constexpr std::uint64_t kWriteQueueBytes = std::uint64_t{64} << 20;

  SafetensorsSink(const Comm& comm, const io::OutputLayout& layout, const std::string& dir,
                  const InfoHints& hints, io::OutputIo output_io, std::uint64_t largest_write);
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override;
  OutputLocation locate(std::uint32_t tensor, std::uint64_t elem_begin) const override;
  void finish() override;
  // After finish(): this rank's bytes written with O_DIRECT.
  std::uint64_t direct_bytes() const noexcept { return direct_bytes_; }

 private:
  const Comm& comm_;
  const io::OutputLayout& layout_;
  std::string dir_;
  std::vector<std::unique_ptr<MpiFile>> files_;
  std::unique_ptr<io::AsyncFileWriter> writer_;
  std::uint64_t direct_bytes_ = 0;
};

// One parallel-HDF5 file, one contiguous dataset per tensor, created collectively with
// identical arguments on every rank (or, for a resumed run, reopened: `reopen`); blocks are
// written as hyperslabs.
class Hdf5Sink : public StagedOutput {
 public:
  Hdf5Sink(const Comm& comm, const std::vector<TensorInfo>& tensors, const std::string& path,
           const InfoHints& hints, bool reopen = false);
  ~Hdf5Sink() override;
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override;
  OutputLocation locate(std::uint32_t tensor, std::uint64_t elem_begin) const override;
  void finish() override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mergepipe::mpi
