// Catalog core: block statistics, structure matching, family id, storage round trip, staleness,
// and that catalog.h5 is readable by h5py.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>

#include "mergepipe/block_stats.hpp"
#include "mergepipe/catalog.hpp"
#include "mergepipe/dtype.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/catalog_prefetch.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hdf5_handle.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/merge_spec.hpp"
#include "mergepipe/planner.hpp"
#include "mergepipe/structure_match.hpp"
#include "unit/checkpoint_test_util.hpp"

using namespace mergepipe;
using mergepipe::test::error_message;
using mergepipe::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<std::byte> bf16_bytes(const std::vector<float>& values) {
  std::vector<std::byte> out(values.size() * 2);
  convert_from_f32(DType::kBF16, values.data(), out.data(), values.size());
  return out;
}

// Octave by the definition in catalog.hpp, computed independently with log2.
int reference_octave(double magnitude) {
  if (magnitude == 0.0) return 0;
  const int o = static_cast<int>(std::floor(std::log2(magnitude))) + kOctaveBias;
  return std::clamp(o, 0, kNormOctaves - 1);
}

MagnitudeSketch random_sketch(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<float> dist(0.0f, 0.01f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  if (n > 2) v[1] = 0.0f;
  MagnitudeSketch s;
  s.add(v.data(), v.size());
  return s;
}

// A catalog with every field set to something non-default (no files behind it).
Catalog synthetic_catalog() {
  std::mt19937_64 rng(42);
  Catalog c;
  c.tensors = {{"model.embed_tokens.weight", DType::kBF16, {6, 4}},
               {"model.norm.weight", DType::kF32, {5}},
               {"empty", DType::kF16, {0, 3}},
               {"scalar", DType::kF32, {}},
               {"model.layers.0.self_attn.q_proj.weight", DType::kF16, {3, 2, 2}}};
  c.blocking = make_blocking(c.tensors, 16);
  for (std::size_t b = 0; b < c.blocking.blocks.size(); ++b) c.base_block_hashes.push_back(rng());
  c.family_id = "0123456789abcdef0123456789abcdef";
  c.build_seconds = 1.25;
  const auto location = [&](const std::string& dir, std::size_t files) {
    CheckpointLocation loc;
    loc.dir = dir;
    for (std::size_t f = 0; f < files; ++f) {
      loc.shard_names.push_back("model-0000" + std::to_string(f + 1) + ".safetensors");
      loc.files.push_back(FileIdentity{dir + "/" + loc.shard_names.back(), 4096 + f,
                                       1700000000123456789LL + static_cast<std::int64_t>(f),
                                       "feedface" + std::to_string(f)});
    }
    for (std::size_t t = 0; t < c.tensors.size(); ++t) {
      loc.tensor_file.push_back(static_cast<std::uint32_t>(t % files));
      loc.tensor_offset.push_back(64 + 100 * t);
    }
    return loc;
  };
  c.base = location("/data/base", 2);
  for (int k = 0; k < 2; ++k) {
    ExpertCatalog e;
    e.location = location("/data/expert" + std::to_string(k), 1 + k);
    e.nonfinite = static_cast<std::uint64_t>(k * 3);
    for (std::size_t b = 0; b < c.block_count(); ++b) {
      BlockStats s;
      s.l2 = std::ldexp(static_cast<double>(rng() % 100000), -20);
      s.max_abs = static_cast<float>(rng() % 1000) / 7.0f;
      s.nonzero = rng() % 50;
      s.hash = rng();
      for (float& o : s.octave_sumsq) o = static_cast<float>(rng() % 17) / 3.0f;
      e.blocks.push_back(s);
    }
    for (const TensorInfo& t : c.tensors) e.sketches.push_back(random_sketch(rng, t.numel()));
    c.experts.push_back(std::move(e));
  }
  return c;
}

void expect_same_catalog(const Catalog& a, const Catalog& b) {
  EXPECT_EQ(a.format, b.format);
  EXPECT_EQ(a.family_id, b.family_id);
  EXPECT_EQ(a.tensors, b.tensors);
  EXPECT_EQ(a.base_block_hashes, b.base_block_hashes);
  EXPECT_EQ(a.blocking.block_bytes, b.blocking.block_bytes);
  ASSERT_EQ(a.blocking.blocks.size(), b.blocking.blocks.size());
  for (std::size_t i = 0; i < a.blocking.blocks.size(); ++i) {
    const Block &x = a.blocking.blocks[i], &y = b.blocking.blocks[i];
    EXPECT_EQ(x.tensor, y.tensor);
    EXPECT_EQ(x.elem_begin, y.elem_begin);
    EXPECT_EQ(x.elem_count, y.elem_count);
    EXPECT_EQ(x.byte_begin, y.byte_begin);
    EXPECT_EQ(x.byte_length, y.byte_length);
  }
  EXPECT_EQ(a.blocking.first_block, b.blocking.first_block);
  EXPECT_EQ(a.blocking.block_count, b.blocking.block_count);
  EXPECT_EQ(a.base, b.base);
  ASSERT_EQ(a.experts.size(), b.experts.size());
  for (std::size_t k = 0; k < a.experts.size(); ++k) {
    EXPECT_EQ(a.experts[k].location, b.experts[k].location);
    EXPECT_EQ(a.experts[k].nonfinite, b.experts[k].nonfinite);
    EXPECT_EQ(a.experts[k].blocks, b.experts[k].blocks) << "expert " << k;
    EXPECT_EQ(a.experts[k].sketches, b.experts[k].sketches) << "expert " << k;
  }
  EXPECT_DOUBLE_EQ(a.build_seconds, b.build_seconds);
}

// Writes a one-file checkpoint folder with the given bf16 tensors.
void write_checkpoint(const std::string& dir, const std::vector<TensorInfo>& tensors,
                      const std::vector<std::vector<float>>& values) {
  fs::create_directories(dir);
  std::vector<std::vector<std::byte>> bytes;
  std::vector<std::span<const std::byte>> spans;
  for (const auto& v : values) bytes.push_back(bf16_bytes(v));
  for (const auto& b : bytes) spans.emplace_back(b);
  io::write_safetensors(dir + "/model.safetensors", tensors, spans);
}

CheckpointLocation location_of(const std::string& dir) {
  CheckpointLocation loc;
  loc.dir = dir;
  loc.shard_names = {"model.safetensors"};
  const std::string path = dir + "/model.safetensors";
  FileIdentity id = io::stat_identity(path);
  id.header_hash = io::read_safetensors_header(path).header_hash;
  loc.files = {id};
  return loc;
}

std::string run_and_capture(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status != 0) out += "\n<exit status " + std::to_string(status) + ">";
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(BlockStats, MatchesDirectComputation) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> weights(0.0f, 0.05f), updates(0.0f, 0.002f);
  const std::size_t n = 3001;
  std::vector<float> base(n), expert(n);
  for (std::size_t i = 0; i < n; ++i) {
    base[i] = weights(rng);
    // A third of the entries unchanged (a frozen part), the rest a small update.
    expert[i] = i % 3 == 0 ? base[i] : base[i] + updates(rng);
  }
  const auto base_bytes = bf16_bytes(base), expert_bytes = bf16_bytes(expert);
  std::vector<float> b32(n), e32(n), delta(n);
  convert_to_f32(DType::kBF16, base_bytes.data(), b32.data(), n);
  convert_to_f32(DType::kBF16, expert_bytes.data(), e32.data(), n);
  compute_delta(b32.data(), e32.data(), delta.data(), n);

  // The documented accumulation order: element i into lane i mod 8 (octaves: table i mod 4).
  double lanes[8] = {};
  float max_abs = 0;
  std::uint64_t nonzero = 0;
  double tables[4][kNormOctaves] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const float d = e32[i] - b32[i];
    ASSERT_EQ(delta[i], d) << "delta is not the fp32 difference at " << i;
    lanes[i % 8] += static_cast<double>(d) * d;
    max_abs = std::max(max_abs, std::fabs(d));
    nonzero += d != 0.0f;
    tables[i % 4][reference_octave(std::fabs(static_cast<double>(d)))] +=
        static_cast<double>(d) * d;
  }
  const double sumsq = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                       ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  std::array<double, kNormOctaves> octaves{};
  for (int o = 0; o < kNormOctaves; ++o)
    octaves[o] = (tables[0][o] + tables[1][o]) + (tables[2][o] + tables[3][o]);
  const BlockStats s = compute_block_stats(delta, expert_bytes);
  EXPECT_EQ(s.l2, std::sqrt(sumsq));
  EXPECT_EQ(s.max_abs, max_abs);
  EXPECT_EQ(s.nonzero, nonzero);
  EXPECT_GT(nonzero, n / 2);
  EXPECT_LT(nonzero, n);  // the frozen third gives exact zeros
  EXPECT_EQ(s.hash, XXH3_64bits(expert_bytes.data(), expert_bytes.size()));
  double octave_total = 0;
  for (int o = 0; o < kNormOctaves; ++o) {
    EXPECT_EQ(s.octave_sumsq[o], static_cast<float>(octaves[o])) << "octave " << o;
    octave_total += s.octave_sumsq[o];
  }
  EXPECT_NEAR(octave_total, sumsq, 1e-6 * sumsq);
  EXPECT_EQ(count_nonfinite(e32), 0u);
}

