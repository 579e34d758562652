#include "mergepipe/dtype.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "mergepipe/error.hpp"

namespace mergepipe {

namespace {
struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},        {DType::kF32, "F32", 4},         {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},      {DType::kI64, "I64", 8},         {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},        {DType::kI8, "I8", 1},           {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},      {DType::kF8E4M3, "F8_E4M3", 1},  {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kU16, "U16", 2},        {DType::kU32, "U32", 4},         {DType::kU64, "U64", 8},
};

inline std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float float_of(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
}  // namespace

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.name;
  return "?";
}

std::size_t dtype_size(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e.size;
  return 1;
}

bool is_mergeable(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

std::uint16_t f32_to_bf16(float value) {
  const std::uint32_t b = bits_of(value);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>((b + rounding) >> 16);
}

float bf16_to_f32(std::uint16_t bits) { return float_of(static_cast<std::uint32_t>(bits) << 16); }

std::uint16_t f32_to_f16(float value) {
  const std::uint32_t b = bits_of(value);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in fp16: value * 2^24 rounded to nearest even, exactly via float add.
    const float magic = float_of(0x4b000000u);  // 2^23: adding aligns the integer part
    const float scaled = float_of(abs) * 16777216.0f;  // exact: scaling by a power of two
    const std::uint32_t r = bits_of(scaled + magic) - 0x4b000000u;
    return static_cast<std::uint16_t>(sign | r);
  }
  const std::uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return float_of(bits_of(f) | sign);
  }
  if (exp == 31) return float_of(sign | 0x7f800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

void convert_to_f32(DType src, const std::byte* in, float* out, std::size_t n) {
  switch (src) {
    case DType::kF32:
      std::memcpy(out, in, n * 4);
      return;
    case DType::kBF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, in + 2 * i, 2);
        out[i] = bf16_to_f32(v);
      }
      return;
    case DType::kF16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t v;
        std::memcpy(&v, in + 2 * i, 2);
        out[i] = f16_to_f32(v);
      }
      return;
    case DType::kF64:
      for (std::size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, in + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      return;
    default:
      throw InputError("cannot merge tensors of dtype " + std::string(dtype_name(src)));
  }
}

void convert_from_f32(DType dst, const float* in, std::byte* out, std::size_t n) {
  switch (dst) {
    case DType::kF32:
      std::memcpy(out, in, n * 4);
      return;
    case DType::kBF16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t v = f32_to_bf16(in[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      return;
    case DType::kF16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t v = f32_to_f16(in[i]);
        std::memcpy(out + 2 * i, &v, 2);
      }
      return;
    case DType::kF64:
      for (std::size_t i = 0; i < n; ++i) {
        const double v = in[i];
        std::memcpy(out + 8 * i, &v, 8);
      }
      return;
    default:
      throw InputError("cannot write merged tensors as dtype " + std::string(dtype_name(dst)));
  }
}

}  // namespace mergepipe
