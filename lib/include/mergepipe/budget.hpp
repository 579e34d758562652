#pragma once
// Budget forms (SPEC §2): absolute ("12GiB", "900MB", "4096") or a fraction of the full expert
// read ("25%"). Units: B, KB/MB/GB/TB (10^3n) and KiB/MiB/GiB/TiB (2^10n), case-insensitive.
// Numbers are decimal ("12.5%", "1.5GiB"); they are kept as exact rationals so "30%" of N bytes
// is floor(30·N/100), not floor(0.3·N) with the rounding error of the binary 0.3.
#include <cstdint>
#include <string>

namespace mergepipe {

struct Budget {
  enum class Kind { kBytes, kFraction } kind = Kind::kFraction;
  std::uint64_t bytes = 0;  // kBytes
  double fraction = 1.0;    // kFraction, 0.25 for "25%" (may exceed 1); informative only
  // kFraction, exact: the budget is floor(full · numerator / denominator) bytes.
  std::uint64_t numerator = 1;
  std::uint64_t denominator = 1;

  // Throws UsageError for text that does not parse, negative or non-finite values.
  static Budget parse(const std::string& text);
  static Budget of_bytes(std::uint64_t bytes);
  // numerator / denominator of the full expert read (denominator > 0).
  static Budget of_fraction(std::uint64_t numerator, std::uint64_t denominator);
  // Bytes allowed given the full expert read cost (saturates at UINT64_MAX).
  std::uint64_t resolve(std::uint64_t full_expert_bytes) const;
  // A form parse() reads back to the same budget: "123456" (bytes) or "12.5%".
  std::string to_string() const;
};

// Human form of a byte count: "1.50 GiB (1610612736 bytes)" style, for summaries.
std::string format_bytes(std::uint64_t bytes);

// A byte size for options such as --block-bytes or --max-shard-size: the absolute budget forms
// ("4MiB", "5GB", "4096"); UsageError naming `what` for anything else, percentages included.
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace mergepipe