TEST(BlockStats, ZeroDeltaAndNonFinite) {
  const std::vector<float> zeros(10, 0.0f);
  const std::vector<std::byte> stored(20, std::byte{1});
  const BlockStats z = compute_block_stats(zeros, stored);
  EXPECT_EQ(z.l2, 0.0);
  EXPECT_EQ(z.max_abs, 0.0f);
  EXPECT_EQ(z.nonzero, 0u);
  for (float o : z.octave_sumsq) EXPECT_EQ(o, 0.0f);

  std::vector<float> d = {0.5f, -0.25f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  EXPECT_EQ(count_nonfinite(d), 1u);
  const BlockStats s = compute_block_stats(d, stored);
  EXPECT_TRUE(std::isinf(s.l2));
  EXPECT_TRUE(std::isinf(s.max_abs));
  EXPECT_EQ(s.nonzero, 3u);
  EXPECT_TRUE(std::isinf(s.octave_sumsq[kNormOctaves - 1]));
  EXPECT_EQ(s.octave_sumsq[kOctaveBias - 1], 0.25f);    // 0.5 is in [2^-1, 2^0)
  EXPECT_EQ(s.octave_sumsq[kOctaveBias - 2], 0.0625f);  // 0.25 is in [2^-2, 2^-1)
  d[2] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(count_nonfinite(d), 1u);
}

TEST(BlockStats, OctaveEdges) {
  EXPECT_EQ(norm_octave(1.0f), kOctaveBias);
  EXPECT_EQ(norm_octave(1.5f), kOctaveBias);
  EXPECT_EQ(norm_octave(0.75f), kOctaveBias - 1);
  EXPECT_EQ(norm_octave(std::ldexp(1.0f, -kOctaveBias)), 0);
  EXPECT_EQ(norm_octave(std::ldexp(1.0f, -kOctaveBias + 1)), 1);
  EXPECT_EQ(norm_octave(std::ldexp(1.0f, -kOctaveBias - 5)), 0);
  EXPECT_EQ(norm_octave(0.0f), 0);
  EXPECT_EQ(norm_octave(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(norm_octave(std::ldexp(1.0f, kNormOctaves - kOctaveBias - 1)), kNormOctaves - 1);
  EXPECT_EQ(norm_octave(1e30f), kNormOctaves - 1);
  for (float x : {3e-9f, 1e-4f, 0.002f, 0.3f, 7.0f})
    EXPECT_EQ(norm_octave(x), reference_octave(x)) << x;
}

// ---------------------------------------------------------------------------------------------

TEST(StructureMatch, SameTensorsInAnotherOrderMatch) {
  const std::vector<TensorInfo> base = {{"a", DType::kBF16, {4, 2}}, {"b", DType::kF32, {3}}};
  const std::vector<TensorInfo> other = {base[1], base[0]};
  EXPECT_FALSE(find_structure_mismatch(base, other));
}

TEST(StructureMatch, NamesTheFirstMismatch) {
  const std::vector<TensorInfo> base = {
      {"a", DType::kBF16, {4, 2}}, {"b", DType::kBF16, {3, 8}}, {"c", DType::kF32, {3}}};
  {  // missing tensor
    auto m = find_structure_mismatch(base, {base[0], base[2]});
    ASSERT_TRUE(m);
    EXPECT_EQ(m->tensor, "b");
    EXPECT_FALSE(m->other_index);
    EXPECT_EQ(m->what, "is missing (the base has it)");
  }
  {  // shape; the later dtype mismatch of "c" is not reported
    std::vector<TensorInfo> other = base;
    other[1].shape = {3, 4};
    other[2].dtype = DType::kF16;
    auto m = find_structure_mismatch(base, other);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->tensor, "b");
    EXPECT_EQ(m->other_index, 1u);
    EXPECT_EQ(m->what, "has shape [3, 4] but the base has [3, 8]");
  }
  {  // dtype
    std::vector<TensorInfo> other = {base[2], base[1], base[0]};
    other[1].dtype = DType::kF16;
    auto m = find_structure_mismatch(base, other);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->tensor, "b");
    EXPECT_EQ(m->other_index, 1u);
    EXPECT_EQ(m->what, "has dtype F16 but the base has BF16");
  }
  {  // extra tensor
    std::vector<TensorInfo> other = base;
    other.insert(other.begin() + 1, TensorInfo{"lm_head.weight", DType::kBF16, {4, 2}});
    auto m = find_structure_mismatch(base, other);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->tensor, "lm_head.weight");
    EXPECT_EQ(m->other_index, 1u);
    EXPECT_EQ(m->what, "is not in the base");
  }
}

