// Interop with an independent safetensors implementation (tests/python/st_interop.py, numpy only):
// it reads what MergePipe writes, MergePipe reads what it writes, both agree on every value and
// raw bit, and MergePipe's writer produces the reference writer's bytes.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint_test_util.hpp"
#include "mergepipe/dtype.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/safetensors.hpp"

using namespace mergepipe;
using namespace mergepipe::io;
using mergepipe::test::TempDir;

namespace {

struct ScriptRun {
  int status = -1;
  std::string out;
};

// Runs the interop script with `args`; stdout captured, stderr to a file in `dir`.
ScriptRun run_script(const TempDir& dir, const std::string& args) {
  const std::string cmd = std::string("'") + MERGEPIPE_TEST_PYTHON + "' '" +
                          MERGEPIPE_TEST_SCRIPTS + "/st_interop.py' " + args + " 2>'" +
                          dir.file("stderr.txt") + "'";
  ScriptRun r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int rc = ::pclose(pipe);
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

std::string fnv1a64_hex(std::span<const std::byte> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) h = (h ^ static_cast<std::uint8_t>(b)) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Checks the script's decoded `values` against MergePipe's own decoding of `bytes`.
void expect_values(const TensorInfo& info, std::span<const std::byte> bytes,
                   const nlohmann::json& values) {
  const std::size_t n = info.numel();
  ASSERT_EQ(values.size(), n) << info.name;
  const std::size_t size = dtype_size(info.dtype);
  std::vector<float> f32(n);
  if (is_mergeable(info.dtype) && info.dtype != DType::kF64) {
    convert_to_f32(info.dtype, bytes.data(), f32.data(), n);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::string s = values[i].get<std::string>();
    const std::byte* p = bytes.data() + i * size;
    switch (info.dtype) {
      case DType::kF64:
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16: {
        const double mine = info.dtype == DType::kF64 ? load<double>(p) : double(f32[i]);
        const double theirs = std::strtod(s.c_str(), nullptr);
        if (std::isnan(mine)) {
          EXPECT_TRUE(std::isnan(theirs)) << info.name << "[" << i << "] = " << s;
        } else {
          EXPECT_EQ(mine, theirs) << info.name << "[" << i << "] = " << s;
          EXPECT_EQ(std::signbit(mine), std::signbit(theirs)) << info.name << "[" << i << "]";
        }
        break;
      }
      case DType::kI64:
        EXPECT_EQ(load<std::int64_t>(p), std::stoll(s)) << info.name;
        break;
      case DType::kI32:
        EXPECT_EQ(load<std::int32_t>(p), std::stoll(s)) << info.name;
        break;
      case DType::kI16:
        EXPECT_EQ(load<std::int16_t>(p), std::stoll(s)) << info.name;
        break;
      case DType::kI8:
        EXPECT_EQ(load<std::int8_t>(p), std::stoll(s)) << info.name;
        break;
      case DType::kU64:
        EXPECT_EQ(load<std::uint64_t>(p), std::stoull(s)) << info.name;
        break;
      case DType::kU32:
        EXPECT_EQ(load<std::uint32_t>(p), std::stoull(s)) << info.name;
        break;
      case DType::kU16:
        EXPECT_EQ(load<std::uint16_t>(p), std::stoull(s)) << info.name;
        break;
      default:
        EXPECT_EQ(load<std::uint8_t>(p), std::stoull(s)) << info.name;
        break;
    }
  }
}

std::vector<std::byte> read_tensor(const StoredTensor& t) {
  File f(t.file, File::Mode::kRead);
  std::vector<std::byte> out(t.length);
  f.read_at(t.offset, out);
  return out;
}

}  // namespace

TEST(SafetensorsInterop, PythonReadsWhatMergePipeWrites) {
  TempDir dir;
  const std::vector<DType> dtypes = {DType::kF64, DType::kF32,  DType::kF16,    DType::kBF16,
                                     DType::kI64, DType::kI32,  DType::kI16,    DType::kI8,
                                     DType::kU8,  DType::kBool, DType::kF8E4M3, DType::kF8E5M2,
                                     DType::kU16, DType::kU32,  DType::kU64};
  std::vector<TensorInfo> tensors;
  for (DType d : dtypes) {
    const std::string n(dtype_name(d));
    tensors.push_back({"layers.1." + n, d, {3, 4}});
    tensors.push_back({"layers.10." + n, d, {}});
  }
  tensors.push_back({"embed.\xc3\xa9", DType::kBF16, {2, 2}});  // non-ASCII name
  tensors.push_back({"empty", DType::kF32, {0}});
  std::mt19937_64 rng(42);
  std::vector<std::vector<std::byte>> bytes;
  for (const auto& t : tensors) {
    std::vector<std::byte> b(t.nbytes());
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
    if (t.dtype == DType::kBool)
      for (auto& x : b) x &= std::byte{1};
    bytes.push_back(std::move(b));
  }
  // BF16 NaN with a payload, -Inf, -0 as raw bits.
  const std::uint16_t specials[4] = {0x7fa5, 0xff80, 0x8000, 0x0001};
  std::memcpy(bytes[tensors.size() - 2].data(), specials, sizeof specials);
  const std::string path = dir.file("mp.safetensors");
  write_safetensors(path, tensors,
                    std::vector<std::span<const std::byte>>(bytes.begin(), bytes.end()),
                    {{"producer", "mergepipe"}});

  const ScriptRun r = run_script(dir, "read '" + path + "'");
  ASSERT_EQ(r.status, 0) << test::read_file(dir.file("stderr.txt"));
  const nlohmann::json d = nlohmann::json::parse(r.out);
  EXPECT_EQ(d["metadata"], (nlohmann::json{{"format", "pt"}, {"producer", "mergepipe"}}));
  const SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(d["header_length"].get<std::uint64_t>(), h.header_length);
  ASSERT_EQ(d["tensors"].size(), tensors.size());
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const nlohmann::json& pt = d["tensors"][k];
    const StoredTensor& mine = h.tensors[k];  // both in offset order
    ASSERT_EQ(pt["name"].get<std::string>(), mine.info.name);
    EXPECT_EQ(pt["dtype"].get<std::string>(), dtype_name(mine.info.dtype));
    EXPECT_EQ(pt["shape"].get<std::vector<std::uint64_t>>(), mine.info.shape);
    EXPECT_EQ(pt["begin"].get<std::uint64_t>() + h.data_begin, mine.offset);
    std::size_t i = 0;
    while (tensors[i].name != mine.info.name) ++i;
    EXPECT_EQ(pt["fnv1a64"].get<std::string>(), fnv1a64_hex(bytes[i])) << mine.info.name;
    expect_values(tensors[i], bytes[i], pt["values"]);
  }
}

