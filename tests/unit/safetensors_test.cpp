#include "mergepipe/io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "checkpoint_test_util.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/file.hpp"

using namespace mergepipe;
using namespace mergepipe::io;
using mergepipe::test::error_message;
using mergepipe::test::raw_safetensors;
using mergepipe::test::TempDir;
using mergepipe::test::u64_le;

namespace {

const std::vector<DType> kAllDTypes = {DType::kF64, DType::kF32,  DType::kF16,    DType::kBF16,
                                       DType::kI64, DType::kI32,  DType::kI16,    DType::kI8,
                                       DType::kU8,  DType::kBool, DType::kF8E4M3, DType::kF8E5M2,
                                       DType::kU16, DType::kU32,  DType::kU64};

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

std::vector<std::byte> read_back(const StoredTensor& t) {
  File f(t.file, File::Mode::kRead);
  std::vector<std::byte> out(t.length);
  f.read_at(t.offset, out);
  return out;
}

}  // namespace

TEST(Safetensors, RoundTripEveryDType) {
  TempDir dir;
  std::vector<TensorInfo> tensors;
  std::vector<std::vector<std::byte>> bytes;
  std::uint64_t seed = 1;
  for (DType d : kAllDTypes) {
    const std::string n(dtype_name(d));
    tensors.push_back({"m." + n + ".weight", d, {3, 5}});
    tensors.push_back({"v." + n, d, {7}});
    tensors.push_back({"s." + n, d, {}});      // scalar
    tensors.push_back({"z." + n, d, {0, 4}});  // zero-size
  }
  for (const auto& t : tensors) bytes.push_back(random_bytes(t.nbytes(), seed++));
  // BF16 NaN / Inf / -0 patterns must survive as raw bits.
  const std::uint16_t specials[7] = {0x7fc1, 0xff80, 0x7f80, 0x8000, 0x0001, 0x7fff, 0xffff};
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == "v.BF16") std::memcpy(bytes[i].data(), specials, sizeof specials);
  }
  std::vector<std::span<const std::byte>> spans(bytes.begin(), bytes.end());
  const std::string path = dir.file("all.safetensors");

  const ByteCounts before = global_byte_counters().snapshot();
  write_safetensors(path, tensors, spans, {{"producer", "unit-test"}});
  const ByteCounts written = global_byte_counters().snapshot();
  const SafetensorsHeader h = read_safetensors_header(path);
  const ByteCounts after = global_byte_counters().snapshot();

  EXPECT_EQ(written.output_written - before.output_written, std::filesystem::file_size(path));
  EXPECT_EQ(after.other - written.other, 8 + h.header_length);  // header only, no data bytes
  EXPECT_EQ(h.header_length % 8, 0u);
  EXPECT_EQ(h.data_begin, 8 + h.header_length);
  EXPECT_EQ(h.file_size, std::filesystem::file_size(path));
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("producer"), "unit-test");
  const std::string file = test::read_file(path);
  EXPECT_EQ(h.header_hash, hash128_hex(file.data(), 8 + h.header_length));
  ASSERT_EQ(h.tensors.size(), tensors.size());

  std::uint64_t expected_offset = h.data_begin;
  for (const StoredTensor& t : h.tensors) {
    EXPECT_EQ(t.file, path);
    EXPECT_EQ(t.offset, expected_offset) << t.info.name;  // sorted by offset, back to back
    expected_offset += t.length;
    std::size_t i = 0;
    while (tensors[i].name != t.info.name) ++i;
    EXPECT_EQ(t.info, tensors[i]);
    EXPECT_EQ(t.length, tensors[i].nbytes());
    EXPECT_EQ(read_back(t), bytes[i]) << t.info.name;
  }
  EXPECT_EQ(expected_offset, h.file_size);
  // No temp file left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const std::vector<std::byte> four(4);
  const std::vector<std::span<const std::byte>> one = {four};
  EXPECT_THROW(write_safetensors(dir.file("a.safetensors"), {{"t", DType::kF32, {2}}}, one),
               UsageError);  // 4 bytes for 8 needed
  EXPECT_THROW(write_safetensors(dir.file("a.safetensors"), {{"t", DType::kF32, {1}}}, {}),
               UsageError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.safetensors")));
  EXPECT_THROW(
      write_safetensors(dir.path() + "/missing/a.safetensors", {{"t", DType::kF32, {1}}}, one),
      IoError);
}