// ---------------------------------------------------------------------------------------------

TEST(CatalogModel, FullExpertBytesAndFindExpert) {
  Catalog c = synthetic_catalog();
  std::uint64_t per_expert = 0;
  for (const TensorInfo& t : c.tensors) per_expert += t.nbytes();
  EXPECT_EQ(c.full_expert_bytes(), 2 * per_expert);
  EXPECT_EQ(c.find_expert("/data/expert1"), 1);
  EXPECT_EQ(c.find_expert("/data/expert1/"), 1);
  EXPECT_EQ(c.find_expert("/data/./expert0"), 0);
  EXPECT_EQ(c.find_expert("/data/expert2"), -1);
  EXPECT_EQ(c.family_bytes(), (4096u + 4097u) + 4096u + (4096u + 4097u));
}

TEST(CatalogModel, FindExpertsAnswersEachFolderInTheOrderAsked) {
  Catalog c = synthetic_catalog();
  EXPECT_EQ(c.find_experts({"/data/expert1/", "/data/expert2", "/data/./expert0", "/data/expert1"}),
            (std::vector<int>{1, -1, 0, 1}));
  EXPECT_TRUE(c.find_experts({}).empty());
  c.experts.push_back(c.experts[0]);  // the same folder twice: the first is the one found
  EXPECT_EQ(c.find_experts({"/data/expert0"}), std::vector<int>{0});
  EXPECT_EQ(c.find_expert("/data/expert0"), 0);
}

TEST(CatalogModel, FindExpertsResolvesSymlinks) {
  TempDir tmp;
  fs::create_directories(tmp.file("real/expert"));
  fs::create_directory_symlink(tmp.file("real"), tmp.file("link"));
  Catalog c = synthetic_catalog();
  c.experts[1].location.dir = tmp.file("real/expert");
  EXPECT_EQ(c.find_experts({tmp.file("link/expert"), tmp.file("link/expert/../expert")}),
            (std::vector<int>{1, 1}));
}

TEST(CatalogModel, FamilyIdIsStableAndContentOnly) {
  const std::vector<TensorInfo> tensors = {{"a", DType::kBF16, {4, 2}}, {"b", DType::kF32, {3}}};
  const std::vector<FileIdentity> files = {{"/x/model.safetensors", 100, 5, "00ff"}};
  const std::string id = compute_family_id(tensors, files);
  // Pinned: a change here silently invalidates every catalog built before it.
  EXPECT_EQ(id, compute_family_id(tensors, files));
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id, "6ed2bf906fdb16ebb0afbfdbf68fd7ab");
  // Paths, sizes and times do not matter: a copied base is the same family.
  EXPECT_EQ(id, compute_family_id(tensors, {{"/elsewhere/model.safetensors", 7, 9, "00ff"}}));
  auto other = tensors;
  other[0].shape = {2, 4};
  EXPECT_NE(id, compute_family_id(other, files));
  other = tensors;
  other[1].dtype = DType::kF16;
  EXPECT_NE(id, compute_family_id(other, files));
  EXPECT_NE(id, compute_family_id(tensors, {{"/x/model.safetensors", 100, 5, "00fe"}}));
}

// ---------------------------------------------------------------------------------------------

TEST(CatalogStore, RoundTripKeepsEveryField) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  EXPECT_TRUE(io::is_catalog_folder(path));
  EXPECT_TRUE(fs::exists(path + "/catalog.h5"));
  // Nothing but the two files, no temporary folder left next to it.
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);

  io::global_byte_counters().reset();
  const Catalog back = io::load_catalog(path);
  expect_same_catalog(c, back);
  EXPECT_EQ(io::global_byte_counters().snapshot().catalog, io::catalog_size_bytes(path));

  // The JSON summary carries the totals.
  const std::string json = test::read_file(path + "/catalog.json");
  EXPECT_NE(json.find("\"family_id\": \"" + c.family_id + "\""), std::string::npos);
  EXPECT_NE(json.find("\"catalog_bytes\": " + std::to_string(io::catalog_size_bytes(path))),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"expert_bytes\": " + std::to_string(c.full_expert_bytes())),
            std::string::npos);

  // Saving again replaces the catalog as a whole.
  Catalog smaller = c;
  smaller.experts.pop_back();
  io::save_catalog(smaller, path);
  expect_same_catalog(smaller, io::load_catalog(path));
}

