// `mergepipe catalog`: builds a family's block catalog, extends it with new experts, or checks
// that the files it describes are unchanged (--check).
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "mergepipe/budget.hpp"
#include "mergepipe/catalog.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/io/folder_lock.hpp"
#include "mergepipe/io/output_guard.hpp"
#include "mergepipe/io/staging.hpp"
#include "mergepipe/mpi/catalog_build.hpp"
#include "mergepipe/mpi/cpu_placement.hpp"
#include "output_style.hpp"

namespace mergepipe::app {

namespace {

bool same_folder(const std::string& a, const std::string& b) {
  if (normalize_checkpoint_dir(a) == normalize_checkpoint_dir(b)) return true;
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec);
}

// Rank 0's hold on --out: checked against the inputs, created when new (and removed again if
// the build fails), locked until the catalog is written.
class CatalogFolderClaim {
 public:
  void take(const std::string& out, const std::string& base,
            const std::vector<std::string>& experts) {
    std::vector<io::GuardedInput> inputs{{"base", base}};
    for (const std::string& e : experts) inputs.push_back({"expert", e});
    io::check_output_target("catalog: --out", out, inputs);
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(out, ec))) {
      const fs::path parent = fs::absolute(fs::path(out)).lexically_normal().parent_path();
      fs::create_directories(parent, ec);
      if (ec) throw IoError(parent.string() + ": cannot create folder: " + ec.message());
      if (!fs::create_directory(out, ec) || ec)
        throw IoError(out + ": cannot create the catalog folder: " +
                      (ec ? ec.message() : std::string("it appeared meanwhile")));
      created_ = out;
    } else if (!io::is_catalog_folder(out) && !io::holds_only_the_lock(out)) {
      throw UsageError("catalog: --out " + out +
                       ": exists and is not a catalog folder; refusing to replace it");
    }
    lock_.emplace(out, "catalog " + out +
                           ": another catalog build or extension is writing it "
                           "right now");
  }
  void keep() { created_.clear(); }
  ~CatalogFolderClaim() {
    lock_.reset();
    if (!created_.empty()) io::remove_tree(created_);
  }

 private:
  std::optional<io::FolderLock> lock_;
  std::string created_;  // removed unless a catalog was written into it
};

int run_check(CommandContext& ctx, const std::string& path) {
  std::string summary;
  ctx.comm.check(mpi::capture_failure([&] {
                   if (!ctx.comm.is_root()) return;
                   const Catalog cat = io::load_catalog(path);
                   io::check_catalog_fresh(cat, std::nullopt, {}, path);
                   summary = "catalog " + path + " is fresh: the base and " +
                             std::to_string(cat.expert_count()) + " expert" +
                             (cat.expert_count() == 1 ? "" : "s") + " are unchanged";
                 }),
                 "catalog --check");
  if (ctx.comm.is_root()) std::printf("%s\n", summary.c_str());
  return 0;
}

}  // namespace

