// Parallel catalog build at 1, 2 and 4 ranks: statistics equal a serial reference computed here,
// every expert byte is read exactly once, extension reads only the new experts, and failures on
// any rank end every rank with the same error.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>

#include "mergepipe/catalog.hpp"
#include "mergepipe/dtype.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/mpi/catalog_build.hpp"
#include "mergepipe/mpi/catalog_load.hpp"
#include "mergepipe/mpi/comm.hpp"

using namespace mergepipe;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kBlockBytes = 4096;

// Base shards: the first two tensors in shard 1, the rest in shard 2 (experts are single files,
// so their tensors lie in another order). The catalog's tensor order is the base's file order.
const std::vector<TensorInfo> kTensors = {
    {"model.embed_tokens.weight", DType::kBF16, {96, 64}},
    {"model.layers.0.self_attn.q_proj.weight", DType::kBF16, {256, 256}},
    {"model.norm.weight", DType::kF32, {64}},
    {"model.layers.0.mlp.up_proj.weight", DType::kF16, {64, 48}},
    {"model.layers.0.self_attn.k_norm.weight", DType::kBF16, {16}},
    {"zz.empty", DType::kBF16, {0, 8}},
};
constexpr std::size_t kQProj = 1, kNorm = 2, kUpProj = 3;

struct Model {
  std::vector<std::vector<std::byte>> bytes;  // per tensor (kTensors order)
};

std::vector<std::byte> to_bytes(DType dtype, const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * dtype_size(dtype));
  convert_from_f32(dtype, v.data(), out.data(), v.size());
  return out;
}

std::vector<float> to_f32(DType dtype, const std::vector<std::byte>& b) {
  std::vector<float> out(b.size() / dtype_size(dtype));
  convert_to_f32(dtype, b.data(), out.data(), out.size());
  return out;
}

Model make_base() {
  Model m;
  std::mt19937_64 rng(1234);
  std::normal_distribution<float> w(0.0f, 0.05f);
  for (const TensorInfo& t : kTensors) {
    std::vector<float> v(t.numel());
    for (float& x : v) x = w(rng);
    m.bytes.push_back(to_bytes(t.dtype, v));
  }
  return m;
}

// Expert k: base + an update on most entries; expert 1 leaves up_proj frozen (zero delta).
Model make_expert(const Model& base, int k) {
  Model m;
  std::mt19937_64 rng(99 + static_cast<std::uint64_t>(k));
  std::normal_distribution<float> u(0.0f, 0.004f * static_cast<float>(k + 1));
  for (std::size_t t = 0; t < kTensors.size(); ++t) {
    std::vector<float> v = to_f32(kTensors[t].dtype, base.bytes[t]);
    const bool frozen = k == 1 && t == kUpProj;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!frozen && i % 5 != 0) v[i] += u(rng);
    }
    m.bytes.push_back(to_bytes(kTensors[t].dtype, v));
  }
  return m;
}

std::vector<std::span<const std::byte>> spans_of(const Model& m,
                                                 const std::vector<std::size_t>& which) {
  std::vector<std::span<const std::byte>> s;
  for (std::size_t t : which) s.emplace_back(m.bytes[t]);
  return s;
}

std::vector<TensorInfo> infos_of(const std::vector<std::size_t>& which) {
  std::vector<TensorInfo> out;
  for (std::size_t t : which) out.push_back(kTensors[t]);
  return out;
}

void write_single(const std::string& dir, const std::vector<TensorInfo>& tensors, const Model& m) {
  fs::create_directories(dir);
  std::vector<std::span<const std::byte>> s;
  for (const auto& b : m.bytes) s.emplace_back(b);
  io::write_safetensors(dir + "/model.safetensors", tensors, s);
}

void write_sharded_base(const std::string& dir, const Model& m) {
  fs::create_directories(dir);
  const std::vector<std::size_t> first = {0, 1}, second = {2, 3, 4, 5};
  const std::vector<std::string> names = {io::shard_file_name(1, 2), io::shard_file_name(2, 2)};
  io::write_safetensors(dir + "/" + names[0], infos_of(first), spans_of(m, first));
  io::write_safetensors(dir + "/" + names[1], infos_of(second), spans_of(m, second));
  io::write_text_file(dir + "/model.safetensors.index.json",
                      io::make_index_json(names, {infos_of(first), infos_of(second)}));
}

int reference_octave(double magnitude) {
  if (magnitude == 0.0) return 0;
  return std::clamp(static_cast<int>(std::floor(std::log2(magnitude))) + kOctaveBias, 0,
                    kNormOctaves - 1);
}