// Sketch counts are stored in 32 bits when they fit and in 64 when a tensor has 2^32 entries or
// more; both load back exactly, as sketches and as thresholds.
TEST(CatalogStore, KeepsSketchCountsOfTensorsBeyond32Bits) {
  TempDir tmp;
  Catalog c = synthetic_catalog();
  c.tensors[1].shape = {std::uint64_t{1} << 17, std::uint64_t{1} << 16};  // 2^33 fp32 entries
  c.blocking = make_blocking(c.tensors, std::uint64_t{1} << 30);
  c.base_block_hashes.resize(c.block_count(), 7);
  for (CheckpointLocation* loc : {&c.base, &c.experts[0].location, &c.experts[1].location})
    for (FileIdentity& f : loc->files) f.size = std::uint64_t{1} << 40;
  for (ExpertCatalog& e : c.experts) {
    e.blocks.resize(c.block_count(), e.blocks[0]);
    MagnitudeSketch big;
    const float spikes[] = {0.5f, -0.25f, 3.0f};
    big.add(spikes, 3);
    big.add_zeros(c.tensors[1].numel() - 3);
    e.sketches[1] = big;
  }
  // Expert 1 spreads the same total over buckets that each fit in 32 bits.
  const std::uint64_t most = std::numeric_limits<std::uint32_t>::max();
  c.experts[1].sketches[1] = MagnitudeSketch::from_sparse(
      std::vector<std::uint16_t>{0, 0x3f00, 0x3f80},
      std::vector<std::uint64_t>{most, most, (std::uint64_t{1} << 33) - 2 * most});
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const Catalog back = io::load_catalog(path);
  expect_same_catalog(c, back);
  EXPECT_EQ(back.experts[0].sketches[1].total(), std::uint64_t{1} << 33);
  EXPECT_EQ(back.experts[1].sketches[1].total(), std::uint64_t{1} << 33);
  const Catalog lean = io::load_catalog(path, std::vector<std::string>{"/data/expert0"},
                                        io::SketchLoad::thresholds({0.9}));
  ASSERT_EQ(lean.experts[0].thresholds.size(), 1u);
  EXPECT_EQ(lean.experts[0].thresholds[0].by_tensor[1], c.experts[0].sketches[1].threshold(0.9));

  // The stored widths.
  io::h5::Handle file(H5Fopen((path + "/catalog.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT),
                      io::h5::Kind::kFile);
  ASSERT_GE(file.get(), 0);
  for (const auto& [group, bytes] :
       {std::pair{"/experts/000", 8u}, std::pair{"/experts/001", 4u}}) {
    io::h5::Handle dset(
        H5Dopen2(file.get(), (std::string(group) + "/sketch_counts").c_str(), H5P_DEFAULT),
        io::h5::Kind::kDataset);
    io::h5::Handle type(H5Dget_type(dset.get()), io::h5::Kind::kDatatype);
    EXPECT_EQ(H5Tget_size(type.get()), bytes) << group;
  }
}

TEST(CatalogStore, LoadsStatisticsOnlyForTheSelectedExperts) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);

  // Selected by another spelling of the same folder, as a config may name it.
  const Catalog one = io::load_catalog(path, std::vector<std::string>{"/data//expert0/"});
  ASSERT_EQ(one.experts.size(), 2u);
  EXPECT_EQ(one.experts[0], c.experts[0]);
  EXPECT_EQ(one.experts[1].location, c.experts[1].location);  // found by find_expert
  EXPECT_EQ(one.experts[1].nonfinite, c.experts[1].nonfinite);
  EXPECT_TRUE(one.experts[1].blocks.empty());
  EXPECT_TRUE(one.experts[1].sketches.empty());
  EXPECT_EQ(one.find_expert("/data/expert1"), 1);  // plan indices stay those of the catalog

  // The planner uses what was loaded and refuses what was not.
  MergeSpec spec;
  spec.base_model = "/data/base";
  spec.experts = {{"/data/expert0", 1.0, 1.0}};
  const Plan plan = make_plan(one, spec, PlanRequest{});
  EXPECT_EQ(plan_to_json(plan), plan_to_json(make_plan(c, spec, PlanRequest{})));
  spec.experts = {{"/data/expert1", 1.0, 1.0}};
  const std::string msg = error_message<InputError>([&] { make_plan(one, spec, PlanRequest{}); });
  EXPECT_NE(msg.find("expert '/data/expert1' has statistics for 0 blocks"), std::string::npos)
      << msg;

  // No selection and a selection of every expert load the same catalog; a folder the catalog
  // does not hold selects nothing (the planner names it).
  expect_same_catalog(
      c, io::load_catalog(path, std::vector<std::string>{"/data/expert1", "/data/expert0"}));
  const Catalog none = io::load_catalog(path, std::vector<std::string>{"/data/other"});
  for (const ExpertCatalog& e : none.experts) EXPECT_TRUE(e.blocks.empty());
}

// Without sketches (a merge that does not trim by magnitude), the block statistics are all
// there and plan the same linear merge; a TIES plan refuses the catalog, naming what is missing.
TEST(CatalogStore, LoadsWithoutSketchesForMethodsThatDoNotTrim) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const Catalog lean = io::load_catalog(path, std::nullopt, io::SketchLoad::none());
  ASSERT_EQ(lean.experts.size(), c.experts.size());
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    EXPECT_EQ(lean.experts[k].blocks, c.experts[k].blocks) << k;
    EXPECT_EQ(lean.experts[k].location, c.experts[k].location) << k;
    EXPECT_TRUE(lean.experts[k].sketches.empty()) << k;
    EXPECT_FALSE(c.experts[k].sketches.empty()) << k;
  }
  MergeSpec spec;
  spec.base_model = "/data/base";
  spec.experts = {{"/data/expert0", 1.0, 0.5}};
  PlanRequest half;
  half.budget = Budget::parse("50%");
  EXPECT_EQ(plan_to_json(make_plan(lean, spec, half)), plan_to_json(make_plan(c, spec, half)));
  spec.method = MergeMethod::kTies;
  const std::string msg = error_message<InputError>([&] { make_plan(lean, spec, half); });
  EXPECT_NE(msg.find("magnitude sketches"), std::string::npos) << msg;
}

