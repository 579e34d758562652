#include "merge_pipeline.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string_view>

#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/io/proc_io.hpp"
#include "mergepipe/io/slice_composition.hpp"
#include "mergepipe/io/staging.hpp"
#include "mergepipe/io/tokenizer_files.hpp"
#include "mergepipe/manifest.hpp"
#include "mergepipe/model_card.hpp"
#include "mergepipe/mpi/cpu_placement.hpp"
#include "mergepipe/plan.hpp"

namespace mergepipe::app {

namespace fs = std::filesystem;

namespace {

// The value spelled `text` among `choices`; UsageError "<what> must be a, b or c" otherwise.
template <typename T>
T parse_choice(const std::string& text,
               std::initializer_list<std::pair<std::string_view, T>> choices,
               const std::string& what) {
  std::string names;
  std::size_t i = 0;
  for (const auto& [name, value] : choices) {
    if (text == name) return value;
    names += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + std::string(name);
    ++i;
  }
  throw UsageError(what + " must be " + names);
}

// Manifests of merged inputs carry forward as lineage.
nlohmann::json lineage_of(const MergeTask& task) {
  nlohmann::json parents = nlohmann::json::array();
  auto add = [&](const std::string& dir, const char* role) {
    const std::string path = dir + "/" + kManifestFileName;
    std::error_code ec;
    if (!fs::exists(path, ec)) return;
    nlohmann::json manifest;
    try {
      manifest = nlohmann::json::parse(io::read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
      throw InputError(path + ": unreadable manifest of a merged input: " + e.what());
    }
    manifest.erase("plan");  // the parent's mask is in its own folder; keep the record small
    manifest.erase("access_mask");
    parents.push_back({{"role", role}, {"path", dir}, {"manifest", manifest}});
  };
  add(task.base.dir, "base");
  for (const auto& e : task.experts) add(e.dir, "expert");
  return parents;
}

// Each node as the manifest records it: host, ranks, threads per rank, CPUs.
nlohmann::ordered_json node_layout_json(const mpi::JobLayout& layout) {
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const mpi::NodeLayout& n : layout.nodes)
    nodes.push_back(
        {{"host", n.host}, {"ranks", n.ranks}, {"threads", n.threads}, {"cpus", n.cpus}});
  return nodes;
}

// Writes the output folder's files beside the tensors; returns the names it wrote.
std::set<std::string> write_folder_metadata(const MergeTask& task, const std::string& dir,
                                            const FolderOptions& folder) {
  std::set<std::string> written;
  const auto write = [&](const std::string& name, const std::string& text) {
    io::write_text_file(dir + "/" + name, text);
    written.insert(name);
  };
  // The base model's folder (a frankenmerge's base location spans several models' files).
  const std::string base_dir = task.spec.base_model;
  const std::string base_config = base_dir + "/config.json";
  std::error_code ec;
  if (fs::exists(base_config, ec)) {
    std::string text = io::read_text_file(base_config);
    if (!task.spec.slices.empty()) text = io::rewrite_config_layers(text, task.spec);
    if (task.spec.out_dtype)
      text = io::rewrite_config_dtype(text, torch_dtype_name(*task.spec.out_dtype));
    write("config.json", text);
  }
  // The base's processor files, and the tokenizer of tokenizer_source (the base's by default).
  const std::string tokenizer_dir = io::tokenizer_folder(task.spec);
  for (const auto& entry : fs::directory_iterator(base_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !io::is_carried_file(name) || io::is_tokenizer_file(name))
      continue;
    io::copy_file(entry.path().string(), dir + "/" + name);
    written.insert(name);
  }
  if (folder.copy_tokenizer) {
    for (const auto& entry : fs::directory_iterator(tokenizer_dir)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && io::is_tokenizer_file(name)) {
        io::copy_file(entry.path().string(), dir + "/" + name);
        written.insert(name);
      }
    }
    const std::string chat_template = io::resolve_chat_template(task.spec);
    if (!chat_template.empty()) {
      const std::string config = dir + "/tokenizer_config.json";
      std::error_code exists_ec;
      const std::string text = fs::exists(config, exists_ec) ? io::read_text_file(config) : "";
      write("tokenizer_config.json", io::with_chat_template(text, chat_template, config));
      // Newer tokenizers keep the template in a file of its own, which wins over the config's.
      if (fs::exists(dir + "/chat_template.jinja", exists_ec))
        write("chat_template.jinja", chat_template);
    }
  }
  if (!folder.config_text.empty()) write("mergekit_config.yml", folder.config_text);
  if (folder.write_model_card) {
    write("README.md", make_model_card(task, folder.card_title, folder.config_text));
  }
  if (task.format == OutputFormat::kSafetensors) {
    const io::OutputLayout layout =
        io::make_output_layout(task.output_tensors(), task.max_shard_bytes);
    if (!layout.index_json.empty()) write("model.safetensors.index.json", layout.index_json);
  }
  return written;
}

}  // namespace