TEST(SafetensorsInterop, MergePipeReadsAndReproducesTheReferenceWriter) {
  TempDir dir;
  const std::string py_path = dir.file("py.safetensors");
  const ScriptRun r = run_script(dir, "write '" + py_path + "' --seed 7");
  ASSERT_EQ(r.status, 0) << test::read_file(dir.file("stderr.txt"));
  const nlohmann::json d = nlohmann::json::parse(r.out);

  const SafetensorsHeader h = read_safetensors_header(py_path);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), d["tensors"].size());
  std::vector<TensorInfo> infos;
  std::vector<std::vector<std::byte>> bytes;
  bool saw_bf16_nan = false;
  for (std::size_t k = 0; k < h.tensors.size(); ++k) {
    const StoredTensor& t = h.tensors[k];
    const nlohmann::json& pt = d["tensors"][k];
    ASSERT_EQ(t.info.name, pt["name"].get<std::string>());
    EXPECT_EQ(dtype_name(t.info.dtype), pt["dtype"].get<std::string>());
    EXPECT_EQ(t.info.shape, pt["shape"].get<std::vector<std::uint64_t>>());
    EXPECT_EQ(t.offset, h.data_begin + pt["begin"].get<std::uint64_t>());
    std::vector<std::byte> b = read_tensor(t);
    EXPECT_EQ(fnv1a64_hex(b), pt["fnv1a64"].get<std::string>()) << t.info.name;
    expect_values(t.info, b, pt["values"]);
    if (t.info.dtype == DType::kBF16 && !b.empty() && load<std::uint16_t>(b.data()) == 0x7fc1)
      saw_bf16_nan = true;
    infos.push_back(t.info);
    bytes.push_back(std::move(b));
  }
  EXPECT_TRUE(saw_bf16_nan) << "the script's BF16 NaN payload did not come through";

  // Same tensors, given in a different order: MergePipe's file is byte-identical.
  std::reverse(infos.begin(), infos.end());
  std::reverse(bytes.begin(), bytes.end());
  const std::string mp_path = dir.file("mp.safetensors");
  write_safetensors(mp_path, infos,
                    std::vector<std::span<const std::byte>>(bytes.begin(), bytes.end()));
  const std::string theirs = test::read_file(py_path);
  const std::string ours = test::read_file(mp_path);
  EXPECT_EQ(ours.size(), theirs.size());
  EXPECT_TRUE(ours == theirs) << "header ours:   " << ours.substr(8, h.header_length)
                              << "\nheader theirs: " << theirs.substr(8, h.header_length);
}

TEST(SafetensorsInterop, BothReadersRejectTheSameMalformedFiles) {
  TempDir dir;
  const std::string t = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":";
  const std::vector<std::string> bad = {
      test::raw_safetensors("{\"a\":" + t + "[0,4]},\"a\":" + t + "[0,4]}}", 4),    // duplicate
      test::raw_safetensors("{\"a\":" + t + "[0,4]},\"b\":" + t + "[8,12]}}", 12),  // gap
      test::raw_safetensors("{\"a\":" + t + "[0,4]}}", 5),                          // trailing
      test::raw_safetensors("{\"a\":" + t + "[0,4]}}", 3),                          // truncated
      test::raw_safetensors("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}",
                            4),
      test::raw_safetensors("{\"__metadata__\":{\"format\":2}}", 0),
      test::u64_le(200) + "{}",
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    const std::string path = dir.file("bad" + std::to_string(i) + ".safetensors");
    test::write_file(path, bad[i]);
    EXPECT_THROW(read_safetensors_header(path), InputError) << i;
    EXPECT_EQ(run_script(dir, "read '" + path + "'").status, 2) << i;
  }
  // And both accept the well-formed variant.
  const std::string good = dir.file("good.safetensors");
  test::write_file(good, test::raw_safetensors("{\"a\":" + t + "[0,4]}}", 4));
  EXPECT_NO_THROW(read_safetensors_header(good));
  EXPECT_EQ(run_script(dir, "read '" + good + "'").status, 0);
}