// A TIES plan loads one threshold per (expert, tensor) and density instead of the sketches:
// each equals the sketch's threshold bit for bit, a folder listed twice gets both densities,
// and the plan is the one the sketches give.
TEST(CatalogStore, LoadsTheThresholdsATiesPlanNeeds) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const std::vector<std::string> dirs = {"/data/expert1", "/data/expert0", "/data/expert1"};
  const std::vector<double> densities = {0.3, 0.5, 0.9};
  const Catalog lean = io::load_catalog(path, dirs, io::SketchLoad::thresholds(densities));
  ASSERT_EQ(lean.experts.size(), 2u);
  const std::vector<std::vector<double>> wanted = {{0.5}, {0.3, 0.9}};  // by catalog expert
  for (std::size_t k = 0; k < 2; ++k) {
    const ExpertCatalog& e = lean.experts[k];
    EXPECT_TRUE(e.sketches.empty()) << k;
    EXPECT_EQ(e.blocks, c.experts[k].blocks) << k;
    ASSERT_EQ(e.thresholds.size(), wanted[k].size()) << k;
    for (std::size_t i = 0; i < wanted[k].size(); ++i) {
      const DensityThresholds& d = e.thresholds[i];
      EXPECT_EQ(d.density, wanted[k][i]);
      ASSERT_EQ(d.by_tensor.size(), c.tensors.size());
      for (std::size_t t = 0; t < c.tensors.size(); ++t) {
        const float expected = c.experts[k].sketches[t].threshold(d.density);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(d.by_tensor[t]),
                  std::bit_cast<std::uint32_t>(expected))
            << "expert " << k << " tensor " << t << " density " << d.density;
        EXPECT_EQ(e.trim_threshold(t, d.density), expected);
      }
    }
  }
  // Some of these thresholds must differ, or the comparison above proves little.
  const std::vector<float>& low = lean.experts[1].thresholds[0].by_tensor;
  const std::vector<float>& high = lean.experts[1].thresholds[1].by_tensor;
  EXPECT_NE(low, high);

  MergeSpec spec;
  spec.method = MergeMethod::kTies;
  spec.base_model = "/data/base";
  spec.experts = {{"/data/expert0", 1.0, 0.5}, {"/data/expert0", 2.0, 0.5}};
  PlanRequest half;
  half.budget = Budget::parse("50%");
  EXPECT_EQ(plan_to_json(make_plan(lean, spec, half)), plan_to_json(make_plan(c, spec, half)));
  // A density that was not loaded is refused, not guessed.
  spec.experts[1].density = 0.25;
  const std::string msg = error_message<InputError>([&] { make_plan(lean, spec, half); });
  EXPECT_NE(msg.find("expert '/data/expert0' has 0 magnitude sketches"), std::string::npos) << msg;
  EXPECT_THROW(lean.experts[0].trim_threshold(0, 0.25), std::out_of_range);
  // One density per selected folder, or the call is wrong.
  EXPECT_THROW(io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.5})),
               std::invalid_argument);
  EXPECT_THROW(io::load_catalog(path, std::nullopt, io::SketchLoad::thresholds({})),
               std::invalid_argument);
}

// io::sketch_load_for: thresholds at the experts' densities for TIES, nothing for the others.
TEST(CatalogStore, SketchLoadFollowsTheMethod) {
  MergeSpec spec;
  spec.base_model = "/data/base";
  spec.experts = {{"/data/expert0", 1.0, 0.4}, {"/data/expert1", 1.0, 0.7}};
  for (const MergeMethod m : {MergeMethod::kLinear, MergeMethod::kTaskArithmetic,
                              MergeMethod::kDareLinear, MergeMethod::kDareTies}) {
    spec.method = m;
    EXPECT_EQ(io::sketch_load_for(spec).kind, io::SketchLoad::Kind::kNone);
  }
  spec.method = MergeMethod::kTies;
  const io::SketchLoad load = io::sketch_load_for(spec);
  EXPECT_EQ(load.kind, io::SketchLoad::Kind::kThresholds);
  EXPECT_EQ(load.densities, (std::vector<double>{0.4, 0.7}));
}

