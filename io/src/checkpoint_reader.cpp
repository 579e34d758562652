#include "mergepipe/io/checkpoint_reader.hpp"

#include "mergepipe/error.hpp"
#include "mergepipe/io/page_residency.hpp"

namespace mergepipe::io {

static_assert(kDirectAlignment == kInPlaceAlignment, "in-place reads are direct reads");

CheckpointBlockReader::CheckpointBlockReader(const CheckpointLocation& base,
                                             const std::vector<CheckpointLocation>& experts,
                                             ByteCounters& counters, ExpertAccess access,
                                             InputIo input_io)
    : base_(open(base, access != ExpertAccess::kHeldWindows, input_io)), counters_(counters) {
  experts_.reserve(experts.size());
  for (const auto& e : experts)
    experts_.push_back(open(e, access == ExpertAccess::kWholeFiles, input_io));
}

CheckpointBlockReader::Opened CheckpointBlockReader::open(const CheckpointLocation& location,
                                                          bool sequential, InputIo input_io) {
  Opened opened{&location, {}, {}};
  for (const auto& name : location.shard_names) {
    const std::string path = location.dir + "/" + name;
    File& file = opened.files.emplace_back(path, File::Mode::kRead);
    if (sequential) {
      file.advise_sequential();
    } else {
      file.advise_random();
    }
    // kAuto: a file mostly in the page cache is copied from memory faster than the device
    // delivers it, so only cold files go around the cache. A file system that cannot map the
    // file cannot say: count it as cold (a refused O_DIRECT still falls back to the cache).
    bool cached = false;
    if (!sequential && input_io == InputIo::kAuto) {
      try {
        cached = mostly_cached(file);
      } catch (const IoError&) {
        cached = false;
      }
    }
    const bool direct =
        !sequential && (input_io == InputIo::kDirect || (input_io == InputIo::kAuto && !cached));
    opened.direct.push_back(direct ? File::open_direct(path) : File());
    if (reads_from_memory_) {
      try {
        reads_from_memory_ = !opened.direct.back().is_open() && fully_cached(file);
      } catch (const IoError&) {
        reads_from_memory_ = false;
      }
    }
  }
  return opened;
}

void CheckpointBlockReader::stream_base_through_cache() {
  for (std::size_t i = 0; i < base_.files.size(); ++i) {
    base_.direct[i] = File();
    base_.files[i].advise_sequential();
  }
}

std::size_t CheckpointBlockReader::direct_files() const {
  std::size_t n = direct_expert_files();
  for (const File& f : base_.direct) n += f.is_open() ? 1 : 0;
  return n;
}

std::size_t CheckpointBlockReader::direct_expert_files() const {
  std::size_t n = 0;
  for (const Opened& o : experts_)
    for (const File& f : o.direct) n += f.is_open() ? 1 : 0;
  return n;
}

std::size_t CheckpointBlockReader::total_files() const {
  std::size_t n = base_.files.size();
  for (const Opened& o : experts_) n += o.files.size();
  return n;
}

const CheckpointBlockReader::Opened& CheckpointBlockReader::opened(SourceId source) const {
  return source.expert == SourceId::kBase ? base_
                                          : experts_.at(static_cast<std::size_t>(source.expert));
}

std::pair<std::uint32_t, std::uint64_t> CheckpointBlockReader::locate(
    const Opened& o, std::uint32_t tensor, std::uint64_t byte_begin) const {
  const CheckpointLocation& loc = *o.location;
  if (tensor >= loc.tensor_file.size())
    throw InputError(loc.dir + ": no location for tensor #" + std::to_string(tensor));
  return {loc.tensor_file[tensor], loc.tensor_offset[tensor] + byte_begin};
}

std::uint64_t CheckpointBlockReader::in_place_phase(SourceId source, std::uint32_t tensor) const {
  return locate(opened(source), tensor, 0).second % kInPlaceAlignment;
}

void CheckpointBlockReader::read_in_place(SourceId source, std::uint32_t tensor,
                                          std::uint64_t byte_begin, std::span<std::byte> dst) {
  const Opened& o = opened(source);
  const auto [shard, offset] = locate(o, tensor, byte_begin);
  const File& direct = o.direct.at(shard);
  if (!direct.is_open() || !direct.read_direct_in_place(offset, dst))
    o.files.at(shard).read_at(offset, dst);
  counters_.add(source.expert == SourceId::kBase ? ByteCategory::kBase : ByteCategory::kExpert,
                dst.size());
}

void CheckpointBlockReader::read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                                 std::span<std::byte> dst) {
  const Opened& o = opened(source);
  const auto [shard, offset] = locate(o, tensor, byte_begin);
  // One scratch per I/O thread, kept for the thread's life.
  thread_local AlignedBuffer scratch;
  const File& direct = o.direct.at(shard);
  if (!direct.is_open() || !direct.read_at_direct(offset, dst, scratch))
    o.files.at(shard).read_at(offset, dst);
  counters_.add(source.expert == SourceId::kBase ? ByteCategory::kBase : ByteCategory::kExpert,
                dst.size());
}

void CheckpointBlockReader::prefetch(SourceId source, std::uint32_t tensor,
                                     std::uint64_t byte_begin, std::uint64_t length) {
  const Opened& o = opened(source);
  const CheckpointLocation& loc = *o.location;
  if (tensor >= loc.tensor_file.size() || o.direct.at(loc.tensor_file[tensor]).is_open()) return;
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