// Serial reference for one expert, computed without the catalog code.
struct Reference {
  std::vector<BlockStats> blocks;
  std::vector<MagnitudeSketch> sketches;
  std::uint64_t nonfinite = 0;
};

// Index of a tensor by name in a tensor list.
std::size_t index_of(const std::vector<TensorInfo>& tensors, const std::string& name) {
  for (std::size_t t = 0; t < tensors.size(); ++t)
    if (tensors[t].name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// `order`: the catalog's tensor order (the models hold tensors in kTensors order).
Reference reference_stats(const Model& base, const Model& expert,
                          const std::vector<TensorInfo>& order) {
  const Blocking blocking = make_blocking(order, kBlockBytes);
  Reference r;
  r.blocks.resize(blocking.blocks.size());
  for (std::size_t t = 0; t < order.size(); ++t) {
    const std::size_t src = index_of(kTensors, order[t].name);
    const std::vector<float> b = to_f32(kTensors[src].dtype, base.bytes[src]);
    const std::vector<float> e = to_f32(kTensors[src].dtype, expert.bytes[src]);
    std::vector<float> d(b.size());
    for (std::size_t i = 0; i < d.size(); ++i) {
      d[i] = e[i] - b[i];
      r.nonfinite += !std::isfinite(e[i]);
    }
    MagnitudeSketch sketch;
    sketch.add(d.data(), d.size());
    r.sketches.push_back(std::move(sketch));
    for (std::uint32_t j = 0; j < blocking.block_count[t]; ++j) {
      const Block& blk = blocking.blocks[blocking.first_block[t] + j];
      // The documented accumulation order: element i of the block into lane i mod 8 for the
      // norm, into table i mod 4 for the octaves.
      BlockStats s;
      double lanes[8] = {};
      double tables[4][kNormOctaves] = {};
      bool bad = false;
      for (std::uint64_t i = 0; i < blk.elem_count; ++i) {
        const float x = d[blk.elem_begin + i];
        s.nonzero += x != 0.0f;
        if (!std::isfinite(x)) {
          bad = true;
          continue;
        }
        const double sq = static_cast<double>(x) * x;
        lanes[i % 8] += sq;
        s.max_abs = std::max(s.max_abs, std::fabs(x));
        tables[i % 4][reference_octave(std::fabs(static_cast<double>(x)))] += sq;
      }
      for (int o = 0; o < kNormOctaves; ++o)
        s.octave_sumsq[o] =
            static_cast<float>((tables[0][o] + tables[1][o]) + (tables[2][o] + tables[3][o]));
      s.l2 = std::sqrt(((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                       ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])));
      if (bad) {
        s.l2 = std::numeric_limits<double>::infinity();
        s.max_abs = std::numeric_limits<float>::infinity();
        s.octave_sumsq[kNormOctaves - 1] = std::numeric_limits<float>::infinity();
      }
      s.hash = XXH3_64bits(expert.bytes[src].data() + blk.byte_begin, blk.byte_length);
      r.blocks[blocking.first_block[t] + j] = s;
    }
  }
  return r;
}

std::uint64_t data_bytes() {
  std::uint64_t n = 0;
  for (const TensorInfo& t : kTensors) n += t.nbytes();
  return n;
}

struct ReadCounts {
  std::uint64_t base = 0, expert = 0;
};

// Runs `body` and returns the bytes it read, summed over ranks (collective).
template <typename F>
ReadCounts count_reads(const mpi::Comm& comm, F&& body) {
  const io::ByteCounts before = io::global_byte_counters().snapshot();
  body();
  const io::ByteCounts after = io::global_byte_counters().snapshot();
  return {comm.allreduce_sum(after.base - before.base, "test"),
          comm.allreduce_sum(after.expert - before.expert, "test")};
}

// The CollectiveError `body` throws on this rank (code kOk and empty message when none).
template <typename F>
std::pair<ExitCode, std::string> collective_error(F&& body) {
  try {
    body();
  } catch (const mpi::CollectiveError& e) {
    return {e.code(), e.what()};
  } catch (const std::exception& e) {
    return {ExitCode::kInternal, std::string("not a CollectiveError: ") + e.what()};
  }
  return {ExitCode::kOk, ""};
}

void expect_matches_reference(const ExpertCatalog& got, const Reference& want,
                              const std::string& what) {
  ASSERT_EQ(got.blocks.size(), want.blocks.size()) << what;
  for (std::size_t b = 0; b < want.blocks.size(); ++b) {
    EXPECT_EQ(got.blocks[b], want.blocks[b])
        << what << " block " << b << ": l2 " << got.blocks[b].l2 << " vs " << want.blocks[b].l2;
  }
  ASSERT_EQ(got.sketches.size(), want.sketches.size()) << what;
  for (std::size_t t = 0; t < want.sketches.size(); ++t)
    EXPECT_TRUE(got.sketches[t] == want.sketches[t]) << what << " sketch of tensor " << t;
  EXPECT_EQ(got.nonfinite, want.nonfinite) << what;
}

class CatalogBuild : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mpi::Comm comm = mpi::Comm::world();
    std::string dir;
    if (comm.is_root()) {
      char templ[] = "/tmp/mergepipe-catalog-build-XXXXXX";
      if (::mkdtemp(templ)) dir = templ;
    }
    comm.broadcast(dir, 0, "test: temp dir");
    root_ = dir;
    base_ = make_base();
    experts_.clear();
    for (int k = 0; k < 3; ++k) experts_.push_back(make_expert(base_, k));
    std::optional<Error> failure = mpi::capture_failure([&] {
      if (!comm.is_root()) return;
      if (dir.empty()) throw IoError("mkdtemp failed");
      write_sharded_base(dir + "/base", base_);
      for (int k = 0; k < 3; ++k) write_single(expert_dir(k), kTensors, experts_[k]);
      // An expert of another family: up_proj narrower.
      std::vector<TensorInfo> bad = kTensors;
      bad[kUpProj].shape = {64, 40};
      Model bad_model = experts_[0];
      bad_model.bytes[kUpProj].resize(bad[kUpProj].nbytes());
      write_single(dir + "/bad", bad, bad_model);
      // An expert with one NaN in q_proj and one +Inf in the norm.
      Model nan_model = experts_[0];
      std::vector<float> q = to_f32(kTensors[kQProj].dtype, nan_model.bytes[kQProj]);
      q[1000] = std::numeric_limits<float>::quiet_NaN();
      nan_model.bytes[kQProj] = to_bytes(kTensors[kQProj].dtype, q);
      std::vector<float> n = to_f32(kTensors[kNorm].dtype, nan_model.bytes[kNorm]);
      n[7] = std::numeric_limits<float>::infinity();
      nan_model.bytes[kNorm] = to_bytes(kTensors[kNorm].dtype, n);
      write_single(dir + "/nan", kTensors, nan_model);
      nan_expert_ = nan_model;
    });
    comm.check(failure, "test: writing checkpoints");
    if (!comm.is_root()) {
      nan_expert_ = experts_[0];  // the reference is only compared on rank 0
    }
  }

  static void TearDownTestSuite() {
    mpi::Comm comm = mpi::Comm::world();
    comm.barrier("test: cleanup");
    if (comm.is_root() && !root_.empty()) {
      std::error_code ec;
      fs::remove_all(root_, ec);
    }
  }

  static std::string expert_dir(int k) { return root_ + "/expert" + std::to_string(k); }

  mpi::CatalogBuildOptions options(std::vector<std::string> experts) const {
    mpi::CatalogBuildOptions o;
    o.base_dir = root_ + "/base";
    o.expert_dirs = std::move(experts);
    o.block_bytes = kBlockBytes;
    o.threads = 3;
    return o;
  }

  mpi::Comm comm_ = mpi::Comm::world();
  static inline std::string root_;
  static inline Model base_;
  static inline std::vector<Model> experts_;
  static inline Model nan_expert_;
};

}  // namespace

