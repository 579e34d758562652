// mergepipe verify DIR [--against DIR2]: with DIR2, relative L2 and max |a - b| per tensor and
// overall; without, recomputes DIR's output hashes and checks them against its manifest.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.hpp"
#include "commands.hpp"
#include "mergepipe/blocking.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/executor.hpp"
#include "mergepipe/hash.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/model_reader.hpp"
#include "mergepipe/manifest.hpp"
#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::app {

namespace {

constexpr std::uint64_t kCompareElems = 1u << 20;

struct TensorDiff {
  std::string name;
  double diff_sq = 0, ref_sq = 0, max_abs = 0;
  std::uint64_t nonfinite = 0;
  double rel_l2() const { return ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq); }
};

// Whole rows of at most ~kCompareElems elements, so HDF5 reads stay row-aligned.
std::uint64_t rows_step(const TensorInfo& t) {
  std::uint64_t row = 1;
  for (std::size_t d = 1; d < t.shape.size(); ++d) row *= t.shape[d];
  if (t.shape.size() < 2) row = 1;
  return std::max<std::uint64_t>(1, kCompareElems / std::max<std::uint64_t>(row, 1)) * row;
}

int compare_models(const std::string& dir, const std::string& against, bool json, double max_rel) {
  auto a = io::open_model(dir);
  auto b = io::open_model(against);
  std::vector<TensorDiff> diffs;
  std::vector<std::byte> raw_a, raw_b;
  std::vector<float> fa, fb;
  for (std::size_t i = 0; i < a->tensors().size(); ++i) {
    const TensorInfo& ta = a->tensors()[i];
    const long j = b->find(ta.name);
    if (j < 0)
      throw InputError(against + ": tensor '" + ta.name + "' is missing (present in " + dir + ")");
    const TensorInfo& tb = b->tensors()[static_cast<std::size_t>(j)];
    if (ta.shape != tb.shape) {
      throw InputError("tensor '" + ta.name + "': shape " + format_shape(ta.shape) + " in " + dir +
                       " but " + format_shape(tb.shape) + " in " + against);
    }
    TensorDiff d{ta.name};
    const std::uint64_t n = ta.numel(), step = rows_step(ta);
    for (std::uint64_t e = 0; e < n; e += step) {
      const std::uint64_t m = std::min(step, n - e);
      raw_a.resize(m * dtype_size(ta.dtype));
      raw_b.resize(m * dtype_size(tb.dtype));
      fa.resize(m);
      fb.resize(m);
      a->read(i, e, m, raw_a);
      b->read(static_cast<std::size_t>(j), e, m, raw_b);
      convert_to_f32(ta.dtype, raw_a.data(), fa.data(), m);
      convert_to_f32(tb.dtype, raw_b.data(), fb.data(), m);
      for (std::uint64_t k = 0; k < m; ++k) {
        const double x = fa[k], y = fb[k];
        if (!std::isfinite(x) || !std::isfinite(y)) {
          ++d.nonfinite;
          continue;
        }
        const double diff = x - y;
        d.diff_sq += diff * diff;
        d.ref_sq += y * y;
        d.max_abs = std::max(d.max_abs, std::fabs(diff));
      }
    }
    diffs.push_back(d);
  }
  if (b->tensors().size() != a->tensors().size()) {
    for (const auto& tb : b->tensors())
      if (a->find(tb.name) < 0)
        throw InputError(dir + ": tensor '" + tb.name + "' is missing (present in " + against +
                         ")");
  }
  TensorDiff total{"(all)"};
  for (const auto& d : diffs) {
    total.diff_sq += d.diff_sq;
    total.ref_sq += d.ref_sq;
    total.max_abs = std::max(total.max_abs, d.max_abs);
    total.nonfinite += d.nonfinite;
  }
  if (json) {
    nlohmann::ordered_json out;
    out["relative_l2"] = total.rel_l2();
    out["max_abs"] = total.max_abs;
    out["abs_l2"] = std::sqrt(total.diff_sq);
    out["nonfinite"] = total.nonfinite;
    nlohmann::ordered_json per = nlohmann::ordered_json::object();
    for (const auto& d : diffs)
      per[d.name] = {
          {"relative_l2", d.rel_l2()}, {"max_abs", d.max_abs}, {"abs_l2", std::sqrt(d.diff_sq)}};
    out["tensors"] = per;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("%-60s %14s %14s\n", "tensor", "relative L2", "max |a-b|");
    for (const auto& d : diffs)
      std::printf("%-60s %14.6e %14.6e\n", d.name.c_str(), d.rel_l2(), d.max_abs);
    std::printf("%-60s %14.6e %14.6e\n", "overall", total.rel_l2(), total.max_abs);
    std::printf("absolute L2 of the difference: %.6e; non-finite entries: %llu\n",
                std::sqrt(total.diff_sq), static_cast<unsigned long long>(total.nonfinite));
  }
  if (max_rel >= 0 && total.rel_l2() > max_rel) {
    throw InputError("relative L2 difference " + std::to_string(total.rel_l2()) +
                     " exceeds --max-rel-l2 " + std::to_string(max_rel));
  }
  return 0;
}

