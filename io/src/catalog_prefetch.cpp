#include "mergepipe/io/catalog_prefetch.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <thread>
#include <vector>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/safetensors.hpp"

namespace mergepipe::io {

namespace {

// Requests in flight at once: enough to have every header of a large family queued together.
constexpr std::size_t kThreads = 8;
constexpr std::uint64_t kChunkBytes = 4 << 20;

struct Wanted {
  std::string path;
  bool safetensors_header = false;  // only the header; else the whole file
};

std::uint64_t read_le64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}

// The bytes of `w` the catalog load or the freshness check will read, read once here.
std::uint64_t read_wanted(const Wanted& w, std::vector<std::byte>& buffer) {
  const File file(w.path, File::Mode::kRead);
  const std::uint64_t size = file.size();
  std::uint64_t end = size;
  if (w.safetensors_header) {
    if (size < 8) return 0;
    std::byte length[8];
    file.read_at(0, length);
    end = 8 + std::min(read_le64(length), std::min(kMaxHeaderBytes, size - 8));
  }
  std::uint64_t done = 0;
  for (std::uint64_t at = 0; at < end; at += kChunkBytes) {
    const std::uint64_t n = std::min(kChunkBytes, end - at);
    buffer.resize(std::max<std::size_t>(buffer.size(), n));
    file.read_at(at, std::span(buffer.data(), n));
    done += n;
  }
  return done;
}

}  // namespace

std::uint64_t prefetch_catalog_inputs(const std::string& catalog_path, const ExpertSelection& only,
                                      const CatalogPrefetch& what) {
  std::vector<Wanted> wanted;
  if (what.catalog_file)
    wanted.push_back({(std::filesystem::path(catalog_path) / kCatalogH5Name).string()});
  const FileShare share = what.header_share;
  if (what.headers && share.count > 0 && share.index < share.count) {
    try {
      // The files check_catalog_fresh checks in this share.
      const Catalog summary = load_catalog_summary(catalog_path);
      for (const FileIdentity& f : catalog_input_files(summary, only, share))
        wanted.push_back({f.path, true});
    } catch (const Error&) {
      // Without a readable summary there are no headers to read; the load reports the problem.
    }
  }

  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bytes{0};
  std::vector<std::thread> threads;
  const std::size_t count = std::min(kThreads, wanted.size());
  for (std::size_t t = 0; t < count; ++t) {
    threads.emplace_back([&] {
      std::vector<std::byte> buffer;
      for (std::size_t i; (i = next++) < wanted.size();) {
        try {
          bytes += read_wanted(wanted[i], buffer);
        } catch (const Error&) {
          // A hint only: the catalog load reads the same bytes and reports the problem.
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return bytes.load();
}

}  // namespace mergepipe::io
