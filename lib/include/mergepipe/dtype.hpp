#pragma once
// Element types of safetensors checkpoints and the fp32 conversions the merge runs on.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mergepipe {

enum class DType : std::uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF8E4M3,
  kF8E5M2,
  kU16,
  kU32,
  kU64
};

// Parses a safetensors dtype string ("BF16", "F32", ...); nullopt for unknown strings.
std::optional<DType> parse_dtype(std::string_view name);
// The safetensors spelling of a dtype.
std::string_view dtype_name(DType dtype);
// Bytes per element.
std::size_t dtype_size(DType dtype);
// True for the floating types the merge can read and write (F64, F32, F16, BF16).
bool is_mergeable(DType dtype);

// The torch / config.json spelling of a float dtype ("bfloat16", "float16", "float32",
// "float64"); UsageError for other dtypes.
std::string torch_dtype_name(DType dtype);

// Scalar conversions. fp32 -> bf16/fp16 round to nearest even; NaN stays NaN (quiet), Inf stays
// Inf.
std::uint16_t f32_to_bf16(float value);
float bf16_to_f32(std::uint16_t bits);
std::uint16_t f32_to_f16(float value);
float f16_to_f32(std::uint16_t bits);

// Bulk conversions of n elements between little-endian stored bytes and fp32. Only mergeable
// dtypes are accepted (others throw InputError). `in`/`out` need no particular alignment.
void convert_to_f32(DType src, const std::byte* in, float* out, std::size_t n);
void convert_from_f32(DType dst, const float* in, std::byte* out, std::size_t n);
// out[i] = float(in[i]) - base[i]: an expert's delta against an fp32 base in one pass, the same
// bits as convert_to_f32 followed by a subtraction. `out` must not alias `in`.
void convert_delta_to_f32(DType src, const std::byte* in, const float* base, float* out,
                          std::size_t n);

}  // namespace mergepipe
