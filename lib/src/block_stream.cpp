#include "mergepipe/block_stream.hpp"

#include <algorithm>
#include <chrono>

#include "mergepipe/thread_name.hpp"

namespace mergepipe {

BlockStream::BlockStream(const Blocking& blocking, std::vector<std::uint32_t> blocks,
                         std::size_t experts, BlockReader& reader, StreamOptions options)
    : blocking_(blocking), experts_(experts), reader_(reader), options_(std::move(options)) {
  for (std::uint32_t b : blocks) {
    const Block& blk = blocking.blocks[b];
    const std::uint64_t elem_size = blk.elem_count ? blk.byte_length / blk.elem_count : 1;
    const std::uint64_t per_slice =
        options_.slice_bytes ? std::max<std::uint64_t>(1, options_.slice_bytes / elem_size)
                             : std::max<std::uint64_t>(1, blk.elem_count);
    for (std::uint64_t e = 0; e < blk.elem_count || e == 0; e += per_slice) {
      const std::uint64_t n = std::min(per_slice, blk.elem_count - e);
      units_.push_back({b, e, n, e * elem_size, n * elem_size, e == 0, e + n >= blk.elem_count});
      if (blk.elem_count == 0) break;
    }
  }
  const int depth = std::max(1, options_.depth);
  for (int i = 0; i < depth + 1; ++i)
    free_.push_back(options_.pool ? options_.pool->take() : std::make_unique<LoadedBlock>());
  for (int i = 0; i < options_.io_threads; ++i)
    threads_.emplace_back([this] {
      name_this_thread("mp-read");
      io_loop();
    });
}

BlockStream::~BlockStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  io_cv_.notify_all();
  for (auto& t : threads_) t.join();
  if (options_.pool) {
    for (auto& b : free_) options_.pool->give(std::move(b));
    for (auto& entry : inflight_)
      if (entry.block) options_.pool->give(std::move(entry.block));
  }
}

std::unique_ptr<LoadedBlock> BlockPool::take() {
  std::lock_guard lock(mutex_);
  if (blocks_.empty()) return std::make_unique<LoadedBlock>();
  auto block = std::move(blocks_.back());
  blocks_.pop_back();
  return block;
}

void BlockPool::give(std::unique_ptr<LoadedBlock> block) {
  std::lock_guard lock(mutex_);
  blocks_.push_back(std::move(block));
}

bool BlockStream::can_schedule() const {
  return !free_.empty() && scheduled_ < units_.size();
}

void BlockStream::schedule_next() {
  const Unit& unit = units_[scheduled_++];
  const std::uint32_t b = unit.block;
  std::unique_ptr<LoadedBlock> block = std::move(free_.back());
  free_.pop_back();
  block->block = b;
  block->elem_offset = unit.elem_offset;
  block->elem_count = unit.elem_count;
  block->byte_offset = unit.byte_offset;
  block->byte_length = unit.byte_length;
  block->first_slice = unit.first;
  block->last_slice = unit.last;
  block->experts.resize(experts_);
  block->present.assign(experts_, 0);
  Inflight& entry = inflight_.emplace_back();
  pieces_.push_back({&entry, SourceId::kBase});
  for (std::size_t k = 0; k < experts_; ++k) {
    if (options_.wanted && !options_.wanted(k, b)) continue;
    block->present[k] = 1;
    pieces_.push_back({&entry, static_cast<int>(k)});
  }
  entry.pending = 1 + static_cast<int>(std::count(block->present.begin(), block->present.end(), 1));
  entry.block = std::move(block);
}

void BlockStream::read_piece(const Piece& piece) {
  LoadedBlock& block = *piece.owner->block;
  const Block& blk = blocking_.blocks[block.block];
  ByteBuffer& dst = piece.source == SourceId::kBase
                        ? block.base
                        : block.experts[static_cast<std::size_t>(piece.source)];
  const SourceId source{piece.source};
  const std::uint64_t begin = blk.byte_begin + block.byte_offset;
  if (std::byte* held = reader_.view(source, blk.tensor, begin, block.byte_length)) {
    dst.show(held, block.byte_length);
    return;
  }
  dst.resize(block.byte_length);
  reader_.read(source, blk.tensor, begin, std::span<std::byte>(dst));
}

void BlockStream::io_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    io_cv_.wait(lock, [this] { return stopping_ || error_ || !pieces_.empty() || can_schedule(); });
    if (stopping_ || error_) return;
    if (pieces_.empty()) {
      schedule_next();
      continue;
    }
    const Piece piece = pieces_.front();
    pieces_.pop_front();
    if (!pieces_.empty() || can_schedule()) io_cv_.notify_one();
    lock.unlock();
    std::exception_ptr failure;
    try {
      read_piece(piece);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    if (failure) {
      if (!error_) error_ = failure;
      ready_cv_.notify_all();
      io_cv_.notify_all();
      return;
    }
    const std::uint64_t bytes = piece.owner->block->byte_length;
    (piece.source == SourceId::kBase ? base_bytes_ : expert_bytes_) += bytes;
    if (--piece.owner->pending == 0) ready_cv_.notify_all();
  }
}

std::unique_ptr<LoadedBlock> BlockStream::read_next_here() {
  std::unique_lock lock(mutex_);
  if (handed_out_ == units_.size()) return nullptr;
  // A consumer may keep more slices than the stream keeps buffers for; with nothing read ahead
  // that is no reason to wait.
  if (free_.empty())
    free_.push_back(options_.pool ? options_.pool->take() : std::make_unique<LoadedBlock>());
  schedule_next();
  while (!pieces_.empty()) {
    const Piece piece = pieces_.front();
    pieces_.pop_front();
    read_piece(piece);
    const std::uint64_t bytes = piece.owner->block->byte_length;
    (piece.source == SourceId::kBase ? base_bytes_ : expert_bytes_) += bytes;
  }
  std::unique_ptr<LoadedBlock> block = std::move(inflight_.front().block);
  inflight_.pop_front();
  ++handed_out_;
  return block;
}

std::unique_ptr<LoadedBlock> BlockStream::next(double& waited) {
  if (threads_.empty()) return read_next_here();
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  if (handed_out_ == units_.size()) return nullptr;
  ready_cv_.wait(
      lock, [this] { return error_ || (!inflight_.empty() && inflight_.front().pending == 0); });
  waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error_) std::rethrow_exception(error_);
  std::unique_ptr<LoadedBlock> block = std::move(inflight_.front().block);
  inflight_.pop_front();
  ++handed_out_;
  return block;
}

void BlockStream::recycle(std::unique_ptr<LoadedBlock> block) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(block));
  }
  io_cv_.notify_one();
}

std::uint64_t BlockStream::base_bytes() const {
  std::lock_guard lock(mutex_);
  return base_bytes_;
}

std::uint64_t BlockStream::expert_bytes() const {
  std::lock_guard lock(mutex_);
  return expert_bytes_;
}

}  // namespace mergepipe
