#include "mergepipe/io/resume_journal.hpp"

#include <cstring>
#include <filesystem>
#include <set>

#include "mergepipe/hash.hpp"

namespace mergepipe::io {

namespace fs = std::filesystem;

namespace {
// Record: u32 kind, u32 index, u32 count, u32 zero, `count` u64 payload words, u64 check.
// check = hash64 of everything before it with kSeed, so a torn or foreign record is rejected.
constexpr std::uint32_t kBlockRecord = 0x4b4c4231;      // "1BLK"
constexpr std::uint32_t kThresholdRecord = 0x52485431;  // "1THR"
constexpr std::uint64_t kSeed = 0x6d657267656a6e6cull;
constexpr const char* kPrefix = "journal-";

std::vector<std::byte> encode(std::uint32_t kind, std::uint32_t index,
                              std::span<const std::byte> payload) {
  const std::uint32_t header[4] = {kind, index, static_cast<std::uint32_t>(payload.size() / 8), 0};
  std::vector<std::byte> rec(sizeof header + payload.size() + 8);
  std::memcpy(rec.data(), header, sizeof header);
  if (!payload.empty()) std::memcpy(rec.data() + sizeof header, payload.data(), payload.size());
  const std::uint64_t check = hash64(rec.data(), rec.size() - 8, kSeed);
  std::memcpy(rec.data() + rec.size() - 8, &check, 8);
  return rec;
}
}  // namespace

JournalWriter::JournalWriter(const std::string& dir, int rank)
    : file_(dir + "/" + kPrefix + std::to_string(rank) + ".bin", File::Mode::kAppend) {}

void JournalWriter::block_done(std::uint32_t block, std::uint64_t output_hash) {
  file_.append(encode(kBlockRecord, block, std::as_bytes(std::span(&output_hash, 1))));
}

void JournalWriter::thresholds(std::uint32_t tensor, std::span<const float> per_expert) {
  // u32 count, the floats, zero padding to whole 64-bit words (the header counts words).
  const auto n = static_cast<std::uint32_t>(per_expert.size());
  std::vector<std::byte> body((4 + std::size_t{n} * 4 + 7) / 8 * 8);
  std::memcpy(body.data(), &n, 4);
  if (n) std::memcpy(body.data() + 4, per_expert.data(), std::size_t{n} * 4);
  file_.append(encode(kThresholdRecord, tensor, body));
}

JournalContents read_journals(const std::string& dir, std::uint32_t block_count,
                              std::uint32_t tensor_count, std::size_t experts) {
  JournalContents out;
  std::set<std::uint32_t> contradicted;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0 || !entry.is_regular_file()) continue;
    const std::string text = read_text_file(entry.path().string());
    std::size_t pos = 0;
    while (pos + 24 <= text.size()) {
      std::uint32_t header[4];
      std::memcpy(header, text.data() + pos, sizeof header);
      const std::size_t size = 16 + std::size_t{header[2]} * 8 + 8;
      if (header[3] != 0 || header[2] > (1u << 20) || pos + size > text.size()) break;
      std::uint64_t check;
      std::memcpy(&check, text.data() + pos + size - 8, 8);
      if (check != hash64(text.data() + pos, size - 8, kSeed)) break;  // torn tail
      const char* payload = text.data() + pos + 16;
      pos += size;
      ++out.records;
      if (header[0] == kBlockRecord && header[2] == 1 && header[1] < block_count) {
        std::uint64_t hash;
        std::memcpy(&hash, payload, 8);
        auto [it, inserted] = out.blocks.emplace(header[1], hash);
        if (!inserted && it->second != hash) contradicted.insert(header[1]);
      } else if (header[0] == kThresholdRecord && header[1] < tensor_count) {
        std::uint32_t n;
        std::memcpy(&n, payload, 4);
        if (n != experts || 4 + std::size_t{n} * 4 > std::size_t{header[2]} * 8) {
          ++out.discarded;
          continue;
        }
        std::vector<float> values(n);
        if (n) std::memcpy(values.data(), payload + 4, std::size_t{n} * 4);
        auto [it, inserted] = out.thresholds.emplace(header[1], values);
        if (!inserted && it->second != values) {
          ++out.discarded;
          out.thresholds.erase(it);
        }
      } else {
        ++out.discarded;
      }
    }
    if (pos != text.size()) ++out.discarded;
  }
  for (std::uint32_t b : contradicted) {
    out.blocks.erase(b);
    ++out.discarded;
  }
  return out;
}

}  // namespace mergepipe::io
