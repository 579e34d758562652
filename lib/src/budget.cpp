#include "mergepipe/budget.hpp"

#include <cctype>
#include <cstdio>
#include <numeric>

#include "mergepipe/error.hpp"

namespace mergepipe {
namespace {

using u128 = unsigned __int128;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

[[noreturn]] void fail(const std::string& text, const std::string& why) {
  throw UsageError("budget '" + text + "': " + why +
                   " (forms: 12GiB, 900MB, 4096 bytes, 25% of the full expert read)");
}

constexpr std::uint64_t pow10(int n) {
  std::uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

// Multiplier of a (lower-cased) unit, 0 for "%" and unknown units reported by the caller.
bool unit_multiplier(const std::string& unit, std::uint64_t& multiplier) {
  static const struct {
    const char* name;
    std::uint64_t value;
  } kUnits[] = {
      {"", 1},
      {"b", 1},
      {"kb", pow10(3)},
      {"mb", pow10(6)},
      {"gb", pow10(9)},
      {"tb", pow10(12)},
      {"kib", 1ull << 10},
      {"mib", 1ull << 20},
      {"gib", 1ull << 30},
      {"tib", 1ull << 40},
  };
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      multiplier = u.value;
      return true;
    }
  }
  return false;
}

}  // namespace

Budget Budget::of_bytes(std::uint64_t bytes) {
  Budget b;
  b.kind = Kind::kBytes;
  b.bytes = bytes;
  return b;
}

Budget Budget::of_fraction(std::uint64_t numerator, std::uint64_t denominator) {
  if (denominator == 0) throw UsageError("budget: fraction with a zero denominator");
  const std::uint64_t g = std::gcd(numerator, denominator);
  Budget b;
  b.kind = Kind::kFraction;
  b.numerator = g ? numerator / g : 0;
  b.denominator = g ? denominator / g : 1;
  b.fraction = static_cast<double>(numerator) / static_cast<double>(denominator);
  return b;
}

Budget Budget::parse(const std::string& raw) {
  const std::string text = trim(raw);
  if (text.empty()) fail(raw, "empty");
  const std::string low = lower(text);
  {
    std::string bare = low;
    if (bare[0] == '+' || bare[0] == '-') bare.erase(0, 1);
    if (bare.rfind("nan", 0) == 0 || bare.rfind("inf", 0) == 0) fail(raw, "not a finite number");
  }
  if (text[0] == '-') fail(raw, "a budget cannot be negative");

  // Decimal number: digits [ '.' digits ], kept as mantissa / 10^scale.
  std::size_t i = 0;
  std::string int_digits, frac_digits;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])))
    int_digits += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])))
      frac_digits += text[i++];
  }
  if (int_digits.empty() && frac_digits.empty()) fail(raw, "no number");
  while (!frac_digits.empty() && frac_digits.back() == '0') frac_digits.pop_back();
  std::string digits = int_digits + frac_digits;
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  // 26 digits times the largest unit (2^40) still fits 128 bits; fractions keep 16 decimals so
  // the denominator 100·10^scale fits 64 bits.
  if (digits.size() > 26 || frac_digits.size() > 16) fail(raw, "too many digits");
  u128 mantissa = 0;
  for (char c : digits) mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
  const int scale = static_cast<int>(frac_digits.size());

  const std::string unit = lower(trim(text.substr(i)));
  if (unit == "%") {
    if (mantissa > UINT64_MAX) fail(raw, "too large");
    return of_fraction(static_cast<std::uint64_t>(mantissa), 100 * pow10(scale));
  }
  std::uint64_t multiplier = 0;
  if (!unit_multiplier(unit, multiplier)) {
    fail(raw, "unknown unit '" + trim(text.substr(i)) + "'");
  }
  const u128 value = mantissa * multiplier / pow10(scale);
  if (value > UINT64_MAX) fail(raw, "too large");
  return of_bytes(static_cast<std::uint64_t>(value));
}

std::uint64_t Budget::resolve(std::uint64_t full_expert_bytes) const {
  if (kind == Kind::kBytes) return bytes;
  const u128 value = static_cast<u128>(full_expert_bytes) * numerator / denominator;
  return value > UINT64_MAX ? UINT64_MAX : static_cast<std::uint64_t>(value);
}

std::string Budget::to_string() const {
  if (kind == Kind::kBytes) return std::to_string(bytes);
  // Percent = numerator·100 / denominator as a decimal (exact when it terminates within 16
  // digits, which every parsed percentage does).
  u128 num = static_cast<u128>(numerator) * 100;
  std::string out = std::to_string(static_cast<std::uint64_t>(num / denominator));
  u128 rem = num % denominator;
  if (rem != 0) {
    out += '.';
    for (int d = 0; d < 16 && rem != 0; ++d) {
      rem *= 10;
      out += static_cast<char>('0' + static_cast<int>(rem / denominator));
      rem %= denominator;
    }
  }
  return out + "%";
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  Budget b;
  try {
    b = Budget::parse(text);
  } catch (const UsageError&) {
    throw UsageError(what + " '" + text + "' is not a size (e.g. 4194304, 4MiB or 5GB)");
  }
  if (b.kind != Budget::Kind::kBytes)
    throw UsageError(what + " '" + text + "' must be a size, not a percentage");
  if (b.bytes == 0) throw UsageError(what + " must be positive");
  return b.bytes;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace mergepipe
