// dtype conversions against an independent reference: values are decoded with ldexp and rounded
// with nearbyintl in long double (exact here: every step is a power-of-two scaling), never with
// the bit tricks the implementation uses.
#include "mergepipe/dtype.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mergepipe/error.hpp"

using namespace mergepipe;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// A small float format: `mant_bits` stored mantissa bits, exponent bias, and the quantum of its
// subnormals (2^min_quantum_exp).
struct Format {
  int mant_bits;
  int exp_bits;
  int min_quantum_exp;  // log2 of the subnormal step
  long double max_finite;
};
const Format kBF16{7, 8, -133, std::ldexp(255.0L, 120)};  // (2 - 2^-7) * 2^127
const Format kF16{10, 5, -24, 65504.0L};

// Decodes bits of `fmt` by formula: (2^m + mant) * 2^(exp - bias - m), subnormals mant * 2^qmin.
long double ref_decode(const Format& fmt, std::uint32_t bits) {
  const std::uint32_t mant = bits & ((1u << fmt.mant_bits) - 1);
  const std::uint32_t exp = (bits >> fmt.mant_bits) & ((1u << fmt.exp_bits) - 1);
  const bool negative = (bits >> (fmt.mant_bits + fmt.exp_bits)) & 1u;
  long double v;
  if (exp == (1u << fmt.exp_bits) - 1) {
    v = mant == 0 ? std::numeric_limits<long double>::infinity()
                  : std::numeric_limits<long double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<long double>(mant), fmt.min_quantum_exp);
  } else {
    v = std::ldexp(static_cast<long double>((1u << fmt.mant_bits) + mant),
                   fmt.min_quantum_exp + static_cast<int>(exp) - 1);
  }
  return negative ? -v : v;
}

// Rounds a finite value to the nearest representable value of `fmt`, ties to even, overflowing to
// infinity (as IEEE round-to-nearest does: anything at or above max + half an ulp).
long double ref_round(const Format& fmt, long double x) {
  if (x == 0) return x;
  int e;
  (void)std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int quantum_exp = std::max(e - 1 - fmt.mant_bits, fmt.min_quantum_exp);
  const long double r = std::ldexp(std::nearbyintl(std::ldexp(x, -quantum_exp)), quantum_exp);
  if (std::fabs(r) > fmt.max_finite)
    return std::copysign(std::numeric_limits<long double>::infinity(), x);
  return r;
}

// Every non-NaN bit pattern of a 16-bit format, keyed by value, to encode reference results.
struct Encoder {
  std::vector<std::pair<long double, std::uint16_t>> table;
  explicit Encoder(const Format& fmt) {
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const long double v = ref_decode(fmt, b);
      if (std::isnan(v)) continue;
      if (v == 0 && std::signbit(v)) continue;  // -0 handled by sign below
      table.emplace_back(v, static_cast<std::uint16_t>(b));
    }
    std::sort(table.begin(), table.end());
  }
  std::uint16_t encode(long double v, bool negative_zero_sign) const {
    if (v == 0) return negative_zero_sign ? 0x8000 : 0;
    auto it = std::lower_bound(table.begin(), table.end(), std::make_pair(v, std::uint16_t{0}));
    EXPECT_TRUE(it != table.end() && it->first == v)
        << "not representable: " << static_cast<double>(v);
    return it->second;
  }
};

bool is_quiet_nan16(const Format& fmt, std::uint16_t bits) {
  const std::uint32_t exp_mask = ((1u << fmt.exp_bits) - 1) << fmt.mant_bits;
  const std::uint32_t quiet = 1u << (fmt.mant_bits - 1);
  return (bits & exp_mask) == exp_mask && (bits & quiet) != 0;
}

// Checks `got` against the reference rounding of `f` to `fmt` (NaN: quiet NaN, same sign).
void check_round(const Format& fmt, const Encoder& enc, float f, std::uint16_t got,
                 const char* what) {
  if (std::isnan(f)) {
    ASSERT_TRUE(is_quiet_nan16(fmt, got))
        << what << " of NaN " << std::hex << bits_of(f) << " gave " << got;
    ASSERT_EQ(got >> 15, bits_of(f) >> 31) << what << ": NaN sign lost";
    return;
  }
  const long double r = ref_round(fmt, static_cast<long double>(f));
  const std::uint16_t want = enc.encode(r, std::signbit(f));
  ASSERT_EQ(got, want) << what << " of " << std::hexfloat << f << " (bits " << std::hex
                       << bits_of(f) << ")";
}