TEST(SafetensorsLayout, ReferenceOrderPaddingAndMetadata) {
  const std::vector<TensorInfo> tensors = {
      {"b", DType::kF32, {2}},       {"a", DType::kBF16, {3}},       {"z", DType::kF64, {1}},
      {"c", DType::kI8, {5}},        {"d", DType::kF16, {1}},        {"e", DType::kU64, {1}},
      {"layer.2", DType::kF32, {1}}, {"layer.10", DType::kF32, {1}}, {"B", DType::kF32, {1}},
  };
  const SafetensorsLayout l = layout_safetensors(tensors, {{"k", "v"}});
  std::vector<std::string> order;
  for (const auto& t : l.tensors) order.push_back(t.info.name);
  // Dtype rank descending (the reference's enum: U64 > F64, F32, BF16 > F16, I8), then bytes.
  const std::vector<std::string> expected = {"e",       "z", "B", "b", "layer.10",
                                             "layer.2", "a", "d", "c"};
  EXPECT_EQ(order, expected);

  const std::uint64_t n = l.header_bytes.size() - 8;
  EXPECT_EQ(l.header_bytes.substr(0, 8), u64_le(n));
  EXPECT_EQ(n % 8, 0u);
  const std::string json = l.header_bytes.substr(8);
  EXPECT_EQ(json.rfind("{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},\"e\":{\"dtype\":\"U64\","
                       "\"shape\":[1],\"data_offsets\":[0,8]},\"z\":",
                       0),
            0u)
      << json;
  const std::size_t end = json.find_last_not_of(' ');
  EXPECT_EQ(json[end], '}');
  EXPECT_LT(json.size() - end - 1, 8u);  // at most 7 pad spaces

  std::uint64_t offset = 8 + n;
  for (const auto& t : l.tensors) {
    EXPECT_EQ(t.offset, offset);
    offset += t.length;
  }
  EXPECT_EQ(l.file_size, offset);
}

TEST(SafetensorsLayout, ExactBytesOfASimpleFile) {
  const SafetensorsLayout l = layout_safetensors({{"attn.0", DType::kF32, {1, 2, 3}}});
  const std::string json =
      "{\"__metadata__\":{\"format\":\"pt\"},\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],"
      "\"data_offsets\":[0,24]}}";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(l.header_bytes, u64_le(padded.size()) + padded);
  EXPECT_EQ(l.file_size, 8 + padded.size() + 24);
}

TEST(SafetensorsLayout, PaddingForEveryRemainder) {
  for (std::size_t len = 1; len <= 8; ++len) {
    const SafetensorsLayout l = layout_safetensors({{std::string(len, 'x'), DType::kU8, {1}}});
    EXPECT_EQ((l.header_bytes.size() - 8) % 8, 0u);
    // The layout parses back with our own reader.
    const SafetensorsHeader h =
        parse_safetensors_header(std::as_bytes(std::span(l.header_bytes)), l.file_size, "layout");
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.tensors[0].offset, l.tensors[0].offset);
  }
}

TEST(SafetensorsLayout, RejectsReservedAndDuplicateNamesAndOtherFormats) {
  const std::string reserved = error_message<UsageError>([] {
    layout_safetensors({{"__metadata__", DType::kF32, {1}}});
  });
  EXPECT_NE(reserved.find("__metadata__"), std::string::npos);
  const std::string dup = error_message<UsageError>([] {
    layout_safetensors({{"w", DType::kF32, {1}}, {"w", DType::kF16, {1}}});
  });
  EXPECT_NE(dup.find("duplicate tensor name 'w'"), std::string::npos);
  EXPECT_THROW(layout_safetensors({{"w", DType::kF32, {1}}}, {{"format", "tf"}}), UsageError);
  EXPECT_NO_THROW(layout_safetensors({{"w", DType::kF32, {1}}}, {{"format", "pt"}}));
}