TEST(CatalogStore, RefusesToReplaceAForeignFolder) {
  TempDir tmp;
  fs::create_directories(tmp.file("precious"));
  test::write_file(tmp.file("precious/notes.txt"), "keep me");
  const std::string msg = error_message<UsageError>(
      [&] { io::save_catalog(synthetic_catalog(), tmp.file("precious")); });
  EXPECT_NE(msg.find("is not a catalog folder"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(tmp.file("precious/notes.txt")));
}

TEST(CatalogStore, CorruptContentIsAnInputError) {
  TempDir tmp;
  const std::string path = tmp.file("cat");
  io::save_catalog(synthetic_catalog(), path);
  // catalog.h5 replaced by junk: named as not HDF5.
  const std::string h5 = test::read_file(path + "/catalog.h5");
  test::write_file(path + "/catalog.h5", "not an hdf5 file at all");
  std::string msg = error_message<InputError>([&] { io::load_catalog(path); });
  EXPECT_NE(msg.find("catalog.h5: not an HDF5 file"), std::string::npos) << msg;
  test::write_file(path + "/catalog.h5", h5);
  // A summary of another catalog next to it.
  std::string json = test::read_file(path + "/catalog.json");
  const std::string key = "\"block_bytes\": 16";
  ASSERT_NE(json.find(key), std::string::npos);
  json.replace(json.find(key), key.size(), "\"block_bytes\": 32");
  test::write_file(path + "/catalog.json", json);
  msg = error_message<InputError>([&] { io::load_catalog(path); });
  EXPECT_NE(msg.find("describe different catalogs"), std::string::npos) << msg;
  msg = error_message<InputError>([&] { io::load_catalog(tmp.file("nothing")); });
  EXPECT_NE(msg.find("no such catalog folder"), std::string::npos) << msg;
}

// A damaged sketch (keys out of order, counts that do not add up to the tensor) is refused
// whichever way the sketches are loaded, naming the file, the dataset and the tensor.
TEST(CatalogStore, DamagedSketchesAreAnInputError) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const std::string h5 = path + "/catalog.h5";
  const auto rewrite = [&](const char* dataset, auto change) {
    io::h5::Handle file(H5Fopen(h5.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), io::h5::Kind::kFile);
    ASSERT_GE(file.get(), 0);
    io::h5::Handle dset(H5Dopen2(file.get(), dataset, H5P_DEFAULT), io::h5::Kind::kDataset);
    ASSERT_GE(dset.get(), 0);
    io::h5::Handle space(H5Dget_space(dset.get()), io::h5::Kind::kDataspace);
    std::vector<std::uint64_t> values(
        static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.get())));
    ASSERT_GE(H5Dread(dset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
              0);
    change(values);
    ASSERT_GE(H5Dwrite(dset.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
              0);
  };
  const std::vector<std::string> dirs = {"/data/expert0"};
  const auto load_errors = [&] {
    std::vector<std::string> messages;
    messages.push_back(error_message<InputError>([&] { io::load_catalog(path); }));
    // Off the stored density grid, so the thresholds come from the sketches.
    messages.push_back(error_message<InputError>(
        [&] { io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.505})); }));
    // On the grid the stored thresholds serve, and the sketches are not read.
    EXPECT_NO_THROW(io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.5})));
    return messages;
  };
  ASSERT_GE(c.experts[0].sketches[0].keys().size(), 2u);
  rewrite("/experts/000/sketch_keys",
          [](std::vector<std::uint64_t>& keys) { std::swap(keys[0], keys[1]); });
  for (const std::string& msg : load_errors()) {
    EXPECT_NE(msg.find("catalog.h5:/experts/000/sketch_keys: tensor 'model.embed_tokens.weight'"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("bucket keys are not ascending"), std::string::npos) << msg;
  }
  rewrite("/experts/000/sketch_keys",
          [](std::vector<std::uint64_t>& keys) { std::swap(keys[0], keys[1]); });
  EXPECT_NO_THROW(io::load_catalog(path));
  rewrite("/experts/000/sketch_counts", [](std::vector<std::uint64_t>& counts) { ++counts[0]; });
  for (const std::string& msg : load_errors()) {
    EXPECT_NE(msg.find("catalog.h5:/experts/000/sketch_counts: the sketch of tensor "
                       "'model.embed_tokens.weight' counts 25 entries, the tensor has 24"),
              std::string::npos)
        << msg;
  }
}

TEST(CatalogModel, TrimGridStepIsExactOrNone) {
  EXPECT_EQ(trim_grid_step(0.5), 50u);
  EXPECT_EQ(trim_grid_step(0.01), 1u);
  EXPECT_EQ(trim_grid_step(0.07), 7u);
  EXPECT_EQ(trim_grid_step(0.35), 35u);
  EXPECT_EQ(trim_grid_step(1.0), kTrimGridSteps);
  for (const double off : {0.0, 0.505, 0.333, 0.004, 1.01, 2.0, -0.5,
                           std::numeric_limits<double>::quiet_NaN(), std::nextafter(0.5, 1.0)})
    EXPECT_EQ(trim_grid_step(off), 0u) << off;
}

// A plan at a density on the grid reads the catalog's stored thresholds instead of inflating the
// sketches: the same floats as from the sketches, bit for bit, at every density of the grid (the
// plan takes nothing else from the sketches, so it is the same plan).
TEST(CatalogStore, StoresTheThresholdsOfTheDensityGrid) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const std::string h5 = path + "/catalog.h5";
  const std::vector<std::string> dirs = {"/data/expert0", "/data/expert1"};
  const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
  const auto expect_sketch_thresholds = [&](const Catalog& lean, double density) {
    for (std::size_t k = 0; k < 2; ++k) {
      ASSERT_EQ(lean.experts[k].thresholds.size(), 1u);
      const std::vector<float>& got = lean.experts[k].thresholds[0].by_tensor;
      ASSERT_EQ(got.size(), c.tensors.size());
      for (std::size_t t = 0; t < c.tensors.size(); ++t)
        EXPECT_EQ(bits(got[t]), bits(c.experts[k].sketches[t].threshold(density)))
            << "expert " << k << " tensor " << t << " density " << density;
    }
  };
  for (std::size_t step = 1; step <= kTrimGridSteps; ++step) {
    const double d = static_cast<double>(step) / static_cast<double>(kTrimGridSteps);
    expect_sketch_thresholds(io::load_catalog(path, dirs, io::SketchLoad::thresholds({d, d})), d);
  }

  // Stored as [steps, tensors] float32, one row per chunk, with the grid in an attribute.
  {
    io::h5::Handle file(H5Fopen(h5.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), io::h5::Kind::kFile);
    ASSERT_GE(file.get(), 0);
    io::h5::Handle dset(H5Dopen2(file.get(), "/experts/001/trim_thresholds", H5P_DEFAULT),
                        io::h5::Kind::kDataset);
    ASSERT_GE(dset.get(), 0);
    io::h5::Handle space(H5Dget_space(dset.get()), io::h5::Kind::kDataspace);
    hsize_t dims[2] = {0, 0};
    ASSERT_EQ(H5Sget_simple_extent_ndims(space.get()), 2);
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    EXPECT_EQ(dims[0], kTrimGridSteps);
    EXPECT_EQ(dims[1], c.tensors.size());
    // Damage one stored threshold of expert 1 at density 0.3 (row 29).
    std::vector<float> table(dims[0] * dims[1]);
    ASSERT_GE(H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, table.data()),
              0);
    table[29 * dims[1] + 1] = -1.0f;
    ASSERT_GE(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, table.data()),
              0);
  }
  std::string msg = error_message<InputError>([&] {
    io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.3, 0.3}));
  });
  EXPECT_NE(msg.find("catalog.h5:/experts/001/trim_thresholds: tensor 'model.norm.weight' has "
                     "threshold -1.000000 at density 0.300000"),
            std::string::npos)
      << msg;
  // Another density, or the sketches, are not affected.
  expect_sketch_thresholds(io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.4, 0.4})),
                           0.4);
  expect_sketch_thresholds(io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.305, 0.305})),
                           0.305);

  // A catalog written before the grid was stored: the thresholds come from the sketches.
  {
    io::h5::Handle file(H5Fopen(h5.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), io::h5::Kind::kFile);
    ASSERT_GE(H5Adelete(file.get(), "trim_grid_steps"), 0);
  }
  expect_sketch_thresholds(io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.3, 0.3})),
                           0.3);
  // Extending such a catalog writes the grid again (from the sketches it loads whole).
  io::save_catalog(io::load_catalog(path), path);
  expect_sketch_thresholds(io::load_catalog(path, dirs, io::SketchLoad::thresholds({0.3, 0.3})),
                           0.3);
  io::h5::Handle file(H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), io::h5::Kind::kFile);
  EXPECT_GT(H5Aexists(file.get(), "trim_grid_steps"), 0);
}