// Random fp32 bit patterns mixed with the hard cases: exact ties of both formats, their
// neighbours, subnormals, values around the fp16 overflow threshold, Inf and NaN.
std::vector<float> sample_floats() {
  std::vector<float> v;
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 2'000'000; ++i) v.push_back(float_of(static_cast<std::uint32_t>(rng())));
  // Gaussian weights and small deltas, as real checkpoints hold.
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int i = 0; i < 500'000; ++i) v.push_back(normal(rng));
  for (int i = 0; i < 200'000; ++i) v.push_back(normal(rng) * 1e-4f);
  // fp32 subnormals.
  for (int i = 0; i < 100'000; ++i)
    v.push_back(float_of(static_cast<std::uint32_t>(rng()) & 0x807fffffu));
  // Every bf16 midpoint (exact tie) and its two fp32 neighbours.
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const std::uint32_t mid = (h << 16) | 0x8000u;
    for (std::uint32_t b : {mid - 1, mid, mid + 1}) v.push_back(float_of(b));
  }
  // Every fp16 midpoint: normals (13 dropped bits), subnormals ((m + 1/2) * 2^-24).
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    const long double lo = ref_decode(kF16, h), hi = ref_decode(kF16, h + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in fp32
    for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      v.push_back(m);
      v.push_back(-m);
    }
  }
  for (float f :
       {65504.0f, 65519.0f, 65519.996f, 65520.0f, 65536.0f, 1e30f, 5.96e-8f, 2.98e-8f,
        2.9802322e-8f, 6.1035156e-5f, 0.0f, -0.0f, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::signaling_NaN(), -std::numeric_limits<float>::quiet_NaN()})
    v.push_back(f);
  v.push_back(float_of(0x7f800001u));  // signalling NaN, smallest payload
  v.push_back(float_of(0xff800001u));
  v.push_back(float_of(0x7f7fffffu));  // rounds to bf16 infinity
  return v;
}

const std::vector<float>& samples() {
  static const std::vector<float> s = sample_floats();
  return s;
}

}  // namespace

TEST(DType, NamesSizesAndParsingForEveryDtype) {
  struct Row {
    DType dtype;
    const char* name;
    std::size_t size;
    bool mergeable;
  };
  const Row rows[] = {
      {DType::kF64, "F64", 8, true},         {DType::kF32, "F32", 4, true},
      {DType::kF16, "F16", 2, true},         {DType::kBF16, "BF16", 2, true},
      {DType::kI64, "I64", 8, false},        {DType::kI32, "I32", 4, false},
      {DType::kI16, "I16", 2, false},        {DType::kI8, "I8", 1, false},
      {DType::kU8, "U8", 1, false},          {DType::kBool, "BOOL", 1, false},
      {DType::kF8E4M3, "F8_E4M3", 1, false}, {DType::kF8E5M2, "F8_E5M2", 1, false},
      {DType::kU16, "U16", 2, false},        {DType::kU32, "U32", 4, false},
      {DType::kU64, "U64", 8, false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(dtype_name(r.dtype), r.name);
    EXPECT_EQ(dtype_size(r.dtype), r.size) << r.name;
    EXPECT_EQ(is_mergeable(r.dtype), r.mergeable) << r.name;
    ASSERT_TRUE(parse_dtype(r.name).has_value()) << r.name;
    EXPECT_EQ(*parse_dtype(r.name), r.dtype);
  }
  for (const char* bad : {"", "bf16", "float32", "F8", "F4", "C64", "BF16 ", " F32"})
    EXPECT_FALSE(parse_dtype(bad).has_value()) << '"' << bad << '"';
}

TEST(DType, Bf16ToF32ExhaustiveAndRoundTrip) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    const long double want = ref_decode(kBF16, h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0);
      ASSERT_TRUE(is_quiet_nan16(kBF16, f32_to_bf16(f))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<long double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
    ASSERT_EQ(f32_to_bf16(f), h) << "round trip of " << std::hex << h;
  }
}

TEST(DType, F16ToF32ExhaustiveAndRoundTrip) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    const long double want = ref_decode(kF16, h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0);
      ASSERT_TRUE(is_quiet_nan16(kF16, f32_to_f16(f))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<long double>(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000u) != 0) << std::hex << h;
    ASSERT_EQ(f32_to_f16(f), h) << "round trip of " << std::hex << h;
  }
}

TEST(DType, F32ToBf16MatchesReferenceOnMillionsOfSamples) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  const Encoder enc(kBF16);
  for (float f : samples()) {
    check_round(kBF16, enc, f, f32_to_bf16(f), "f32_to_bf16");
    if (HasFatalFailure()) return;
  }
}

TEST(DType, F32ToF16MatchesReferenceOnMillionsOfSamples) {
  const Encoder enc(kF16);
  for (float f : samples()) {
    check_round(kF16, enc, f, f32_to_f16(f), "f32_to_f16");
    if (HasFatalFailure()) return;
  }
}