// ---- Reader: accepted inputs ----

namespace {

SafetensorsHeader read_bytes(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("t.safetensors");
  test::write_file(path, bytes);
  return read_safetensors_header(path);
}

}  // namespace

TEST(SafetensorsReader, AcceptsLeadingWhitespaceAnyJsonOrderScalarsAndEmptyTensors) {
  TempDir dir;
  const std::string json =
      " \n\t{\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
      "\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[8,8]},"
      "\"a\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8],\"extra\":1},"
      "\"__metadata__\":{\"format\":\"pt\"}}   ";
  const SafetensorsHeader h = read_bytes(dir, raw_safetensors(json, 12));
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].info.name, "a");
  EXPECT_EQ(h.tensors[1].info.name, "e");  // zero-size sorts before "b" at the same offset
  EXPECT_EQ(h.tensors[2].info.name, "b");
  EXPECT_EQ(h.tensors[2].info.shape.size(), 0u);
  EXPECT_EQ(h.tensors[2].offset, 8 + json.size() + 8);
  EXPECT_EQ(h.tensors[1].length, 0u);
}

TEST(SafetensorsReader, AcceptsAnEmptyFile) {
  TempDir dir;
  const SafetensorsHeader h = read_bytes(dir, raw_safetensors("{}      ", 0));
  EXPECT_TRUE(h.tensors.empty());
  EXPECT_TRUE(h.metadata.empty());
}

// ---- Reader: one test per malformed case ----

namespace {

// Writes `bytes` as a file and checks that reading it throws InputError naming the file and
// containing `problem`.
void expect_rejected(const std::string& bytes, const std::string& problem) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  test::write_file(path, bytes);
  const std::string msg = error_message<InputError>([&] { read_safetensors_header(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(problem), std::string::npos) << "expected '" << problem << "' in: " << msg;
}

std::string one_tensor(const std::string& body) {
  return "{\"t\":{" + body + "}}";
}

}  // namespace

TEST(SafetensorsReader, RejectsFileShorterThan8Bytes) {
  expect_rejected("", "file is 0 bytes, shorter than the 8-byte header length field");
  expect_rejected("abcdefg", "file is 7 bytes");
}

TEST(SafetensorsReader, RejectsAbsurdHeaderLength) {
  expect_rejected(u64_le(100'000'001) + "{}", "header length 100000001 exceeds the limit");
  expect_rejected(u64_le(UINT64_MAX) + "{}", "exceeds the limit");
}

TEST(SafetensorsReader, RejectsHeaderBeyondFile) {
  expect_rejected(u64_le(100) + "{}", "needs 108 bytes but the file has only 10");
}

TEST(SafetensorsReader, RejectsInvalidUtf8) {
  expect_rejected(raw_safetensors("{\"t\xff\":1}", 0), "header is not valid UTF-8");
  expect_rejected(raw_safetensors("{\"\xc0\xaf\":1}", 0), "not valid UTF-8");      // overlong
  expect_rejected(raw_safetensors("{\"\xed\xa0\x80\":1}", 0), "not valid UTF-8");  // surrogate
  expect_rejected(raw_safetensors("{\"\xe2\x82\":1}", 0), "not valid UTF-8");      // cut short
}

TEST(SafetensorsReader, RejectsNonJson) {
  expect_rejected(raw_safetensors("{\"a\":", 0), "header: not valid JSON");
  expect_rejected(raw_safetensors("{}\x01", 0), "not valid JSON");
}

TEST(SafetensorsReader, RejectsNonObjectHeader) {
  expect_rejected(raw_safetensors("[1,2]   ", 0), "header is not a JSON object");
}

TEST(SafetensorsReader, RejectsNonStringMetadataValue) {
  expect_rejected(raw_safetensors("{\"__metadata__\":{\"format\":1}}", 0),
                  "__metadata__ value of 'format' is not a string");
}

TEST(SafetensorsReader, RejectsTensorNamedMetadata) {
  expect_rejected(raw_safetensors("{\"__metadata__\":[\"F32\"]}", 0),
                  "\"__metadata__\" must be an object of string values");
  // A tensor-shaped entry under the reserved name is not metadata either.
  expect_rejected(
      raw_safetensors("{\"__metadata__\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      4),
      "is not a string: [0,4] (a tensor may not be named __metadata__)");
}

TEST(SafetensorsReader, RejectsEntryThatIsNotAnObject) {
  expect_rejected(raw_safetensors("{\"t\":5}", 0), "tensor 't': entry is not a JSON object");
}

TEST(SafetensorsReader, RejectsMissingKeys) {
  expect_rejected(raw_safetensors(one_tensor("\"shape\":[1],\"data_offsets\":[0,4]"), 4),
                  "tensor 't': missing \"dtype\"");
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"data_offsets\":[0,4]"), 4),
                  "tensor 't': missing \"shape\"");
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1]"), 4),
                  "tensor 't': missing \"data_offsets\"");
}