void add_run_options(po::options_description& desc, PipelineOptions& options, RunOptionText& text) {
  desc.add_options()("threads,num-threads,j", po::value(&options.threads)->default_value(0),
                     "compute threads per rank (0: the CPUs the rank is bound to, else the node's "
                     "CPUs divided by its ranks; -j and --num-threads: mergekit's spelling)")(
      "io-threads", po::value(&options.io_threads)->default_value(0),
      "concurrent reads per rank (0: 8, or 1 when every input file is already in the page "
      "cache)")("prefetch", po::value(&options.prefetch_depth)->default_value(0),
                "slices read ahead per rank (0: 8 for a budgeted merge, 2 for --full-read)")(
      "read-size", po::value(&text.read_size)->default_value("128KiB"),
      "blocks are merged in slices of this size (and read so when not held in pieces)")(
      "expert-piece-size", po::value(&text.expert_piece_size)->default_value("64MiB"),
      "budgeted merge with experts read by O_DIRECT: admitted expert bytes and their blocks' "
      "base bytes read ahead into memory per piece, in 4 MiB requests, while the previous "
      "piece merges (0 or off: read each slice as it merges, the base through the page cache, "
      "as with experts read through the page cache; a linear or DARE --full-read uses 256 MiB "
      "pieces)")(
      "force", po::bool_switch(&options.force),
      "replace an existing output folder (the new one is complete before the old one goes)")(
      "allow-nonfinite", po::bool_switch(&options.allow_nonfinite),
      "write NaN/Inf results instead of failing")(
      "no-resume", po::bool_switch(&text.no_resume),
      "start afresh even if a killed run of the same merge left its staging folder")(
      "verify-reads", po::value(&text.verify_reads)->default_value("reads"),
      "check reads against the catalog's block hashes: reads (every block the merge reads), "
      "first (the first block each rank reads from each file), all (every block read, and every "
      "block of every input file before the merge), or off")(
      "mpiio-hint", po::value(&text.hints)->composing(),
      "MPI-IO hint key=value for the output files (repeatable)")(
      "input-io", po::value(&text.input_io)->default_value("auto"),
      "how inputs read once are read: direct (O_DIRECT, around the page cache), buffered, or "
      "auto (direct for files not already cached)")(
      "output-io", po::value(&text.output_io)->default_value("auto"),
      "how the safetensors shards are written: direct (whole pages with O_DIRECT, around the page "
      "cache), buffered, or auto (direct unless the merge reads whole files through the cache: a "
      "linear or DARE --full-read of warm files)")(
      "schedule", po::value(&text.schedule)->default_value("dynamic"),
      "how a node's blocks are spread over its ranks: dynamic (chunks drawn as ranks finish) or "
      "static (a fixed range per rank)");
  add_output_options(desc, text.style);
}

namespace {

std::string verify_reads_name(mpi::VerifyReads level) {
  switch (level) {
    case mpi::VerifyReads::kOff:
      return "off";
    case mpi::VerifyReads::kFirstPerFile:
      return "first";
    case mpi::VerifyReads::kEveryRead:
      return "reads";
    case mpi::VerifyReads::kAll:
      return "all";
  }
  return "reads";
}

}  // namespace