TEST_F(CatalogBuild, StatisticsMatchTheSerialReferenceAndEachByteIsReadOnce) {
  Catalog cat;
  const ReadCounts reads = count_reads(comm_, [&] {
    cat = mpi::build_catalog(comm_, options({expert_dir(0), expert_dir(1)}));
  });
  // Every rank knows the structure.
  EXPECT_EQ(cat.tensors, io::open_checkpoint(root_ + "/base").tensor_infos());
  std::vector<TensorInfo> sorted = cat.tensors, want = kTensors;
  const auto by_name = [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; };
  std::sort(sorted.begin(), sorted.end(), by_name);
  std::sort(want.begin(), want.end(), by_name);
  EXPECT_EQ(sorted, want);
  EXPECT_EQ(cat.block_count(), 39u);
  EXPECT_EQ(cat.expert_count(), 2u);
  EXPECT_EQ(cat.base.shard_names.size(), 2u);
  EXPECT_EQ(reads.base, data_bytes());
  EXPECT_EQ(reads.expert, 2 * data_bytes());
  if (comm_.is_root()) {
    const Blocking blocking = make_blocking(cat.tensors, kBlockBytes);
    const std::size_t up_proj = index_of(cat.tensors, kTensors[kUpProj].name);
    EXPECT_EQ(cat.full_expert_bytes(), 2 * data_bytes());
    for (int k = 0; k < 2; ++k) {
      expect_matches_reference(cat.experts[k], reference_stats(base_, experts_[k], cat.tensors),
                               "expert " + std::to_string(k));
    }
    // Expert 1 left up_proj untouched: its blocks are exact zeros.
    ASSERT_EQ(blocking.block_count[up_proj], 2u);
    for (std::uint32_t j = 0; j < blocking.block_count[up_proj]; ++j) {
      EXPECT_EQ(cat.experts[1].blocks[blocking.first_block[up_proj] + j].nonzero, 0u);
    }
    // Locations point at the tensors' bytes in each checkpoint.
    const Checkpoint e0 = io::open_checkpoint(expert_dir(0));
    for (std::size_t t = 0; t < cat.tensors.size(); ++t) {
      EXPECT_EQ(cat.experts[0].location.tensor_offset[t],
                e0.tensors[*e0.find(cat.tensors[t].name)].offset);
    }
    // The base's block hashes are those of its stored bytes (merges check base reads with them).
    ASSERT_EQ(cat.base_block_hashes.size(), blocking.blocks.size());
    for (std::size_t b = 0; b < blocking.blocks.size(); ++b) {
      const Block& blk = blocking.blocks[b];
      const std::size_t t = index_of(kTensors, cat.tensors[blk.tensor].name);
      EXPECT_EQ(cat.base_block_hashes[b],
                XXH3_64bits(base_.bytes[t].data() + blk.byte_begin, blk.byte_length))
          << "block " << b;
    }
    EXPECT_EQ(cat.base.tensor_file[0], 0u);
    EXPECT_EQ(cat.base.tensor_file[up_proj], 1u);
    EXPECT_EQ(cat.base.tensor_file[index_of(cat.tensors, kTensors[kQProj].name)], 0u);
  }
}

