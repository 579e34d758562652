#include "mergepipe/io/checkpoint_reader.hpp"

#include "mergepipe/error.hpp"

namespace mergepipe::io {

CheckpointBlockReader::CheckpointBlockReader(const CheckpointLocation& base,
                                             const std::vector<CheckpointLocation>& experts,
                                             ByteCounters& counters, ExpertAccess access)
    : base_(open(base, true)), counters_(counters) {
  experts_.reserve(experts.size());
  for (const auto& e : experts) experts_.push_back(open(e, access == ExpertAccess::kWholeFiles));
}

CheckpointBlockReader::Opened CheckpointBlockReader::open(const CheckpointLocation& location,
                                                          bool sequential) {
  Opened opened{&location, {}};
  for (const auto& name : location.shard_names) {
    opened.files.emplace_back(location.dir + "/" + name, File::Mode::kRead);
    if (sequential) {
      opened.files.back().advise_sequential();
    } else {
      opened.files.back().advise_random();
    }
  }
  return opened;
}

void CheckpointBlockReader::read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                                 std::span<std::byte> dst) {
  const bool is_base = source.expert == SourceId::kBase;
  const Opened& opened = is_base ? base_ : experts_.at(static_cast<std::size_t>(source.expert));
  const CheckpointLocation& loc = *opened.location;
  if (tensor >= loc.tensor_file.size())
    throw InputError(loc.dir + ": no location for tensor #" + std::to_string(tensor));
  const File& file = opened.files.at(loc.tensor_file[tensor]);
  file.read_at(loc.tensor_offset[tensor] + byte_begin, dst);
  counters_.add(is_base ? ByteCategory::kBase : ByteCategory::kExpert, dst.size());
}

}  // namespace mergepipe::io
