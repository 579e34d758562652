#include "mergepipe/retained_window.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "mergepipe/error.hpp"
#include "mergepipe/thread_name.hpp"

namespace mergepipe {

namespace {

std::uint64_t round_up(std::uint64_t n) {
  return (n + kInPlaceAlignment - 1) / kInPlaceAlignment * kInPlaceAlignment;
}

// Where a range starts within its first page.
std::uint64_t phase_of(const BlockReader& from, const HeldRange& r) {
  return (from.in_place_phase(r.source, r.tensor) + r.byte_begin) % kInPlaceAlignment;
}

// The pages a range occupies.
std::uint64_t span_of(const BlockReader& from, const HeldRange& r) {
  return round_up(phase_of(from, r) + r.length);
}

}  // namespace

std::uint64_t RetainedWindow::footprint(const BlockReader& from,
                                        const std::vector<HeldRange>& ranges) {
  std::uint64_t total = 0;
  for (const HeldRange& r : ranges) total += span_of(from, r);
  return total;
}

void RetainedWindow::reserve(std::uint64_t bytes) {
  try {
    memory_.reserve(bytes);
  } catch (const std::bad_alloc&) {
    throw IoError("retained window: cannot allocate " + std::to_string(bytes >> 20) + " MiB");
  }
}

void RetainedWindow::fill(BlockReader& from, const std::vector<HeldRange>& ranges, int threads,
                          std::uint64_t request_bytes) {
  held_.clear();
  from_ = &from;
  const std::uint64_t needed = footprint(from, ranges);
  // Huge pages: scanned and merged from memory rather than copied out of the page cache (which
  // the kernel maps with huge pages), the window's 4 KiB pages made the TLB misses of a VM's
  // nested page walks cost more than the copies saved: K=5 full-read TIES 7.0 -> 3.6 s of user
  // time.
  reserve(needed);
  // Each range gets its own pages; requests split it at page boundaries of the file, so they
  // write disjoint pages and the range ends up contiguous.
  struct Request {
    SourceId source;
    std::uint32_t tensor;
    std::uint64_t byte_begin, length;
    std::byte* dst;
  };
  const std::uint64_t step =
      std::max(kInPlaceAlignment, request_bytes / kInPlaceAlignment * kInPlaceAlignment);
  std::vector<Request> requests;
  decltype(held_) held;
  std::uint64_t used = 0;
  for (const HeldRange& r : ranges) {
    const std::uint64_t phase = phase_of(from, r);
    std::byte* data = memory_.data() + used + phase;
    used += span_of(from, r);
    held[{r.source.expert, r.tensor}].push_back({r.byte_begin, r.length, data});
    // The first request ends on a page boundary of the file, the others are whole pages.
    for (std::uint64_t done = 0; done < r.length;) {
      const std::uint64_t n = std::min(r.length - done, step - (phase + done) % step);
      requests.push_back({r.source, r.tensor, r.byte_begin + done, n, data + done});
      done += n;
    }
  }
  for (auto& [key, list] : held)
    std::sort(list.begin(), list.end(),
              [](const Held& a, const Held& b) { return a.byte_begin < b.byte_begin; });

  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
  auto work = [&] {
    name_this_thread("mp-hold");
    for (std::size_t i; !failed && (i = next++) < requests.size();) {
      const Request& q = requests[i];
      try {
        from.read_in_place(q.source, q.tensor, q.byte_begin,
                           std::span<std::byte>(q.dst, static_cast<std::size_t>(q.length)));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  held_ = std::move(held);
}

const RetainedWindow::Held* RetainedWindow::find(SourceId source, std::uint32_t tensor,
                                                 std::uint64_t byte_begin,
                                                 std::uint64_t length) const {
  const auto it = held_.find({source.expert, tensor});
  if (it == held_.end()) return nullptr;
  const std::vector<Held>& list = it->second;
  // The last range starting at or before byte_begin.
  auto after = std::upper_bound(list.begin(), list.end(), byte_begin,
                                [](std::uint64_t b, const Held& h) { return b < h.byte_begin; });
  if (after == list.begin()) return nullptr;
  const Held& h = *std::prev(after);
  if (byte_begin + length > h.byte_begin + h.length) return nullptr;
  return &h;
}

std::byte* RetainedWindow::view(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                                std::uint64_t length) {
  const Held* h = find(source, tensor, byte_begin, length);
  if (!h)
    throw IoError("retained window: " + describe(source, tensor, byte_begin, length) +
                  " was not read into it");
  return h->data + (byte_begin - h->byte_begin);
}

void RetainedWindow::read(SourceId source, std::uint32_t tensor, std::uint64_t byte_begin,
                          std::span<std::byte> dst) {
  std::memcpy(dst.data(), view(source, tensor, byte_begin, dst.size()), dst.size());
}

std::string RetainedWindow::describe(SourceId source, std::uint32_t tensor,
                                     std::uint64_t byte_begin, std::uint64_t length) const {
  if (from_) return from_->describe(source, tensor, byte_begin, length);
  return "source " + std::to_string(source.expert) + " tensor #" + std::to_string(tensor) +
         " bytes " + std::to_string(byte_begin) + ".." + std::to_string(byte_begin + length);
}

}  // namespace mergepipe