TEST(SafetensorsReader, RejectsNonStringDtype) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]"), 4),
      "tensor 't': dtype is not a string");
}

TEST(SafetensorsReader, RejectsUnknownDtype) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]"), 1),
      "tensor 't': unknown dtype \"F4\"");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]"), 4),
      "unknown dtype \"f32\"");
}

TEST(SafetensorsReader, RejectsShapeNotAnArray) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]"), 4),
      "tensor 't': shape is not an array");
}

TEST(SafetensorsReader, RejectsNegativeOrFractionalShape) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]"), 4),
      "tensor 't': shape entries must be non-negative integers, found -1");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]"), 4),
      "found 1.5");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]"), 4),
      "found 1.0");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]"), 4),
      "found \"1\"");
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1e0],"
                                             "\"data_offsets\":[0,4]"),
                                  4),
                  "shape entries must be non-negative integers");
}

TEST(SafetensorsReader, RejectsDataOffsetsNotTwoIntegers) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]"), 4),
      "tensor 't': data_offsets must be an array of two integers");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]"), 4),
      "data_offsets must be an array of two integers");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}"), 4),
      "data_offsets must be an array of two integers");
}

TEST(SafetensorsReader, RejectsNegativeOrFractionalOffsets) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"), 4),
      "tensor 't': data_offsets must be non-negative integers");
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]"), 4),
      "data_offsets must be non-negative integers, found [0,4.0]");
  // Beyond 64 bits nlohmann yields a float: still rejected as not an integer.
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],"
                                             "\"data_offsets\":[0,18446744073709551616]"),
                                  4),
                  "data_offsets must be non-negative integers");
}

TEST(SafetensorsReader, RejectsDuplicateTensorNames) {
  const std::string entry = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  expect_rejected(raw_safetensors("{\"t\":" + entry + ",\"t\":" + entry + "}", 4),
                  "duplicate tensor name 't'");
  expect_rejected(raw_safetensors("{\"__metadata__\":{},\"__metadata__\":{}}", 0),
                  "duplicate tensor name '__metadata__'");
}

TEST(SafetensorsReader, RejectsDuplicateKeysInsideAnEntry) {
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],"
                                             "\"data_offsets\":[0,4]"),
                                  4),
                  "duplicate key 'dtype' in 't'");
  expect_rejected(raw_safetensors("{\"__metadata__\":{\"format\":\"pt\",\"format\":\"tf\"}}", 0),
                  "duplicate key 'format' in '__metadata__'");
}

TEST(SafetensorsReader, RejectsFirstTensorNotAtZero) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]"), 8),
      "tensor 't' is first in the data section but starts at byte 4, not 0");
}

