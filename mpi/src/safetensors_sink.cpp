#include <algorithm>

#include "mergepipe/error.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/mpi/output_sinks.hpp"

namespace mergepipe::mpi {

// Every step between collectives runs under capture_failure + Comm::check: a rank that failed
// alone (rank 0's header write on a full disk) must not leave the others waiting in the next
// collective, nor unwind into a collective close they never reach.
SafetensorsSink::SafetensorsSink(const Comm& comm, const io::OutputLayout& layout,
                                 const std::string& dir, const InfoHints& hints,
                                 io::OutputIo output_io, std::uint64_t largest_write)
    : comm_(comm), layout_(layout), dir_(dir) {
  for (std::size_t s = 0; s < layout.shards.size(); ++s) {
    const std::string path = dir + "/" + layout.shard_names[s];
    comm.check(capture_failure(
                   [&] { files_.push_back(std::make_unique<MpiFile>(comm, path, true, hints)); }),
               "open the output shards");
  }
  comm.check(capture_failure([&] {
               if (!comm.is_root()) return;
               for (std::size_t s = 0; s < layout.shards.size(); ++s) {
                 // Every block of the shard reserved up front: a disk too small fails now, not
                 // after minutes of merging, and the ranks' direct writes land on allocated
                 // blocks inside the file (ext4 then lets them run side by side).
                 io::File(dir + "/" + layout.shard_names[s], io::File::Mode::kReadWrite)
                     .preallocate(layout.shards[s].file_size);
                 const std::string& header = layout.shards[s].header_bytes;
                 files_[s]->write_at(0, std::as_bytes(std::span(header.data(), header.size())));
                 io::global_byte_counters().add(io::ByteCategory::kOutputWritten, header.size());
               }
             }),
             "write the shard headers");
  // Block bytes go through POSIX writes on a writer thread (as MPI-IO's independent writes do
  // underneath on a POSIX file system): the merging thread hands them over and goes on.
  std::vector<std::string> paths;
  for (const std::string& name : layout.shard_names) paths.push_back(dir + "/" + name);
  comm.check(capture_failure([&] {
               const std::uint64_t queued = std::clamp<std::uint64_t>(
                   kWriteQueueBytes / std::max<std::uint64_t>(1, largest_write), 2, 64);
               writer_ = std::make_unique<io::AsyncFileWriter>(
                   paths, queued, io::AsyncFileWriter::kDefaultFlushEvery, output_io);
             }),
             "open the output shards for writing");
}

void SafetensorsSink::write(std::uint32_t tensor, std::uint64_t elem_begin,
                            std::span<const std::byte> bytes) {
  const TensorInfo& info = layout_.tensors[tensor];
  const std::uint64_t offset = layout_.tensor_offset[tensor] + elem_begin * dtype_size(info.dtype);
  writer_->write(layout_.tensor_shard[tensor], offset, bytes);
  io::global_byte_counters().add(io::ByteCategory::kOutputWritten, bytes.size());
}

OutputLocation SafetensorsSink::locate(std::uint32_t tensor, std::uint64_t elem_begin) const {
  return {dir_ + "/" + layout_.shard_names[layout_.tensor_shard[tensor]],
          layout_.tensor_offset[tensor] + elem_begin * dtype_size(layout_.tensors[tensor].dtype)};
}

void SafetensorsSink::finish() {
  comm_.check(capture_failure([&] { writer_->finish(); }), "write the output shards");
  direct_bytes_ = writer_->direct_bytes();
  writer_.reset();
  for (std::size_t s = 0; s < files_.size(); ++s) {
    MpiFile& f = *files_[s];
    comm_.check(capture_failure([&] { f.set_size(layout_.shards[s].file_size); }),
                "size the output shards");
    comm_.check(capture_failure([&] { f.sync(); }), "flush the output shards");
    comm_.check(capture_failure([&] { f.close(); }), "close the output shards");
  }
}

}  // namespace mergepipe::mpi