int check_hashes(const std::string& dir, bool json) {
  const std::string manifest_path = dir + "/" + kManifestFileName;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InputError(dir +
                     ": not a folder (verify DIR checks a mergepipe output folder; "
                     "verify DIR --against OTHER compares two models)");
  }
  if (!std::filesystem::exists(manifest_path, ec) && !ec) {
    throw InputError(
        dir + ": not a mergepipe output: it holds no " + std::string(kManifestFileName) +
        " (to compare it with another model: mergepipe verify " + dir + " --against OTHER)");
  }
  const ManifestReplayInfo info = parse_manifest(io::read_text_file(manifest_path), manifest_path);
  auto model = io::open_model(dir);
  const Blocking blocking = make_blocking(info.tensors, info.block_bytes);
  std::vector<std::byte> raw;
  std::size_t bad = 0;
  for (std::size_t t = 0; t < info.tensors.size(); ++t) {
    const std::string& name = info.tensors[t].name;
    const long idx = model->find(name);
    if (idx < 0)
      throw InputError(dir + ": tensor '" + name + "' listed in the manifest is missing");
    const DType out = model->tensors()[static_cast<std::size_t>(idx)].dtype;
    std::vector<std::uint64_t> hashes;
    for (std::uint32_t i = 0; i < blocking.block_count[t]; ++i) {
      const Block& blk = blocking.blocks[blocking.first_block[t] + i];
      raw.resize(blk.elem_count * dtype_size(out));
      model->read(static_cast<std::size_t>(idx), blk.elem_begin, blk.elem_count, raw);
      hashes.push_back(hash64(raw.data(), raw.size()));
    }
    const auto it = info.tensor_hashes.find(name);
    if (it == info.tensor_hashes.end() || it->second != combine_block_hashes(hashes)) {
      std::fprintf(stderr, "mismatch: tensor '%s' does not match its manifest hash\n",
                   name.c_str());
      ++bad;
    }
  }
  if (bad)
    throw InputError(dir + ": " + std::to_string(bad) +
                     " tensor(s) do not match the manifest's output hashes");
  if (json) {
    std::printf("{\"verified_tensors\": %zu, \"plan_hash\": \"%s\"}\n", info.tensors.size(),
                info.plan_hash.c_str());
  } else {
    std::printf("%s: all %zu tensors match the manifest's output hashes (plan %s)\n", dir.c_str(),
                info.tensors.size(), info.plan_hash.c_str());
  }
  return 0;
}

}  // namespace

int cmd_verify(CommandContext& ctx) {
  std::string dir, against;
  bool json = false;
  double max_rel = -1;
  po::options_description desc("verify options");
  desc.add_options()("dir", po::value(&dir)->required(), "merged model folder")(
      "against", po::value(&against), "reference model folder to compare values with")(
      "max-rel-l2", po::value(&max_rel), "fail (exit 3) when the overall relative L2 exceeds this")(
      "json", po::bool_switch(&json), "machine-readable output");
  po::positional_options_description pos;
  pos.add("dir", 1);
  const auto vm =
      parse_command_line("verify", "DIR [--against DIR2]", desc, pos, ctx.args, ctx.comm.is_root());
  if (!vm) return 0;
  // Serial: rank 0 checks, and its failure ends every rank the same way (one line, one exit
  // code, no MPI_Abort racing the other ranks' exit).
  int rc = 0;
  std::optional<Error> failure;
  if (ctx.comm.is_root()) {
    failure = mpi::capture_failure([&] {
      rc = against.empty() ? check_hashes(dir, json) : compare_models(dir, against, json, max_rel);
    });
  }
  ctx.comm.check(failure, "verify");
  return rc;
}

}  // namespace mergepipe::app