TEST(SafetensorsReader, RejectsGap) {
  expect_rejected(
      raw_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                      12),
      "gap in the data section: bytes [4, 8) between tensor 'a' and tensor 'b'");
}

TEST(SafetensorsReader, RejectsOverlap) {
  expect_rejected(raw_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                  8),
                  "tensor 'b': data_offsets [4, 8] overlap tensor 'a', which ends at 8");
}

TEST(SafetensorsReader, RejectsEndBeforeBegin) {
  expect_rejected(raw_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
                                  4),
                  "tensor 'b': data_offsets [4, 0] end before they begin");
}

TEST(SafetensorsReader, RejectsShapeProductOverflow) {
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                                             "\"data_offsets\":[0,4]"),
                                  4),
                  "tensor 't': element count of shape [4294967296, 4294967296] overflows");
}

TEST(SafetensorsReader, RejectsByteSizeOverflow) {
  // 2^62 elements fit in 64 bits; times 4 bytes they do not.
  expect_rejected(raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                                             "\"data_offsets\":[0,4]"),
                                  4),
                  "tensor 't': byte size of shape [4611686018427387904] x F32 overflows");
}

TEST(SafetensorsReader, RejectsSizeMismatch) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]"), 8),
      "tensor 't': data_offsets [0, 8] span 8 bytes but F32 [3] needs 12");
}

TEST(SafetensorsReader, RejectsTrailingBytes) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"), 7),
      "3 trailing bytes after the last tensor");
}

TEST(SafetensorsReader, RejectsTruncatedData) {
  expect_rejected(
      raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]"), 10),
      "tensor 't': data_offsets [0, 16] reach past the end of the data section (10 bytes after the "
      "header; truncated?)");
}

TEST(SafetensorsReader, ParseFromBufferNamesTheGivenPath) {
  const std::string bytes = raw_safetensors("{}", 0);
  const auto span = std::as_bytes(std::span(bytes));
  const std::string msg = error_message<InputError>(
      [&] { parse_safetensors_header(span, bytes.size() + 5, "some/file.safetensors"); });
  EXPECT_NE(msg.find("some/file.safetensors"), std::string::npos);
  EXPECT_NE(msg.find("5 trailing bytes"), std::string::npos);
  // A buffer shorter than 8 + N is refused rather than read past.
  EXPECT_THROW(parse_safetensors_header(span.first(9), bytes.size(), "f"), InputError);
}

TEST(SafetensorsReader, RejectsAFolder) {
  TempDir dir;
  EXPECT_THROW(read_safetensors_header(dir.path()), InputError);
  EXPECT_THROW(read_safetensors_header(dir.file("missing.safetensors")), IoError);
}

TEST(SafetensorsReader, HostileValuesGiveShortOneLineMessages) {
  // A control character in a name is shown escaped; a huge name and a huge value are cut.
  expect_rejected(
      raw_safetensors("{\"a\\nb\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
      "tensor 'a\\x0ab': unknown dtype \"Q4\"");
  const std::string long_name(5000, 'n');
  const std::string long_shape = "[" + std::string(20000, '[') + std::string(20000, ']') + "]";
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  test::write_file(path, raw_safetensors(one_tensor("\"dtype\":\"F32\",\"shape\":" + long_shape +
                                                    ",\"data_offsets\":[0,4]"),
                                         4));
  std::string msg = error_message<InputError>([&] { read_safetensors_header(path); });
  EXPECT_NE(msg.find("shape entries must be non-negative integers, found [[[[[...]]]]"),
            std::string::npos)
      << msg;
  EXPECT_LT(msg.size(), path.size() + 200);
  test::write_file(path, raw_safetensors("{\"" + long_name +
                                             "\":{\"dtype\":\"Q4\",\"shape\":[1],"
                                             "\"data_offsets\":[0,1]}}",
                                         1));
  msg = error_message<InputError>([&] { read_safetensors_header(path); });
  EXPECT_NE(msg.find("tensor '" + std::string(200, 'n') + "...': unknown dtype"), std::string::npos)
      << msg.substr(0, 300);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}
