// mergepipe merge CONFIG --catalog CAT --budget B --out DIR  (or --full-read, the naive baseline)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "cli.hpp"
#include "commands.hpp"
#include "merge_pipeline.hpp"
#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/architecture_check.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/io/checkpoint_location.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/merge_config.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/io/read_ahead.hpp"
#include "mergepipe/io/slice_composition.hpp"
#include "mergepipe/io/tokenizer_files.hpp"
#include "mergepipe/mpi/catalog_load.hpp"
#include "mergepipe/planner.hpp"
#include "mergepipe/structure_match.hpp"

namespace mergepipe::app {

namespace {

struct MergeOptions {
  std::string config, catalog, budget, out, format = "safetensors", dtype, max_shard = "5GB";
  std::optional<double> max_error;
  std::optional<std::uint64_t> seed;
  bool full_read = false;
  bool base_read_ahead = false;
  std::uint64_t block_bytes = kDefaultBlockBytes;
  PipelineOptions pipeline;
};

// Output dtype per tensor: the config's dtype, else the base's.
std::vector<DType> output_dtypes(const MergeSpec& spec, const std::vector<TensorInfo>& tensors) {
  std::vector<DType> out;
  for (const auto& t : tensors) out.push_back(spec.out_dtype.value_or(t.dtype));
  return out;
}

// The naive baseline: no catalog, every expert block admitted.
MergeTask full_read_task(const MergeSpec& spec, std::uint64_t block_bytes) {
  MergeTask task;
  task.spec = spec;
  task.full_read = true;
  if (!spec.slices.empty()) {
    // A frankenmerge: the composed layers are the base, copied; no expert.
    io::SliceComposition composed = io::compose_slices(spec);
    task.tensors = std::move(composed.tensors);
    task.block_bytes = block_bytes;
    task.base = std::move(composed.location);
    const Blocking blocking = make_blocking(task.tensors, block_bytes);
    task.plan = make_full_read_plan(spec, task.tensors, blocking,
                                    compute_family_id(task.tensors, task.base.files));
    return task;
  }
  const Checkpoint base = io::open_checkpoint(spec.base_model);
  task.tensors = base.tensor_infos();
  task.block_bytes = block_bytes;
  task.base = io::locate_tensors(base, task.tensors);
  for (const auto& e : spec.experts) {
    const Checkpoint expert = io::open_checkpoint(e.path);
    if (auto mismatch = find_structure_mismatch(task.tensors, expert.tensor_infos())) {
      const std::string where =
          mismatch->other_index ? expert.tensors[*mismatch->other_index].file : e.path;
      throw InputError(where + ": tensor '" + mismatch->tensor + "' " + mismatch->what +
                       " (an expert must have the base's tensor names, shapes and dtypes)");
    }
    task.experts.push_back(io::locate_tensors(expert, task.tensors));
  }
  const Blocking blocking = make_blocking(task.tensors, block_bytes);
  // Every pair admitted; TIES thresholds come from the data in a pre-pass (merge_pipeline).
  task.plan = make_full_read_plan(spec, task.tensors, blocking,
                                  compute_family_id(task.tensors, base.files));
  return task;
}

// With --base-read-ahead (off by default; see budgeted_task). Rank 0's disk idles while it loads
// the catalog and plans. Every merge reads the whole base, each rank a contiguous share of about
// base ÷ ranks in tensor order: read the shares of the ranks on rank 0's node in the meantime (they
// share its page cache), its own first. No more: on a cluster, other nodes' shares would only fill
// this node's cache. Measured on one node with 2 ranks: reading both shares instead of rank 0's
// alone, B/A 0.967 (the read-ahead had reached its cap before the plan was made). It runs on any
// CPU of this node's ranks: mpirun binds rank 0 to one core, where the catalog load kept the
// read-ahead waiting (measured: 0.07 of 0.75 GB read in time), while the other ranks sleep until
// the plan arrives. Nothing if the base cannot be opened: the merge then reports that itself.
struct BaseReadAhead {
  std::unique_ptr<io::BackgroundReadAhead> reader;
  // Let it finish before the merge starts instead of stopping it once the plan is made
  // (io::finish_read_ahead_first). Measured with the catalog's files read first (K = 20 TIES
  // 10%, 2 ranks, 10 alternated cold runs): B/A 0.958; the same with the read-ahead stopped at
  // the plan, 1.153 (0.4-0.5 of 1.5 GB read by then).
  bool finish = false;
};

BaseReadAhead start_base_read_ahead(const MergeSpec& spec, int ranks,
                                    const mpi::CpuPlacement& placement, mpi::Schedule schedule) {
  try {
    const Checkpoint base = io::open_checkpoint(spec.base_model);
    std::vector<io::FileRange> shares = io::rank_shares(
        io::tensor_read_order(base), ranks,
        io::rank0_node_share_positions(placement.node_ranks, schedule == mpi::Schedule::kDynamic));
    const std::uint64_t bytes = io::total_bytes(shares);
    const auto memory = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    BaseReadAhead ahead;
    ahead.finish = io::finish_read_ahead_first(placement.node_ranks.size(), ranks, bytes, memory);
    ahead.reader =
        std::make_unique<io::BackgroundReadAhead>(std::move(shares), bytes, placement.node_cpu_ids);
    return ahead;
  } catch (const Error&) {
    return {};
  }
}

MergeTask budgeted_task(const MergeSpec& spec, const Catalog& catalog, const MergeOptions& o,
                        PipelineOptions& pipeline, const BaseReadAhead& read_ahead) {
  pipeline.catalog_bytes = io::catalog_size_bytes(o.catalog);
  const auto t0 = std::chrono::steady_clock::now();
  const PlanRequest request = plan_request_for(spec, o.budget, o.max_error);
  MergeTask task;
  task.plan = make_plan(catalog, spec, request);
  pipeline.plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (read_ahead.reader) {
    const auto wait_start = std::chrono::steady_clock::now();
    pipeline.base_read_ahead_bytes =
        read_ahead.finish ? read_ahead.reader->wait() : read_ahead.reader->stop();
    pipeline.base_read_ahead_wait_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    pipeline.base_read_ahead_seconds = read_ahead.reader->seconds();
  }
  task.spec = spec;
  task.spec.budget = request.budget.to_string();
  task.tensors = catalog.tensors;
  task.block_bytes = catalog.blocking.block_bytes;
  task.base = catalog.base;
  task.base_block_hashes = catalog.base_block_hashes;
  for (std::uint32_t idx : task.plan.catalog_expert) {
    const ExpertCatalog& expert = catalog.experts.at(idx);
    task.experts.push_back(expert.location);
    std::vector<std::uint64_t> hashes;
    hashes.reserve(expert.blocks.size());
    for (const BlockStats& s : expert.blocks) hashes.push_back(s.hash);
    task.expert_block_hashes.push_back(std::move(hashes));
  }
  return task;
}

void print_merge_summary(const MergeTask& task, const PipelineOutcome& outcome,
                         const MergeOptions& o, const CommandContext& ctx) {
  const Plan& plan = task.plan;
  const auto& b = outcome.run.bytes;
  if (o.pipeline.style.json) {
    print_json_line({{"event", "result"},
                     {"command", "merge"},
                     {"out", o.out},
                     {"method", plan.method},
                     {"plan_hash", plan.hash},
                     {"experts", task.experts.size()},
                     {"ranks", ctx.comm.size()},
                     {"nodes", outcome.layout.nodes.size()},
                     {"ranks_per_node", outcome.layout.ranks_per_node()},
                     {"threads", outcome.threads},
                     {"budget_bytes", plan.budget_bytes},
                     {"planned_expert_bytes", plan.planned_expert_bytes},
                     {"full_expert_bytes", plan.full_expert_bytes},
                     {"bytes_read", {{"base", b.base}, {"expert", b.expert}}},
                     {"bytes_written", b.output_written},
                     {"pairs_admitted", plan.pairs_admitted},
                     {"pairs_total", plan.pairs_total},
                     {"error_bound", plan.error_bound},
                     {"blocks_resumed", outcome.run.blocks_resumed},
                     {"seconds", outcome.total_seconds}});
    return;
  }
  // "2 rank(s) on 1 node x 2 thread(s)", or "4 rank(s) on 2 nodes (3+1) x 1-2 thread(s)".
  const std::vector<mpi::NodeLayout>& nodes = outcome.layout.nodes;
  std::string where = std::to_string(ctx.comm.size()) + " rank(s) on " +
                      std::to_string(nodes.size()) + (nodes.size() == 1 ? " node" : " nodes");
  int fewest = outcome.threads, most = outcome.threads;
  if (nodes.size() > 1) {
    std::string split;
    for (const mpi::NodeLayout& n : nodes)
      split += (split.empty() ? "" : "+") + std::to_string(n.ranks);
    where += " (" + split + ")";
  }
  for (const mpi::NodeLayout& n : nodes) {
    fewest = std::min(fewest, n.threads);
    most = std::max(most, n.threads);
  }
  const std::string threads =
      fewest == most ? std::to_string(most) : std::to_string(fewest) + "-" + std::to_string(most);
  std::printf("merged %zu experts (%s) into %s on %s x %s thread(s)\n", task.experts.size(),
              plan.method.c_str(), o.out.c_str(), where.c_str(), threads.c_str());
  if (outcome.run.blocks_resumed > 0) {
    std::printf(
        "  resumed            %llu of %llu blocks kept from the interrupted run (%llu "
        "rejected)\n",
        static_cast<unsigned long long>(outcome.run.blocks_resumed),
        static_cast<unsigned long long>(outcome.run.blocks_total),
        static_cast<unsigned long long>(outcome.run.blocks_rejected));
  }
  std::printf(
      "  expert bytes read  %s of %s (%.1f%%), budget %s\n", format_bytes(b.expert).c_str(),
      format_bytes(plan.full_expert_bytes).c_str(),
      plan.full_expert_bytes ? 100.0 * double(b.expert) / double(plan.full_expert_bytes) : 0.0,
      format_bytes(plan.budget_bytes).c_str());
  std::printf("  base read %s, output written %s\n", format_bytes(b.base).c_str(),
              format_bytes(b.output_written).c_str());
  std::printf("  pairs admitted     %llu of %llu (%llu all-zero skipped)\n",
              static_cast<unsigned long long>(plan.pairs_admitted),
              static_cast<unsigned long long>(plan.pairs_total),
              static_cast<unsigned long long>(plan.pairs_zero));
  std::printf("  error bound        %.6g\n", plan.error_bound);
  if (task.spec.base_is_reference && task.spec.method == MergeMethod::kKarcher) {
    // karcher weighs every model equally: the reference is one more point of the mean.
    std::printf("  reference model    %s (the config has no base_model: the first model)\n",
                task.spec.base_model.c_str());
  } else if (task.spec.base_is_reference) {
    std::printf(
        "  reference model    %s (the config has no base_model: the first model, weight %g)\n",
        task.spec.base_model.c_str(), task.spec.base_weight.value_or(1.0));
  }
  std::printf("  wall time          %.2f s (catalog %.2f s, plan %.3f s, merge %.2f s)\n",
              outcome.total_seconds, o.pipeline.catalog_load_seconds, o.pipeline.plan_seconds,
              outcome.run.merge_seconds);
  std::printf("  plan hash          %s\n", plan.hash.c_str());
}

// mergekit refuses a merge of models that are not one family unless --allow-crimes; so does
// this, from the config.json files, before any weight is read (rank 0).
void check_architectures(const MergeSpec& spec, bool allow_crimes, const OutputStyle& style) {
  const auto base = io::read_architecture(spec.base_model);
  if (!base) {
    print_warning(style, spec.base_model +
                             " has no config.json: the output has none either, and "
                             "transformers cannot load it without one (copy the base's in)");
    return;
  }
  for (const ExpertSpec& e : spec.experts) {
    const auto expert = io::read_architecture(e.path);
    if (!expert) continue;
    const std::string difference = io::architecture_difference(*base, *expert);
    if (difference.empty()) continue;
    const std::string what =
        e.path + "/config.json describes another model than the base's: " + difference;
    if (!allow_crimes) {
      throw InputError(what +
                       "; merging across architectures is refused (--allow-crimes merges "
                       "them anyway where their tensors match the base's)");
    }
    print_warning(style, what + " (merged anyway: --allow-crimes)");
  }
}

}  // namespace

int cmd_merge(CommandContext& ctx) {
  MergeOptions o;
  RunOptionText run_text;
  std::string block_bytes_text;
  double max_error = -1;
  std::uint64_t seed = 0;
  std::string out_shard_size;
  bool cuda = false, lazy_unpickle = false, verbose = false, no_copy_tokenizer = false,
       no_model_card = false, copy_tokenizer = false, model_card = false, allow_crimes = false;
  po::options_description desc("merge options");
  desc.add_options()("config", po::value(&o.config)->required(), "merge description (YAML)")(
      "catalog", po::value(&o.catalog), "catalog folder of the family (from `mergepipe catalog`)")(
      "budget", po::value(&o.budget),
      "expert read budget: 25%, 12GiB, 900MB or bytes (default: config, else 100%)")(
      "max-error", po::value(&max_error),
      "read the fewest blocks whose omitted-update bound is <= E")(
      "out", po::value(&o.out),
      "output folder (published atomically); also the second positional argument, as "
      "mergekit-yaml CONFIG OUT")("format", po::value(&o.format), "safetensors (default) or hdf5")(
      "dtype", po::value(&o.dtype),
      "output dtype: bfloat16, float16, float32 (default: config, else base)")(
      "seed,random-seed", po::value(&seed),
      "seed of the DARE masks (default: config, else 0; --random-seed: mergekit's spelling)")(
      "full-read", po::bool_switch(&o.full_read),
      "naive baseline: no catalog, read every expert block")(
      "base-read-ahead", po::bool_switch(&o.base_read_ahead),
      "rank 0 reads the base into the page cache while it loads the catalog and plans, and the "
      "merge starts when it is done (on one node)")("block-bytes", po::value(&block_bytes_text),
                                                    "block size for --full-read (default 4MiB)")(
      "max-shard-size", po::value(&o.max_shard), "largest output shard (default 5GB)")(
      "out-shard-size", po::value(&out_shard_size),
      "mergekit's --out-shard-size, in its units: 5B is five billion bytes, 500M, 100K")(
      "verbose,v", po::bool_switch(&verbose),
      "accepted for mergekit's -v (progress is shown unless --quiet)")(
      "copy-tokenizer", po::bool_switch(&copy_tokenizer),
      "copy the base's tokenizer files to the output (the default)")(
      "no-copy-tokenizer", po::bool_switch(&no_copy_tokenizer),
      "leave the tokenizer files out of the output")("write-model-card",
                                                     po::bool_switch(&model_card),
                                                     "write README.md, a model card (the default)")(
      "no-write-model-card", po::bool_switch(&no_model_card), "write no README.md")(
      "allow-crimes", po::bool_switch(&allow_crimes),
      "merge experts whose config.json names another architecture or other sizes than the "
      "base's (their tensors must still match the base's)")(
      "cuda", po::bool_switch(&cuda), "refused: MergePipe merges on CPUs under MPI")(
      "lazy-unpickle", po::bool_switch(&lazy_unpickle),
      "refused: MergePipe reads safetensors only");
  add_run_options(desc, o.pipeline, run_text);
  po::positional_options_description pos;
  pos.add("config", 1).add("out", 1);
  const auto vm = parse_command_line(
      "merge",
      "CONFIG OUT (--catalog CAT [--budget B | --max-error E] | --full-read) [options]\n"
      "       (OUT may also be given as --out OUT)",
      desc, pos, ctx.args, ctx.comm.is_root());
  if (!vm) return 0;
  // Every rank parses the same arguments, so each finds the same mistake: agreed on collectively,
  // it is reported once, by rank 0.
  ctx.comm.check(
      mpi::capture_failure([&] {
        if (cuda) {
          throw UsageError(
              "merge: --cuda: MergePipe merges on CPUs, spread over MPI ranks (there is no GPU "
              "path); "
              "drop the option and run more ranks (mpirun -np N) instead");
        }
        if (lazy_unpickle) {
          throw UsageError(
              "merge: --lazy-unpickle: MergePipe reads safetensors checkpoints only (no "
              "pickled .bin files); convert them to safetensors first");
        }
        if (copy_tokenizer && no_copy_tokenizer)
          throw UsageError("merge: --copy-tokenizer and --no-copy-tokenizer contradict each other");
        if (model_card && no_model_card) {
          throw UsageError(
              "merge: --write-model-card and --no-write-model-card contradict each other");
        }
        o.pipeline.folder.copy_tokenizer = !no_copy_tokenizer;
        o.pipeline.folder.write_model_card = !no_model_card;
        if (!vm->count("out"))  // an empty --out is the output guard's to refuse
          throw UsageError("merge: the output folder is missing (merge CONFIG OUT, or --out OUT)");
        if (!out_shard_size.empty()) {
          if (vm->count("max-shard-size"))
            throw UsageError("merge: give --out-shard-size or --max-shard-size, not both");
          o.max_shard =
              std::to_string(parse_mergekit_size(out_shard_size, "merge: --out-shard-size"));
        }
        if (o.full_read) {
          for (const char* flag : {"catalog", "budget", "max-error"}) {
            if (vm->count(flag)) {
              throw UsageError(std::string("merge: --full-read reads every expert block without a "
                                           "catalog, so --") +
                               flag + " has no meaning with it (drop one of the two)");
            }
          }
        }
        if (vm->count("max-error")) o.max_error = max_error;
        if (vm->count("budget") && o.budget.empty())
          throw UsageError("merge: --budget is empty (forms: 25%, 12GiB, 900MB, 4096)");
        if (o.format != "safetensors" && o.format != "hdf5")
          throw UsageError("merge: --format must be safetensors or hdf5");
        finish_run_options(run_text, o.pipeline, "merge");
      }),
      "check the merge options");
  if (ctx.comm.is_root()) {
    const unsigned cpus = std::thread::hardware_concurrency();
    if (cpus > 0 && static_cast<unsigned>(o.pipeline.threads) > cpus) {
      print_warning(o.pipeline.style,
                    "--threads " + std::to_string(o.pipeline.threads) + " is more than the " +
                        std::to_string(cpus) + " CPUs of this node: each rank runs " +
                        std::to_string(o.pipeline.threads) +
                        " compute threads anyway (0 picks the CPUs the rank is bound to)");
    }
  }
  o.pipeline.out = o.out;
  // A base read ahead into the page cache is read from there, not again around it.
  o.pipeline.hold_base = !o.base_read_ahead;

  o.pipeline.placement = mpi::cpu_placement(ctx.comm);
  MergeSpec spec;
  auto failure = mpi::capture_failure([&] {
    if (!ctx.comm.is_root()) return;
    spec = io::load_merge_config(o.config);
    for (const std::string& line : spec.config_warnings) print_warning(o.pipeline.style, line);
    if (spec.method == MergeMethod::kPassthrough) {
      // Copies read every byte of their sources once: nothing to budget, no catalog to use.
      for (const char* flag : {"catalog", "budget", "max-error"}) {
        if (vm->count(flag)) {
          throw UsageError(o.config + ": passthrough copies tensors and merges no expert, so --" +
                           flag + " has nothing to budget (drop it)");
        }
      }
      o.full_read = true;
    }
    if (uses_tensor_statistics(spec.method)) {
      // These cannot be budgeted (yet): they read every model once; a budget says why not.
      for (const char* flag : {"catalog", "budget", "max-error"}) {
        if (vm->count(flag)) {
          throw UsageError(o.config + ": --" + flag + ": " + tensor_statistics_needed(spec.method) +
                           ", which the catalog does not hold yet, so it cannot be "
                           "budgeted; it runs as a full read (drop --" +
                           flag + ")");
        }
      }
      o.full_read = true;
    }
    o.pipeline.folder.config_text = io::read_text_file(o.config);
    std::vector<io::GuardedInput> inputs{{"config", o.config}, {"base model", spec.base_model}};
    for (const auto& e : spec.experts) inputs.push_back({"expert", e.path});
    for (const auto& slice : spec.slices) inputs.push_back({"slice model", slice.model});
    if (!o.full_read) inputs.push_back({"catalog", o.catalog});
    check_merge_target("merge", o.pipeline, inputs);
    if (vm->count("seed")) spec.seed = seed;
    if (!o.dtype.empty()) spec.out_dtype = parse_output_dtype(o.dtype);
    spec.validate();
    if (!block_bytes_text.empty())
      o.block_bytes = parse_byte_size(block_bytes_text, "merge: --block-bytes");
    if (!o.full_read && o.catalog.empty())
      throw UsageError("merge: --catalog is required (or --full-read for the naive baseline)");
    check_architectures(spec, allow_crimes, o.pipeline.style);
    io::check_whole_model_slice(spec);
    (void)io::tokenizer_folder(spec);  // refused now, not after the merge
  });
  ctx.comm.check(failure, "read merge config");
  std::string full_read = o.full_read ? "1" : "0";  // passthrough implies it: rank 0 knows
  ctx.comm.broadcast(full_read, 0, "merge mode");
  o.full_read = full_read == "1";
  o.pipeline.catalog_path = o.full_read ? "" : o.catalog;

  // The catalog, by every rank: only the experts this merge uses, their statistics and freshness.
  Catalog catalog;
  BaseReadAhead read_ahead;
  if (!o.full_read) {
    const auto load_start = std::chrono::steady_clock::now();
    mpi::CatalogRequest request;
    if (ctx.comm.is_root()) {
      request = {o.catalog, spec.expert_paths(), io::sketch_load_for(spec),
                 o.pipeline.verify_reads == mpi::VerifyReads::kAll};
    }
    // The catalog's small files first, together, while the disk is idle; then the base. The
    // base read-ahead is off by default (measured at 483f83f): the merge's own readers, which read
    // the base beside the expert blocks, finished sooner than a read-ahead waited for first (cold,
    // 2 ranks, alternated runs: K = 2 TIES 10% B/A 0.857, K = 10 linear 0.909, K = 20 TIES 0.949,
    // linear 0.955, TIES at one rank 0.976, at 50% 0.986). Filling the page cache on one thread
    // ran at 2-3 GB/s here.
    catalog = mpi::load_checked_catalog(ctx.comm, request, [&] {
      if (o.base_read_ahead)
        read_ahead = start_base_read_ahead(spec, ctx.comm.size(), *o.pipeline.placement,
                                           o.pipeline.schedule);
    });
    o.pipeline.catalog_load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  }

  MergeTask task;
  failure = mpi::capture_failure([&] {
    if (!ctx.comm.is_root()) return;
    task = o.full_read ? full_read_task(spec, o.block_bytes)
                       : budgeted_task(spec, catalog, o, o.pipeline, read_ahead);
    task.out_dtypes = output_dtypes(task.spec, task.tensors);
    task.format = o.format == "hdf5" ? OutputFormat::kHdf5 : OutputFormat::kSafetensors;
    task.max_shard_bytes = parse_byte_size(o.max_shard, "merge: --max-shard-size");
  });
  ctx.comm.check(failure, "prepare merge");

  const PipelineOutcome outcome = execute_and_publish(ctx, task, o.pipeline);
  if (ctx.comm.is_root() && !o.pipeline.style.quiet) print_merge_summary(task, outcome, o, ctx);
  return 0;
}

}  // namespace mergepipe::app
