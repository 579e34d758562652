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

const CheckpointBlockReader::Opened& CheckpointBlockReader::opened(SourceId source) const {
  return source.expert == SourceId::kBase ? base_
                                          : experts_.at(static_cast<std::size_t>(source.expert));
}

void CheckpointBlockReader::read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                                 std::span<std::byte> dst) {
  const Opened& o = opened(source);
  const CheckpointLocation& loc = *o.location;
  if (tensor >= loc.tensor_file.size())
    throw InputError(loc.dir + ": no location for tensor #" + std::to_string(tensor));
  const File& file = o.files.at(loc.tensor_file[tensor]);
  file.read_at(loc.tensor_offset[tensor] + byte_begin, dst);
  counters_.add(source.expert == SourceId::kBase ? ByteCategory::kBase : ByteCategory::kExpert,
                dst.size());
}

void CheckpointBlockReader::prefetch(SourceId source, std::uint32_t tensor,
                                     std::uint64_t byte_begin, std::uint64_t length) {
  const Opened& o = opened(source);
  const CheckpointLocation& loc = *o.location;
  if (tensor >= loc.tensor_file.size()) return;
  o.files.at(loc.tensor_file[tensor]).will_need(loc.tensor_offset[tensor] + byte_begin, length);
}

std::string CheckpointBlockReader::describe(SourceId source, std::uint32_t tensor,
                                            std::uint64_t byte_begin, std::uint64_t length) const {
  const Opened& o = opened(source);
  const CheckpointLocation& loc = *o.location;
  if (tensor >= loc.tensor_file.size()) return loc.dir;
  const std::uint64_t offset = loc.tensor_offset[tensor] + byte_begin;
  return o.files.at(loc.tensor_file[tensor]).path() + " bytes " + std::to_string(offset) + ".." +
         std::to_string(offset + length);
}

}  // namespace mergepipe::io