TEST(DType, KnownValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(float_of(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(float_of(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80);  // FLT_MAX overflows to inf
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to 2^16 rounds to even = inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0 rounds to even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta -> 2
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
}

// Bulk conversions: every length 0..70 at every byte misalignment, then one large buffer of
// random bit patterns; each must give exactly the scalar results.
TEST(DType, BulkEqualsScalarOnOddLengthsAndUnalignedPointers) {
  std::mt19937_64 rng(99);
  const std::vector<float>& s = samples();
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{15},
        std::size_t{17}, std::size_t{31}, std::size_t{33}, std::size_t{63}, std::size_t{65},
        std::size_t{70}, std::size_t{1'000'003}}) {
    for (std::size_t misalign = 0; misalign < 4; ++misalign) {
      const std::size_t start = rng() % (s.size() - n);
      // fp32 input at a misaligned address.
      std::vector<std::byte> fin_store(n * 4 + 8);
      float* fin = reinterpret_cast<float*>(fin_store.data() + misalign);
      std::memcpy(fin, s.data() + start, n * 4);
      for (DType dt : {DType::kBF16, DType::kF16}) {
        std::vector<std::byte> out(n * 2 + 8, std::byte{0xAB});
        convert_from_f32(dt, fin, out.data() + misalign, n);
        for (std::size_t i = 0; i < n; ++i) {
          float f;
          std::memcpy(&f, fin_store.data() + misalign + 4 * i, 4);
          const std::uint16_t want = dt == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
          std::uint16_t got;
          std::memcpy(&got, out.data() + misalign + 2 * i, 2);
          ASSERT_EQ(got, want) << dtype_name(dt) << " n=" << n << " i=" << i;
        }
        // Nothing written past the end.
        ASSERT_EQ(out[misalign + 2 * n], std::byte{0xAB});
        // And back: 16-bit random patterns to fp32.
        std::vector<std::byte> hin(n * 2 + 8);
        for (auto& b : hin) b = static_cast<std::byte>(rng());
        std::vector<std::byte> fout_store(n * 4 + 8, std::byte{0xCD});
        float* fout = reinterpret_cast<float*>(fout_store.data() + misalign);
        convert_to_f32(dt, hin.data() + misalign, fout, n);
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t h;
          std::memcpy(&h, hin.data() + misalign + 2 * i, 2);
          const float want = dt == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
          float got;
          std::memcpy(&got, fout_store.data() + misalign + 4 * i, 4);
          ASSERT_EQ(bits_of(got), bits_of(want)) << dtype_name(dt) << " n=" << n << " i=" << i;
        }
        ASSERT_EQ(fout_store[misalign + 4 * n], std::byte{0xCD});
      }
      // F32 is a bit-exact copy (NaN payloads included); F64 widens and narrows as the CPU does.
      std::vector<std::byte> f32out(n * 4 + 8);
      convert_from_f32(DType::kF32, fin, f32out.data() + misalign, n);
      ASSERT_EQ(std::memcmp(f32out.data() + misalign, fin, n * 4), 0);
      std::vector<std::byte> f64out(n * 8 + 8);
      convert_from_f32(DType::kF64, fin, f64out.data() + misalign, n);
      std::vector<std::byte> back_store(n * 4 + 8);
      float* back = reinterpret_cast<float*>(back_store.data() + misalign);
      convert_to_f32(DType::kF64, f64out.data() + misalign, back, n);
      for (std::size_t i = 0; i < n; ++i) {
        float f, g;
        double d;
        std::memcpy(&f, fin_store.data() + misalign + 4 * i, 4);
        std::memcpy(&d, f64out.data() + misalign + 8 * i, 8);
        std::memcpy(&g, back_store.data() + misalign + 4 * i, 4);
        if (std::isnan(f)) {
          ASSERT_TRUE(std::isnan(d) && std::isnan(g));
        } else {
          ASSERT_EQ(d, static_cast<double>(f));
          ASSERT_EQ(bits_of(g), bits_of(f));
        }
      }
    }
  }
}

TEST(DType, F64NarrowingRoundsToNearest) {
  const double one_plus_half_ulp = 1.0 + std::ldexp(1.0, -24);  // tie between 1 and 1+2^-23
  const double vals[] = {one_plus_half_ulp, std::nextafter(one_plus_half_ulp, 2.0), 1e300, -1e-300,
                         3.141592653589793};
  std::byte in[sizeof vals];
  std::memcpy(in, vals, sizeof vals);
  float out[5];
  convert_to_f32(DType::kF64, in, out, 5);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::nextafter(1.0f, 2.0f));
  EXPECT_EQ(out[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[3], -0.0f);
  EXPECT_TRUE(std::signbit(out[3]));
  EXPECT_EQ(out[4], 3.14159265f);
}

TEST(DType, NonMergeableDtypesAreRejected) {
  std::byte buf[16] = {};
  float f[2] = {};
  for (DType dt : {DType::kI32, DType::kU8, DType::kBool, DType::kF8E4M3, DType::kI64}) {
    EXPECT_THROW(convert_to_f32(dt, buf, f, 2), InputError) << dtype_name(dt);
    EXPECT_THROW(convert_from_f32(dt, f, buf, 2), InputError) << dtype_name(dt);
  }
}
