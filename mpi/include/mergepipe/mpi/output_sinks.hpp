#pragma once
// OutputSinks that write a rank's merged blocks into files shared by all ranks.
#include <memory>
#include <string>
#include <vector>

#include "mergepipe/executor.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/mpi/comm.hpp"
#include "mergepipe/mpi/mpi_file.hpp"

namespace mergepipe::mpi {

// safetensors shards via MPI-IO: collective open of every shard, rank 0 writes the headers,
// every rank writes its blocks at offsets fixed by the layout (independent explicit-offset
// writes), then a collective set_size + sync + close.
class SafetensorsSink : public OutputSink {
 public:
  SafetensorsSink(const Comm& comm, const io::OutputLayout& layout, const std::string& dir,
                  const InfoHints& hints);
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override;
  void finish();  // collective

 private:
  const io::OutputLayout& layout_;
  std::vector<std::unique_ptr<MpiFile>> files_;
};

// One parallel-HDF5 file, one contiguous dataset per tensor, created collectively with
// identical arguments on every rank; blocks are written as hyperslabs.
class Hdf5Sink : public OutputSink {
 public:
  Hdf5Sink(const Comm& comm, const std::vector<TensorInfo>& tensors, const std::string& path);
  ~Hdf5Sink() override;
  void write(std::uint32_t tensor, std::uint64_t elem_begin,
             std::span<const std::byte> bytes) override;
  void finish();  // collective

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mergepipe::mpi
