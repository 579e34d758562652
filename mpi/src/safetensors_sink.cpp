#include "mergepipe/error.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/mpi/output_sinks.hpp"

namespace mergepipe::mpi {

SafetensorsSink::SafetensorsSink(const Comm& comm, const io::OutputLayout& layout,
                                 const std::string& dir, const InfoHints& hints)
    : layout_(layout), dir_(dir) {
  for (std::size_t s = 0; s < layout.shards.size(); ++s) {
    files_.push_back(
        std::make_unique<MpiFile>(comm, dir + "/" + layout.shard_names[s], true, hints));
    if (comm.is_root()) {
      const std::string& header = layout.shards[s].header_bytes;
      files_.back()->write_at(0, std::as_bytes(std::span(header.data(), header.size())));
      io::global_byte_counters().add(io::ByteCategory::kOutputWritten, header.size());
    }
  }
}

void SafetensorsSink::write(std::uint32_t tensor, std::uint64_t elem_begin,
                            std::span<const std::byte> bytes) {
  const TensorInfo& info = layout_.tensors[tensor];
  const std::uint64_t offset = layout_.tensor_offset[tensor] + elem_begin * dtype_size(info.dtype);
  files_[layout_.tensor_shard[tensor]]->write_at(offset, bytes);
  io::global_byte_counters().add(io::ByteCategory::kOutputWritten, bytes.size());
}

OutputLocation SafetensorsSink::locate(std::uint32_t tensor, std::uint64_t elem_begin) const {
  return {dir_ + "/" + layout_.shard_names[layout_.tensor_shard[tensor]],
          layout_.tensor_offset[tensor] + elem_begin * dtype_size(layout_.tensors[tensor].dtype)};
}

void SafetensorsSink::finish() {
  for (std::size_t s = 0; s < files_.size(); ++s) {
    files_[s]->set_size(layout_.shards[s].file_size);
    files_[s]->sync();
    files_[s]->close();
  }
}

}  // namespace mergepipe::mpi