int cmd_catalog(CommandContext& ctx) {
  std::string base, out, check, block_bytes_text;
  std::vector<std::string> experts;
  bool force = false, allow_nonfinite = false;
  int threads = 0;
  OutputStyleText style_text;
  po::options_description options("catalog options");
  options.add_options()("base", po::value(&base), "base model folder")(
      "experts", po::value(&experts)->multitoken(), "expert model folders (one or more)")(
      "out", po::value(&out),
      "catalog folder to create; an existing catalog is extended with the experts it lacks")(
      "block-bytes", po::value(&block_bytes_text),
      "target block size: bytes or 512KiB/4MiB/... (default 4MiB; fixed once a catalog exists)")(
      "force", po::bool_switch(&force), "rebuild the catalog at --out from scratch")(
      "allow-nonfinite", po::bool_switch(&allow_nonfinite),
      "catalog experts holding NaN/Inf values instead of refusing them")(
      "threads", po::value(&threads)->default_value(0),
      "compute threads per rank (0: the CPUs the rank is bound to, else the node's CPUs divided by "
      "its ranks)")(
      "check", po::value(&check),
      "only check that the files CATALOG describes are unchanged (exit 0, or 3 when stale)");
  add_output_options(options, style_text);
  const auto vm = parse_command_line(
      "catalog", "--base DIR --experts DIR... --out CATALOG [--block-bytes N] | --check CATALOG",
      options, po::positional_options_description(), ctx.args, ctx.comm.is_root());
  if (!vm) return 0;
  const OutputStyle style = parse_output_style(style_text, "catalog");
  if (!check.empty()) {
    if (!base.empty() || !experts.empty() || !out.empty()) {
      throw UsageError("catalog: --check takes only the catalog folder");
    }
    return run_check(ctx, check);
  }
  if (base.empty())
    throw UsageError("catalog: --base is required (see 'mergepipe catalog --help')");
  if (experts.empty()) throw UsageError("catalog: --experts needs at least one folder");
  if (out.empty()) throw UsageError("catalog: --out is required");
  if (threads < 0) throw UsageError("catalog: --threads must be >= 0");
  // 0: not given (the default for a new catalog, the existing catalog's size otherwise).
  const std::uint64_t block_bytes =
      block_bytes_text.empty() ? 0 : parse_byte_size(block_bytes_text, "catalog: --block-bytes");

  const auto start = std::chrono::steady_clock::now();
  const io::ByteCounts before = io::global_byte_counters().snapshot();
  mpi::CatalogBuildOptions build;
  build.base_dir = base;
  build.block_bytes = block_bytes != 0 ? block_bytes : kDefaultBlockBytes;
  build.allow_nonfinite = allow_nonfinite;
  build.threads = threads;

  // Before anything is read: --out is no input, and rank 0 holds the catalog folder's lock until
  // the catalog is written, so a concurrent build or extension of it fails instead of one of the
  // two losing its experts.
  CatalogFolderClaim claim;
  ctx.comm.check(mpi::capture_failure([&] {
                   if (ctx.comm.is_root()) claim.take(out, base, experts);
                 }),
                 "catalog: claiming --out");

  // An existing catalog is extended (unless --force): every rank needs its structure.
  std::vector<std::string> skipped;
  ctx.comm.check(
      mpi::capture_failure([&] {
        if (!io::is_catalog_folder(out)) return;
        if (force) return;
        Catalog existing = io::load_catalog(out);
        if (ctx.comm.is_root()) io::check_catalog_fresh(existing, std::nullopt, {}, out);
        // Same-architecture families share a family id (it hashes headers only), so
        // only the folder tells another family's base from this one's.
        if (!same_folder(base, existing.base.dir)) {
          throw InputError("catalog: " + out + " was built from the base " + existing.base.dir +
                           ", not " + normalize_checkpoint_dir(base) +
                           " (a catalog of another family?); use another --out, or "
                           "--force to rebuild it");
        }
        if (block_bytes != 0 && block_bytes != existing.blocking.block_bytes) {
          throw UsageError("catalog: " + out + " was built with --block-bytes " +
                           std::to_string(existing.blocking.block_bytes) +
                           "; pass --force to rebuild it with " + std::to_string(block_bytes));
        }
        build.existing = std::move(existing);
      }),
      "catalog: opening the existing catalog");
  for (const std::string& dir : experts) {
    if (build.existing && build.existing->find_expert(dir) >= 0) {
      skipped.push_back(dir);
    } else {
      build.expert_dirs.push_back(dir);
    }
  }
  if (ctx.comm.is_root()) {
    for (const std::string& dir : skipped) std::printf("already catalogued: %s\n", dir.c_str());
  }
  if (build.expert_dirs.empty()) {
    if (ctx.comm.is_root()) std::printf("catalog %s: nothing to add\n", out.c_str());
    return 0;
  }

  const std::size_t added = build.expert_dirs.size();
  const mpi::CpuPlacement placement = mpi::cpu_placement(ctx.comm);
  if (build.threads == 0) build.threads = mpi::default_threads(placement);
  if (const std::string advice = mpi::idle_cpu_advice(placement);
      ctx.comm.is_root() && !advice.empty())
    print_warning(style, advice);
  const auto display = make_progress_display(style, ctx.comm.is_root());
  build.progress = display.get();
  Catalog cat = mpi::build_catalog(ctx.comm, build);
  std::uint64_t catalog_bytes = 0;
  ctx.comm.check(
      mpi::capture_failure([&] {
        if (!ctx.comm.is_root()) return;
        cat.build_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        io::save_catalog(cat, out);
        claim.keep();
        catalog_bytes = io::catalog_size_bytes(out);
      }),
      "catalog: writing the catalog");

  const io::ByteCounts after = io::global_byte_counters().snapshot();
  const std::uint64_t base_read =
      ctx.comm.allreduce_sum(after.base - before.base, "catalog: counting bytes");
  const std::uint64_t expert_read =
      ctx.comm.allreduce_sum(after.expert - before.expert, "catalog: counting bytes");
  if (ctx.comm.is_root() && style.json && !style.quiet) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print_json_line({{"event", "result"},
                     {"command", "catalog"},
                     {"out", out},
                     {"experts", cat.expert_count()},
                     {"experts_added", added},
                     {"tensors", cat.tensors.size()},
                     {"blocks", cat.block_count()},
                     {"block_bytes", cat.blocking.block_bytes},
                     {"bytes_read", {{"base", base_read}, {"expert", expert_read}}},
                     {"seconds", seconds},
                     {"catalog_bytes", catalog_bytes},
                     {"family_bytes", cat.family_bytes()}});
  } else if (ctx.comm.is_root() && !style.quiet) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::uint64_t family = cat.family_bytes();
    std::printf("catalog %s: %zu expert%s (%zu new), %zu tensors, %zu blocks of up to %s\n",
                out.c_str(), cat.expert_count(), cat.expert_count() == 1 ? "" : "s", added,
                cat.tensors.size(), cat.block_count(),
                format_bytes(cat.blocking.block_bytes).c_str());
    std::printf(
        "read: base %s, experts %s (%" PRIu64 " + %" PRIu64
        " bytes) in %.2f s (%.2f GiB/s) on %d rank%s\n",
        format_bytes(base_read).c_str(), format_bytes(expert_read).c_str(), base_read, expert_read,
        seconds,
        seconds > 0 ? static_cast<double>(base_read + expert_read) / seconds / (1u << 30) : 0.0,
        ctx.comm.size(), ctx.comm.size() == 1 ? "" : "s");
    std::printf(
        "catalog size: %s = %.4f%% of the family's %s\n", format_bytes(catalog_bytes).c_str(),
        family ? 100.0 * static_cast<double>(catalog_bytes) / static_cast<double>(family) : 0.0,
        format_bytes(family).c_str());
  }
  return 0;
}

}  // namespace mergepipe::app