TEST(CatalogStore, DescribeNamesTheParts) {
  const Catalog c = synthetic_catalog();
  const std::string text = io::describe_catalog(c);
  EXPECT_NE(text.find("family " + c.family_id), std::string::npos) << text;
  EXPECT_NE(text.find("tensors: 5"), std::string::npos) << text;
  EXPECT_NE(text.find("blocks: " + std::to_string(c.block_count())), std::string::npos) << text;
  EXPECT_NE(text.find("[1] /data/expert1"), std::string::npos) << text;
  EXPECT_NE(text.find("3 NaN/Inf values"), std::string::npos) << text;
}

// ---------------------------------------------------------------------------------------------

TEST(CatalogStore, StaleFilesAreDetected) {
  TempDir tmp;
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {4, 8}}, {"n", DType::kBF16, {8}}};
  const std::vector<std::vector<float>> values = {std::vector<float>(32, 0.5f),
                                                  std::vector<float>(8, 1.0f)};
  write_checkpoint(tmp.file("base"), tensors, values);
  write_checkpoint(tmp.file("e0"), tensors, values);
  Catalog c;
  c.tensors = tensors;
  c.base = location_of(tmp.file("base"));
  c.experts.resize(1);
  c.experts[0].location = location_of(tmp.file("e0"));
  EXPECT_NO_THROW(io::check_catalog_fresh(c));

  const std::string expert_file = tmp.file("e0/model.safetensors");
  // Only the modification time changes ("touch").
  const auto mtime = fs::last_write_time(expert_file);
  fs::last_write_time(expert_file, mtime + std::chrono::seconds(2));
  std::string msg = error_message<InputError>([&] { io::check_catalog_fresh(c); });
  EXPECT_EQ(msg, "stale catalog: " + expert_file +
                     " changed since it was catalogued (size/mtime/header differ: mtime)");
  // Shares of the files (base first): the expert's is the second of two.
  EXPECT_NO_THROW(io::check_catalog_fresh(c, std::nullopt, {0, 2}));
  EXPECT_EQ(error_message<InputError>([&] {
              io::check_catalog_fresh(c, std::nullopt, {1, 2});
            }),
            msg);
  EXPECT_THROW(io::check_catalog_fresh(c, std::nullopt, {2, 2}), std::invalid_argument);
  // The shares split the list (base first) between them, each file once.
  const auto all = io::catalog_input_files(c, std::nullopt);
  const auto first = io::catalog_input_files(c, std::nullopt, {0, 2});
  const auto second = io::catalog_input_files(c, std::nullopt, {1, 2});
  ASSERT_EQ(all.size(), c.base.files.size() + c.experts.at(0).location.files.size());
  ASSERT_EQ(first.size() + second.size(), all.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    EXPECT_EQ((i % 2 == 0 ? first[i / 2] : second[i / 2]).path, all[i].path) << i;
  EXPECT_EQ(all.front().path, c.base.files.front().path);
  // A merge that does not use the expert is not affected; one that does is refused.
  EXPECT_NO_THROW(io::check_catalog_fresh(c, std::vector<std::string>{}));
  EXPECT_EQ(error_message<InputError>(
                [&] { io::check_catalog_fresh(c, std::vector<std::string>{tmp.file("e0")}); }),
            msg);

  // Rewritten with another shape: size and header differ too.
  write_checkpoint(tmp.file("e0"), {{"w", DType::kBF16, {4, 9}}, tensors[1]},
                   {std::vector<float>(36, 0.5f), values[1]});
  msg = error_message<InputError>([&] { io::check_catalog_fresh(c); });
  EXPECT_NE(msg.find("stale catalog: " + expert_file + " changed since it was catalogued"),
            std::string::npos)
      << msg;
  const std::string sizes = "size " + std::to_string(c.experts[0].location.files[0].size) + " -> " +
                            std::to_string(fs::file_size(expert_file));
  EXPECT_NE(msg.find(sizes + ", mtime, header)"), std::string::npos) << msg;

  // The base is checked as well, and a missing file is stale.
  c.experts[0].location = location_of(tmp.file("e0"));
  EXPECT_NO_THROW(io::check_catalog_fresh(c));
  fs::remove(tmp.file("base/model.safetensors"));
  msg = error_message<InputError>([&] { io::check_catalog_fresh(c); });
  EXPECT_NE(msg.find("stale catalog: " + tmp.file("base/model.safetensors")), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the file is missing"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------

TEST(CatalogStore, ReadableWithH5py) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const std::string out =
      run_and_capture(std::string(MERGEPIPE_TEST_PYTHON) + " " + MERGEPIPE_TEST_SCRIPTS +
                      "/read_catalog.py " + path + " 2>&1");
  const std::string nb = std::to_string(c.block_count());
  const std::string nt = std::to_string(c.tensors.size());
  std::size_t keys0 = 0;
  for (const MagnitudeSketch& s : c.experts[0].sketches) keys0 += s.keys().size();
  for (const std::string& line : std::vector<std::string>{
           "@format mergepipe-catalog-1", "@block_count " + nb, "@expert_count 2",
           "/blocks/byte_length (" + nb + ",) uint64", "/blocks/tensor (" + nb + ",) uint32",
           "/tensors/name (" + nt + ",) |S38", "/experts/000/block_l2 (" + nb + ",) float64",
           "/experts/001/block_octaves (" + nb + ", 48) float32",
           "/experts/001/sketch_offsets (" + std::to_string(c.tensors.size() + 1) + ",) uint64",
           "/experts/000/sketch_keys (" + std::to_string(keys0) + ",) uint16",
           "/experts/000/sketch_counts (" + std::to_string(keys0) + ",) uint32",
           "/base/tensor_offset (" + nt + ",) uint64",
           "tensor 0 model.embed_tokens.weight BF16 [6, 4]", "tensor 3 scalar F32 []"}) {
    EXPECT_NE(out.find(line + "\n"), std::string::npos) << "missing line '" << line << "' in:\n"
                                                        << out;
  }
  // Values as h5py sees them equal ours.
  for (std::size_t k = 0; k < c.experts.size(); ++k) {
    std::uint64_t nonzero = 0, sketch_total = 0;
    for (const BlockStats& s : c.experts[k].blocks) nonzero += s.nonzero;
    for (const MagnitudeSketch& s : c.experts[k].sketches) sketch_total += s.total();
    std::ostringstream want;
    want << "expert " << k << " nonzero " << nonzero << " sketch_total " << sketch_total << " l2_0 "
         << c.experts[k].blocks[0].l2 << "\n";
    EXPECT_NE(out.find(want.str()), std::string::npos) << want.str() << " not in:\n" << out;
  }
}

// ---------------------------------------------------------------------------------------------

TEST(CatalogPrefetch, ReadsCatalogH5AndTheHeadersOfTheSelectedExperts) {
  TempDir tmp;
  const std::vector<TensorInfo> tensors = {{"w", DType::kBF16, {4, 8}}};
  const std::vector<std::vector<float>> values = {std::vector<float>(32, 0.5f)};
  Catalog c = synthetic_catalog();
  const auto on_disk = [&](CheckpointLocation& loc, const std::string& name) {
    write_checkpoint(tmp.file(name), tensors, values);
    const CheckpointLocation real = location_of(tmp.file(name));
    loc.dir = real.dir;
    loc.shard_names = real.shard_names;
    loc.files = real.files;
    loc.tensor_file.assign(c.tensors.size(), 0);
  };
  on_disk(c.base, "base");
  on_disk(c.experts[0].location, "e0");
  on_disk(c.experts[1].location, "e1");
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);

  // What a safetensors file's header occupies: the 8-byte length and the JSON it gives.
  const auto header_bytes = [&](const std::string& name) {
    const std::string file = tmp.file(name) + "/model.safetensors";
    std::array<std::byte, 8> length{};
    io::File(file, io::File::Mode::kRead).read_at(0, length);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(length[i]);
    return 8 + n;
  };
  const std::uint64_t h5 = io::stat_identity(path + "/catalog.h5").size;
  EXPECT_EQ(io::prefetch_catalog_inputs(path),
            h5 + header_bytes("base") + header_bytes("e0") + header_bytes("e1"));
  EXPECT_EQ(io::prefetch_catalog_inputs(path, std::vector<std::string>{tmp.file("e1")}),
            h5 + header_bytes("base") + header_bytes("e1"));

  // Parts: catalog.h5 alone, or a share of the headers (base, e0, e1 in turn) alone.
  EXPECT_EQ(io::prefetch_catalog_inputs(path, std::nullopt, {true, false, {}}), h5);
  EXPECT_EQ(io::prefetch_catalog_inputs(path, std::nullopt, {false, true, {0, 2}}),
            header_bytes("base") + header_bytes("e1"));
  EXPECT_EQ(io::prefetch_catalog_inputs(path, std::nullopt, {false, true, {1, 2}}),
            header_bytes("e0"));
  EXPECT_EQ(io::prefetch_catalog_inputs(path, std::nullopt, {false, true, {2, 2}}), 0u);

  // A hint only: what is missing is skipped, never an error (the load reports it).
  fs::remove_all(tmp.file("e1"));
  EXPECT_EQ(io::prefetch_catalog_inputs(path), h5 + header_bytes("base") + header_bytes("e0"));
  EXPECT_EQ(io::prefetch_catalog_inputs(tmp.file("nothing")), 0u);
}

TEST(CatalogStore, SummaryHasTheLocationsWithoutTheArrays) {
  TempDir tmp;
  const Catalog c = synthetic_catalog();
  const std::string path = tmp.file("cat");
  io::save_catalog(c, path);
  const Catalog summary = io::load_catalog_summary(path);
  EXPECT_EQ(summary.family_id, c.family_id);
  EXPECT_EQ(summary.base.files, c.base.files);
  ASSERT_EQ(summary.experts.size(), 2u);
  EXPECT_EQ(summary.experts[1].location.files, c.experts[1].location.files);
  EXPECT_TRUE(summary.tensors.empty());
  EXPECT_TRUE(summary.experts[0].blocks.empty());
  EXPECT_THROW(io::load_catalog_summary(tmp.file("nothing")), InputError);
}