void finish_run_options(const RunOptionText& text, PipelineOptions& options,
                        const std::string& command) {
  if (options.threads < 0 || options.io_threads < 0 || options.prefetch_depth < 0)
    throw UsageError(command + ": --threads, --io-threads and --prefetch must be >= 0");
  options.mpiio_hints = parse_hints(text.hints);
  options.read_bytes = parse_byte_size(text.read_size, command + ": --read-size");
  if (options.read_bytes < 4096) throw UsageError(command + ": --read-size must be at least 4KiB");
  options.expert_piece_bytes =
      text.expert_piece_size == "0" || text.expert_piece_size == "off"
          ? 0
          : parse_byte_size(text.expert_piece_size, command + ": --expert-piece-size");
  options.resume = !text.no_resume;
  options.verify_reads = parse_choice<mpi::VerifyReads>(text.verify_reads,
                                                        {{"reads", mpi::VerifyReads::kEveryRead},
                                                         {"first", mpi::VerifyReads::kFirstPerFile},
                                                         {"all", mpi::VerifyReads::kAll},
                                                         {"off", mpi::VerifyReads::kOff}},
                                                        command + ": --verify-reads");
  options.input_io = parse_choice<io::InputIo>(
      text.input_io,
      {{io::input_io_name(io::InputIo::kAuto), io::InputIo::kAuto},
       {io::input_io_name(io::InputIo::kDirect), io::InputIo::kDirect},
       {io::input_io_name(io::InputIo::kBuffered), io::InputIo::kBuffered}},
      command + ": --input-io");
  options.output_io = parse_choice<io::OutputIo>(
      text.output_io,
      {{io::output_io_name(io::OutputIo::kAuto), io::OutputIo::kAuto},
       {io::output_io_name(io::OutputIo::kDirect), io::OutputIo::kDirect},
       {io::output_io_name(io::OutputIo::kBuffered), io::OutputIo::kBuffered}},
      command + ": --output-io");
  options.schedule = parse_choice<mpi::Schedule>(
      text.schedule, {{"dynamic", mpi::Schedule::kDynamic}, {"static", mpi::Schedule::kStatic}},
      command + ": --schedule");
  options.style = parse_output_style(text.style, command);
}

void check_merge_target(const std::string& command, const PipelineOptions& options,
                        const std::vector<io::GuardedInput>& inputs) {
  io::check_output_target(command + ": --out", options.out, inputs);
  io::check_replaceable_merge_output(options.out, options.force);
}

std::vector<std::pair<std::string, std::string>> parse_hints(
    const std::vector<std::string>& hints) {
  // Each flag holds one or more comma-separated key=value pairs (MPI-IO hint values never
  // contain commas or '=').
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& flag : hints) {
    std::size_t begin = 0;
    while (begin <= flag.size()) {
      const std::size_t end = std::min(flag.find(',', begin), flag.size());
      const std::string h = flag.substr(begin, end - begin);
      const auto eq = h.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == h.size() ||
          h.find('=', eq + 1) != std::string::npos)
        throw UsageError("--mpiio-hint '" + flag + "': expected key=value[,key=value...]");
      out.emplace_back(h.substr(0, eq), h.substr(eq + 1));
      begin = end + 1;
    }
  }
  return out;
}

// A budgeted merge reads its expert blocks around the page cache (O_DIRECT), so nothing reads
// ahead of them: the slices read ahead are the device's only queue, and a slice of a block with
// one or two admitted experts is only a few 128 KiB requests. Measured (K = 20 TIES 10%, cold,
// 6 alternated reps): depth 8 instead of 2 B/A 0.958 (6 of 6 pairs faster), 4 and 8 alike, 16
// slower (1.07). A full read streams through the page cache with the kernel's read-ahead and
// merges from held windows: there 8 only added compute (cache misses), B/A 1.02.
namespace {
int default_prefetch_depth(const MergeTask& task) {
  return task.full_read ? 2 : 8;
}
}  // namespace

