#include "mergepipe/dtype.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "mergepipe/error.hpp"
#include "mergepipe/float_bits.hpp"

namespace mergepipe {

namespace {
struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8},        {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},          {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kU16, "U16", 2},   {DType::kU32, "U32", 4},        {DType::kU64, "U64", 8},
};

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

std::string torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    default:
      throw UsageError("no torch dtype for " + std::string(dtype_name(dtype)));
  }
}

bool is_mergeable(DType dtype) {
  return dtype == DType::kF64 || dtype == DType::kF32 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

std::uint16_t f32_to_bf16(float value) {
  const std::uint32_t b = bits_of(value);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return static_cast<std::uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>((b + rounding) >> 16);
}

float bf16_to_f32(std::uint16_t bits) {
  return float_of(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t f32_to_f16(float value) {
  const std::uint32_t b = bits_of(value);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in fp16: value * 2^24 rounded to nearest even, exactly via float add.
    const float magic = float_of(0x4b000000u);         // 2^23: adding aligns the integer part
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

// Bulk kernels: branch-free per-element bit manipulation written so GCC vectorises each loop
// (selects instead of branches, memcpy for unaligned loads and stores). Each kernel gives the same
// bits as the scalar function of the same direction; the unit tests check this exhaustively.
// The kernels are compiled for the baseline ISA and for AVX2/AVX-512 and picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MERGEPIPE_KERNEL __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MERGEPIPE_KERNEL
#endif

namespace {

inline std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u16(std::byte* p, std::uint16_t v) {
  std::memcpy(p, &v, sizeof v);
}
inline std::uint32_t load_u32(const float* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_u32(float* p, std::uint32_t v) {
  std::memcpy(p, &v, sizeof v);
}

MERGEPIPE_KERNEL void bulk_bf16_to_f32(const std::byte* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    store_u32(out + i, static_cast<std::uint32_t>(load_u16(in + 2 * i)) << 16);
}

MERGEPIPE_KERNEL void bulk_bf16_delta(const std::byte* in, const float* base, float* out,
                                      std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = float_of(static_cast<std::uint32_t>(load_u16(in + 2 * i)) << 16) - base[i];
}

MERGEPIPE_KERNEL void bulk_f32_to_bf16(const float* in, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = load_u32(in + i);
    const std::uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (b >> 16) | 0x0040u;
    const std::uint32_t r = (b & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    store_u16(out + 2 * i, static_cast<std::uint16_t>(r));
  }
}

// All-ones when `cond` holds, else zero: lets the kernels blend with and/or, which every vector
// ISA has (ternaries on mixed int/float values keep GCC from vectorising on SSE2).
inline std::uint32_t mask_if(bool cond) {
  return 0u - static_cast<std::uint32_t>(cond);
}
inline std::uint32_t blend(std::uint32_t mask, std::uint32_t a, std::uint32_t b) {
  return (a & mask) | (b & ~mask);
}

MERGEPIPE_KERNEL void bulk_f16_to_f32(const std::byte* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t h = load_u16(in + 2 * i);
    const std::uint32_t sign = (h & 0x8000u) << 16;
    const std::uint32_t shifted = (h & 0x7fffu) << 13;  // exponent and mantissa in fp32 position
    const std::uint32_t exp = shifted & 0x0f800000u;
    const std::uint32_t normal = shifted + 0x38000000u;   // rebias exponent by 127 - 15
    const std::uint32_t inf_nan = shifted + 0x70000000u;  // exponent 31 -> 255, payload kept
    // Subnormal: mantissa * 2^-24, exact in fp32.
    const float sub = static_cast<float>(static_cast<std::int32_t>(h & 0x3ffu)) * 0x1p-24f;
    std::uint32_t r = blend(mask_if(exp == 0), bits_of(sub), normal);
    r = blend(mask_if(exp == 0x0f800000u), inf_nan, r);
    store_u32(out + i, r | sign);
  }
}

MERGEPIPE_KERNEL void bulk_f32_to_f16(const float* in, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = load_u32(in + i);
    const std::uint32_t sign = (b >> 16) & 0x8000u;
    const std::uint32_t abs = b & 0x7fffffffu;
    const std::uint32_t quiet_nan = 0x7e00u | ((abs >> 13) & 0x3ffu);
    // Normal range: rebias and round to nearest even on the 13 dropped bits.
    const std::uint32_t normal = (abs + 0x0fffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13;
    // Subnormal range: adding 0.5 (ulp 2^-24 = the fp16 subnormal step) rounds in hardware.
    const std::uint32_t sub = bits_of(float_of(abs) + 0.5f) - 0x3f000000u;
    // Signed compares are fine: abs < 2^31. SSE2 has no unsigned vector compare.
    const auto a = static_cast<std::int32_t>(abs);
    std::uint32_t r = blend(mask_if(a < 0x38800000), sub, normal);
    r = blend(mask_if(a >= 0x477ff000), 0x7c00u, r);
    r = blend(mask_if(a > 0x7f800000), quiet_nan, r);
    store_u16(out + 2 * i, static_cast<std::uint16_t>(r | sign));
  }
}

MERGEPIPE_KERNEL void bulk_f64_to_f32(const std::byte* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    double v;
    std::memcpy(&v, in + 8 * i, sizeof v);
    const float f = static_cast<float>(v);
    std::memcpy(out + i, &f, sizeof f);
  }
}

MERGEPIPE_KERNEL void bulk_f32_to_f64(const float* in, std::byte* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, in + i, sizeof f);
    const double v = f;
    std::memcpy(out + 8 * i, &v, sizeof v);
  }
}

}  // namespace

void convert_to_f32(DType src, const std::byte* in, float* out, std::size_t n) {
  switch (src) {
    case DType::kF32:
      if (n) std::memmove(out, in, n * 4);
      return;
    case DType::kBF16:
      bulk_bf16_to_f32(in, out, n);
      return;
    case DType::kF16:
      bulk_f16_to_f32(in, out, n);
      return;
    case DType::kF64:
      bulk_f64_to_f32(in, out, n);
      return;
    default:
      throw InputError("cannot merge tensors of dtype " + std::string(dtype_name(src)));
  }
}

void convert_delta_to_f32(DType src, const std::byte* in, const float* base, float* out,
                          std::size_t n) {
  if (src == DType::kBF16) return bulk_bf16_delta(in, base, out, n);
  convert_to_f32(src, in, out, n);
  for (std::size_t i = 0; i < n; ++i) out[i] -= base[i];
}

void convert_from_f32(DType dst, const float* in, std::byte* out, std::size_t n) {
  switch (dst) {
    case DType::kF32:
      if (n) std::memmove(out, in, n * 4);
      return;
    case DType::kBF16:
      bulk_f32_to_bf16(in, out, n);
      return;
    case DType::kF16:
      bulk_f32_to_f16(in, out, n);
      return;
    case DType::kF64:
      bulk_f32_to_f64(in, out, n);
      return;
    default:
      throw InputError("cannot write merged tensors as dtype " + std::string(dtype_name(dst)));
  }
}

}  // namespace mergepipe