TEST_F(CatalogBuild, ExtendingReadsOnlyTheNewExpert) {
  Catalog first = mpi::build_catalog(comm_, options({expert_dir(0), expert_dir(1)}));
  const std::string path = root_ + "/cat-extend";
  comm_.check(mpi::capture_failure([&] {
                if (comm_.is_root()) io::save_catalog(first, path);
              }),
              "test: save");
  mpi::CatalogBuildOptions opt = options({expert_dir(2)});
  opt.block_bytes = 1;  // ignored: the existing catalog's blocking is kept
  opt.existing = io::load_catalog(path);
  Catalog extended;
  const ReadCounts reads = count_reads(comm_, [&] { extended = mpi::build_catalog(comm_, opt); });
  EXPECT_EQ(reads.expert, data_bytes());
  EXPECT_EQ(reads.base, data_bytes());
  EXPECT_EQ(extended.expert_count(), 3u);
  EXPECT_EQ(extended.blocking.block_bytes, kBlockBytes);

  // An expert already in the catalog is a usage error on every rank.
  mpi::CatalogBuildOptions again = opt;
  again.expert_dirs = {expert_dir(1) + "/"};
  const auto [code, message] = collective_error([&] { mpi::build_catalog(comm_, again); });
  EXPECT_EQ(code, ExitCode::kUsage) << message;
  EXPECT_NE(message.find("already catalogued"), std::string::npos) << message;

  if (comm_.is_root()) {
    for (int k = 0; k < 2; ++k) EXPECT_EQ(extended.experts[k], first.experts[k]) << k;
    expect_matches_reference(extended.experts[2],
                             reference_stats(base_, experts_[2], extended.tensors), "added expert");
  }
}