PipelineOutcome execute_and_publish(CommandContext& ctx, MergeTask& task,
                                    const PipelineOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const mpi::Comm& comm = ctx.comm;
  std::string bytes = comm.is_root() ? serialize_task(task) : std::string();
  comm.broadcast(bytes, 0, "broadcast merge task");
  if (!comm.is_root()) task = deserialize_task(bytes);
  PipelineOutcome outcome;
  const mpi::CpuPlacement placement =
      options.placement ? *options.placement : mpi::cpu_placement(comm);
  outcome.threads = options.threads > 0 ? options.threads : mpi::default_threads(placement);
  outcome.layout = mpi::job_layout(comm, placement, outcome.threads);
  if (const std::string advice = mpi::idle_cpu_advice(placement); comm.is_root() && !advice.empty())
    print_warning(options.style, advice);

  // Stage, or pick up what a killed run of this same task left behind.
  std::unique_ptr<io::StagingFolder> staging;
  std::uint64_t resumed = 0;
  auto failure = mpi::capture_failure([&] {
    if (!comm.is_root()) return;
    io::StagingOptions staging_options;
    staging_options.replace = options.force;
    staging_options.resume = options.resume;
    staging_options.resume_key = task_identity(task);
    staging = std::make_unique<io::StagingFolder>(options.out, staging_options);
    resumed = staging->resumed() ? 1 : 0;
  });
  comm.check(failure, "create staging folder");
  resumed = comm.allreduce_max(resumed, "broadcast resume");

  const auto display = make_progress_display(options.style, comm.is_root());
  mpi::MergeRunOptions run_options;
  run_options.output_dir = io::staging_path_for(options.out);
  run_options.threads = outcome.threads;
  run_options.io_threads = options.io_threads;
  outcome.prefetch_depth =
      options.prefetch_depth > 0 ? options.prefetch_depth : default_prefetch_depth(task);
  run_options.prefetch_depth = outcome.prefetch_depth;
  run_options.read_bytes = options.read_bytes;
  run_options.expert_piece_bytes = options.expert_piece_bytes;
  run_options.hold_base = options.hold_base;
  run_options.allow_nonfinite = options.allow_nonfinite;
  run_options.mpiio_hints = options.mpiio_hints;
  run_options.resume = resumed != 0;
  run_options.verify_reads = options.verify_reads;
  run_options.input_io = options.input_io;
  run_options.output_io = options.output_io;
  run_options.schedule = options.schedule;
  run_options.progress = display.get();
  outcome.run = mpi::run_merge(comm, task, run_options);

  // The kernel's view of this process's I/O, summed over ranks (a cross-check of our counters).
  const io::KernelIoCounters kio = io::read_kernel_io_counters();
  const std::uint64_t k_rchar = comm.allreduce_sum(kio.rchar, "reduce kernel io");
  const std::uint64_t k_wchar = comm.allreduce_sum(kio.wchar, "reduce kernel io");
  const std::uint64_t k_read = comm.allreduce_sum(kio.read_bytes, "reduce kernel io");
  const std::uint64_t k_write = comm.allreduce_sum(kio.write_bytes, "reduce kernel io");

  failure = mpi::capture_failure([&] {
    if (!comm.is_root()) return;
    if (!outcome.run.thresholds.empty()) {
      // --full-read TIES: the thresholds came from the data; the plan records them.
      task.plan.thresholds = outcome.run.thresholds;
      task.plan.hash = compute_plan_hash(task.plan);
    }
    if (!outcome.run.linear_forms.empty()) {
      // --full-read Gram method: each tensor's coefficients came from the data; the plan records
      // them.
      task.plan.linear_forms = outcome.run.linear_forms;
      task.plan.hash = compute_plan_hash(task.plan);
    }
    if (!options.expected_hashes.empty()) {
      for (std::size_t t = 0; t < task.tensors.size(); ++t) {
        auto it = options.expected_hashes.find(task.tensors[t].name);
        if (it == options.expected_hashes.end() || it->second != outcome.run.tensor_hashes[t]) {
          throw InputError("replay of plan " + task.plan.hash +
                           " produced different bytes for tensor '" + task.tensors[t].name +
                           "' than the manifest records (inputs changed?)");
        }
      }
    }
    FolderOptions folder = options.folder;
    if (folder.card_title.empty()) {
      std::string out = options.out;
      while (out.size() > 1 && out.back() == '/') out.pop_back();
      folder.card_title = fs::path(out).filename().string();
    }
    std::set<std::string> published = write_folder_metadata(task, staging->path(), folder);
    published.insert(outcome.run.files.begin(), outcome.run.files.end());
    published.insert(kManifestFileName);
    ManifestRecord record;
    record.task = &task;
    record.plan_json = plan_to_json(task.plan);
    record.catalog_path = options.catalog_path;
    record.bytes_base = outcome.run.bytes.base;
    record.bytes_expert = outcome.run.bytes.expert;
    record.bytes_catalog = options.catalog_bytes;
    record.bytes_output = outcome.run.bytes.output_written;
    record.tensor_hashes = outcome.run.tensor_hashes;
    record.output_files = outcome.run.files;
    record.ranks = comm.size();
    record.threads = outcome.threads;
    record.max_rss_bytes = outcome.run.max_rss_bytes;
    record.lineage_parents = lineage_of(task);
    record.replay_of = options.replay_of;
    record.extra = {{"output_folder",
                     {{"copy_tokenizer", folder.copy_tokenizer},
                      {"write_model_card", folder.write_model_card},
                      {"card_title", folder.card_title},
                      {"config_text", folder.config_text}}},
                    {"io_threads", outcome.run.io_threads},
                    {"prefetch_depth", outcome.prefetch_depth},
                    {"schedule", options.schedule == mpi::Schedule::kStatic ? "static" : "dynamic"},
                    {"read_bytes", options.read_bytes},
                    {"cpus_per_rank", placement.rank_cpus},
                    {"nodes", outcome.layout.nodes.size()},
                    {"ranks_per_node", outcome.layout.ranks_per_node()},
                    {"node_layout", node_layout_json(outcome.layout)},
                    {"input_io",
                     {{"mode", std::string(io::input_io_name(options.input_io))},
                      {"files", outcome.run.input_files},
                      {"direct_files", outcome.run.input_files_direct}}},
                    {"output_io",
                     {{"mode", std::string(io::output_io_name(options.output_io))},
                      {"written", std::string(io::output_io_name(outcome.run.output_io))},
                      {"direct_bytes", outcome.run.output_bytes_direct}}},
                    {"expert_pieces",
                     {{"piece_bytes", outcome.run.expert_piece_bytes},
                      {"pieces", outcome.run.expert_pieces},
                      {"held", outcome.run.held_pieces},
                      {"held_bytes", outcome.run.held_piece_bytes}}},
                    {"full_read_windows",
                     {{"windows", outcome.run.windows},
                      {"window_bytes", outcome.run.window_bytes},
                      {"held_shares", outcome.run.held_shares},
                      {"held_bytes", outcome.run.held_bytes},
                      {"fill_wait_seconds", outcome.run.fill_wait_seconds},
                      {"combine_seconds", outcome.run.combine_seconds},
                      {"speculative_blocks", outcome.run.speculative_blocks},
                      {"speculative_redone", outcome.run.speculative_redone}}},
                    {"base_read_ahead",
                     {{"bytes", options.base_read_ahead_bytes},
                      {"seconds", options.base_read_ahead_seconds},
                      {"wait_seconds", options.base_read_ahead_wait_seconds}}},
                    {"verify_reads", verify_reads_name(options.verify_reads)},
                    {"resume",
                     {{"resumed", resumed != 0},
                      {"blocks_total", outcome.run.blocks_total},
                      {"blocks_kept", outcome.run.blocks_resumed},
                      {"blocks_rejected", outcome.run.blocks_rejected},
                      {"bytes_checked", outcome.run.bytes_resume_check}}},
                    {"kernel_io",
                     {{"available", kio.available},
                      {"rchar", k_rchar},
                      {"wchar", k_wchar},
                      {"read_bytes", k_read},
                      {"write_bytes", k_write}}}};
    outcome.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() +
        options.catalog_load_seconds + options.plan_seconds + options.base_read_ahead_wait_seconds;
    record.timings = {{"catalog_load", options.catalog_load_seconds},
                      {"plan", options.plan_seconds},
                      {"threshold_scan", outcome.run.scan_seconds},
                      {"threshold_scan_read_wait", outcome.run.scan_read_wait_seconds},
                      {"merge", outcome.run.merge_seconds},
                      {"read_wait", outcome.run.read_wait_seconds},
                      {"compute", outcome.run.compute_seconds},
                      {"write", outcome.run.write_seconds},
                      {"output_sync", outcome.run.finish_seconds},
                      {"total", outcome.total_seconds}};
    outcome.manifest = make_manifest(record);
    io::write_text_file(staging->path() + "/" + kManifestFileName, outcome.manifest.dump(2) + "\n");
    staging->publish_exactly(published);
  });
  comm.check(failure, "publish output");
  return outcome;
}

}  // namespace mergepipe::app
