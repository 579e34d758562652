// mergepipe synth --preset NAME --experts K --seed S --out DIR: a synthetic checkpoint family
// (base + K experts as Hugging Face folders, and family.json). Rank 0 writes; under MPI the other
// ranks only wait for it.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli.hpp"
#include "commands.hpp"
#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/output_guard.hpp"
#include "mergepipe/io/staging.hpp"
#include "mergepipe/io/synth_family.hpp"
#include "mergepipe/synth/generator.hpp"
#include "mergepipe/synth/presets.hpp"

namespace mergepipe::app {

namespace {

namespace fs = std::filesystem;

DType parse_synth_dtype(const std::string& text) {
  if (text == "bf16" || text == "bfloat16" || text == "BF16") return DType::kBF16;
  if (text == "fp16" || text == "f16" || text == "float16" || text == "F16") return DType::kF16;
  if (text == "fp32" || text == "f32" || text == "float32" || text == "F32") return DType::kF32;
  throw UsageError("synth: --dtype '" + text + "': expected bf16, fp16 or fp32");
}

// An existing --out is accepted when empty; a non-empty one only with --force, and only when it
// holds a previous family (family.json), so a mistyped path never deletes unrelated data.
// Returns whether the target exists (and will be replaced).
bool check_out_folder(const std::string& out, bool force) {
  io::check_output_target("synth: --out", out, {});
  std::error_code ec;
  const fs::path target(out);
  if (!fs::exists(fs::symlink_status(target, ec))) return false;
  if (!fs::is_directory(target, ec))
    throw UsageError("synth: --out " + out + ": exists and is not a folder");
  if (fs::is_empty(target, ec)) return true;
  if (!force)
    throw UsageError("synth: --out " + out +
                     ": folder exists and is not empty (pass --force to replace it)");
  if (!fs::exists(target / "family.json", ec))
    throw UsageError("synth: --out " + out +
                     ": refusing to replace a folder that is not a synth family (no family.json)");
  return true;
}

int run_synth(const std::vector<std::string>& args) {
  std::string preset_name, out, dtype_text, max_shard, kinds_text;
  int experts = 0, threads = 0;
  std::uint64_t seed = 0;
  bool force = false;
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  po::options_description options("synth options");
  options.add_options()(
      "preset", po::value(&preset_name)->required(),
      "model preset: qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, qwen2.5-7b, tiny, tiny-llama")(
      "experts", po::value(&experts)->required(), "number of experts K (0 writes the base only)")(
      "seed", po::value(&seed)->default_value(0), "seed: the same seed gives the same bytes")(
      "out", po::value(&out)->required(),
      "family folder to create (base/, expert00/, ..., family.json)")(
      "layers", po::value<std::uint64_t>(), "override the preset's layer count")(
      "hidden", po::value<std::uint64_t>(),
      "override the hidden size (heads, kv heads and intermediate size scale with it; head_dim is "
      "kept)")("vocab", po::value<std::uint64_t>(),
               "override the vocabulary size (rows of embed_tokens and lm_head)")(
      "dtype", po::value(&dtype_text)->default_value("bf16"), "bf16, fp16 or fp32")(
      "max-shard-size", po::value(&max_shard),
      "largest shard (e.g. 5GB, 2MB, 100kB; default 5GB, 100kB for tiny presets)")(
      "threads", po::value(&threads)->default_value(hardware), "generator threads")(
      "kinds", po::value(&kinds_text),
      "expert kinds, cycled over the experts (default full,lora,rl,partial,vocab)")(
      "force", po::bool_switch(&force), "replace an existing family at --out");
  const auto vm = parse_command_line("synth", "--preset NAME --experts K --out DIR [options]",
                                     options, {}, args, /*print=*/true);
  if (!vm) return 0;

  const auto opt_u64 = [&](const char* name) -> std::optional<std::uint64_t> {
    if (!vm->count(name)) return std::nullopt;
    return (*vm)[name].as<std::uint64_t>();
  };
  if (experts < 0 || experts > 10000)
    throw UsageError("synth: --experts " + std::to_string(experts) +
                     ": must be between 0 and 10000");
  if (threads < 1 || threads > 4096)
    throw UsageError("synth: --threads " + std::to_string(threads) + ": must be at least 1");

  synth::FamilyOptions family_options;
  family_options.preset = synth::scale_preset(synth::find_preset(preset_name), opt_u64("layers"),
                                              opt_u64("hidden"), opt_u64("vocab"));
  family_options.dtype = parse_synth_dtype(dtype_text);
  family_options.seed = seed;
  family_options.experts = experts;
  if (!kinds_text.empty()) family_options.kinds = synth::parse_kind_list(kinds_text);

  io::SynthWriteOptions write_options;
  write_options.threads = threads;
  write_options.max_shard_bytes = synth::default_max_shard_bytes(family_options.preset);
  if (!max_shard.empty()) {
    const Budget size = Budget::parse(max_shard);
    if (size.kind != Budget::Kind::kBytes || size.bytes == 0)
      throw UsageError("synth: --max-shard-size '" + max_shard +
                       "': expected a positive size such as 2GB");
    write_options.max_shard_bytes = size.bytes;
  }

  const synth::FamilyGenerator family(family_options);
  const bool replace = check_out_folder(out, force);
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw IoError(parent.string() + ": cannot create folder: " + ec.message());
  }
  io::StagingFolder staging(out, replace);
  const io::SynthWriteResult result = io::write_synth_family(family, staging.path(), write_options);
  staging.publish();

  std::string kinds;
  for (const auto& e : family.experts()) {
    const std::string k(synth::kind_name(e.kind));
    if (kinds.find(k) == std::string::npos) kinds += (kinds.empty() ? "" : ", ") + k;
  }
  std::printf("synth: %s family, base + %d expert%s%s%s%s, %s, seed %llu -> %s\n",
              family_options.preset.name.c_str(), experts, experts == 1 ? "" : "s",
              kinds.empty() ? "" : " (", kinds.c_str(), kinds.empty() ? "" : ")",
              std::string(dtype_name(family_options.dtype)).c_str(),
              static_cast<unsigned long long>(seed), staging.target().c_str());
  std::printf("synth: %zu files, %s in %.2f s (%.1f MB/s, %d thread%s)\n", result.files,
              format_bytes(result.bytes).c_str(), result.seconds,
              result.seconds > 0 ? static_cast<double>(result.bytes) / result.seconds / 1e6 : 0.0,
              threads, threads == 1 ? "" : "s");
  return 0;
}

}  // namespace

int cmd_synth(CommandContext& ctx) {
  int rc = 0;
  std::optional<Error> failure;
  if (ctx.comm.is_root()) failure = mpi::capture_failure([&] { rc = run_synth(ctx.args); });
  // Every rank learns rank 0's outcome here (a failure becomes one error line on rank 0), and the
  // other ranks wait here until the family is published.
  ctx.comm.check(failure, "synth: waiting for rank 0 to write the family");
  ctx.comm.barrier("synth: done");
  return rc;
}

}  // namespace mergepipe::app