// A merge's catalog: loaded on rank 0 while the other ranks check the files, so a stale file is
// caught whichever rank's share it is in, with the same message on every rank.
TEST_F(CatalogBuild, AMergeLoadsTheCatalogOnRank0AndEveryFileIsChecked) {
  const Catalog built =
      mpi::build_catalog(comm_, options({expert_dir(0), expert_dir(1), expert_dir(2)}));
  const std::string path = root_ + "/cat-merge";
  comm_.check(mpi::capture_failure([&] {
                if (comm_.is_root()) io::save_catalog(built, path);
              }),
              "test: save");
  mpi::CatalogRequest request;
  if (comm_.is_root()) {
    // On the density grid and off it: stored thresholds and sketches both.
    request = {path, std::vector<std::string>{expert_dir(2), expert_dir(0)},
               io::SketchLoad::thresholds({0.5, 0.505})};
  }
  int before_load = 0;
  const Catalog loaded = mpi::load_checked_catalog(comm_, request, [&] { ++before_load; });
  EXPECT_EQ(before_load, comm_.is_root() ? 1 : 0);
  if (comm_.is_root()) {
    const Catalog direct = io::load_catalog(path, request.only, request.sketches);
    ASSERT_EQ(loaded.experts.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k) EXPECT_EQ(loaded.experts[k], direct.experts[k]) << k;
    EXPECT_EQ(loaded.experts[0].thresholds.at(0).density, 0.505);
    EXPECT_EQ(loaded.experts[2].thresholds.at(0).density, 0.5);
    EXPECT_TRUE(loaded.experts[1].blocks.empty());  // not selected
  } else {
    EXPECT_TRUE(loaded.experts.empty());
  }

  // Each file of the merge in turn (two base shards, then the experts'), one second newer.
  const std::vector<std::string> files = {built.base.files.at(0).path, built.base.files.at(1).path,
                                          built.experts[0].location.files.at(0).path,
                                          built.experts[2].location.files.at(0).path};
  for (const std::string& file : files) {
    const auto mtime = fs::last_write_time(file);
    comm_.barrier("test: before touch");
    if (comm_.is_root()) fs::last_write_time(file, mtime + std::chrono::seconds(1));
    comm_.barrier("test: touched");
    const auto [code, message] =
        collective_error([&] { mpi::load_checked_catalog(comm_, request); });
    EXPECT_EQ(code, ExitCode::kInputData) << file << ": " << message;
    EXPECT_EQ(message, "stale catalog: " + file +
                           " changed since it was catalogued (size/mtime/header differ: mtime)");
    comm_.barrier("test: before restore");
    if (comm_.is_root()) fs::last_write_time(file, mtime);
    comm_.barrier("test: restored");
  }
  // An expert the merge does not use may change.
  EXPECT_NO_THROW(mpi::load_checked_catalog(comm_, request));
}

TEST_F(CatalogBuild, AnExpertOfAnotherShapeIsRejectedOnEveryRank) {
  const auto [code, message] = collective_error([&] {
    mpi::build_catalog(comm_, options({expert_dir(0), root_ + "/bad"}));
  });
  EXPECT_EQ(code, ExitCode::kInputData) << message;
  EXPECT_NE(
      message.find(root_ + "/bad/model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' "
                           "has shape [64, 40] but the base has [64, 48]"),
      std::string::npos)
      << message;
}

TEST_F(CatalogBuild, NonFiniteValuesAreRefusedUnlessAllowed) {
  const auto [code, message] =
      collective_error([&] { mpi::build_catalog(comm_, options({root_ + "/nan"})); });
  EXPECT_EQ(code, ExitCode::kInputData) << message;
  EXPECT_NE(message.find("holds NaN or Inf values"), std::string::npos) << message;
  EXPECT_NE(message.find(root_ + "/nan/model.safetensors: tensor '"), std::string::npos) << message;

  mpi::CatalogBuildOptions opt = options({root_ + "/nan"});
  opt.allow_nonfinite = true;
  Catalog cat = mpi::build_catalog(comm_, opt);
  if (comm_.is_root()) {
    const Blocking blocking = make_blocking(cat.tensors, kBlockBytes);
    const std::size_t q_proj = index_of(cat.tensors, kTensors[kQProj].name);
    EXPECT_EQ(cat.experts[0].nonfinite, 2u);
    const Block* nan_block = nullptr;
    for (std::uint32_t j = 0; j < blocking.block_count[q_proj]; ++j) {
      const Block& b = blocking.blocks[blocking.first_block[q_proj] + j];
      if (b.elem_begin <= 1000 && 1000 < b.elem_begin + b.elem_count) {
        nan_block = &b;
        EXPECT_TRUE(std::isinf(cat.experts[0].blocks[blocking.first_block[q_proj] + j].l2));
      }
    }
    EXPECT_NE(nan_block, nullptr);
    expect_matches_reference(cat.experts[0], reference_stats(base_, nan_expert_, cat.tensors),
                             "nan expert");
  }
}
