#include "merge_pipeline.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/output_layout.hpp"
#include "mergepipe/io/staging.hpp"
#include "mergepipe/manifest.hpp"
#include "mergepipe/mpi/threshold_prepass.hpp"
#include "mergepipe/plan.hpp"

namespace mergepipe::app {

namespace fs = std::filesystem;

namespace {

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

void write_folder_metadata(const MergeTask& task, const std::string& dir) {
  const std::string base_config = task.base.dir + "/config.json";
  std::error_code ec;
  if (fs::exists(base_config, ec)) {
    std::string text = io::read_text_file(base_config);
    if (task.spec.out_dtype)
      text = io::rewrite_config_dtype(text, torch_dtype_name(*task.spec.out_dtype));
    io::write_text_file(dir + "/config.json", text);
  }
  for (const auto& entry : fs::directory_iterator(task.base.dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && io::is_carried_file(name))
      io::copy_file(entry.path().string(), dir + "/" + name);
  }
  if (task.format == OutputFormat::kSafetensors) {
    const io::OutputLayout layout =
        io::make_output_layout(task.output_tensors(), task.max_shard_bytes);
    if (!layout.index_json.empty())
      io::write_text_file(dir + "/model.safetensors.index.json", layout.index_json);
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> parse_hints(
    const std::vector<std::string>& hints) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& h : hints) {
    const auto eq = h.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--mpiio-hint '" + h + "': expected key=value");
    out.emplace_back(h.substr(0, eq), h.substr(eq + 1));
  }
  return out;
}

PipelineOutcome execute_and_publish(CommandContext& ctx, MergeTask& task,
                                    const PipelineOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const mpi::Comm& comm = ctx.comm;
  std::string bytes = comm.is_root() ? serialize_task(task) : std::string();
  comm.broadcast(bytes, 0, "broadcast merge task");
  if (!comm.is_root()) task = deserialize_task(bytes);

  double prepass_seconds = 0;
  if (task.full_read && uses_magnitude_trim(task.spec.method) && task.plan.thresholds.empty()) {
    const auto tp = std::chrono::steady_clock::now();
    task.plan.thresholds = mpi::compute_thresholds_from_data(comm, task);
    task.plan.hash = compute_plan_hash(task.plan);
    prepass_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tp).count();
  }
  const io::ByteCounts prepass_bytes = io::global_byte_counters().snapshot();
  const std::uint64_t prepass_base = comm.allreduce_sum(prepass_bytes.base, "reduce bytes");
  const std::uint64_t prepass_expert = comm.allreduce_sum(prepass_bytes.expert, "reduce bytes");

  std::unique_ptr<io::StagingFolder> staging;
  auto failure = mpi::capture_failure([&] {
    if (comm.is_root()) staging = std::make_unique<io::StagingFolder>(options.out, options.force);
  });
  comm.check(failure, "create staging folder");

  mpi::MergeRunOptions run_options;
  run_options.output_dir = io::staging_path_for(options.out);
  run_options.threads = options.threads;
  run_options.prefetch_depth = options.prefetch_depth;
  run_options.allow_nonfinite = options.allow_nonfinite;
  run_options.mpiio_hints = options.mpiio_hints;

  PipelineOutcome outcome;
  outcome.run = mpi::run_merge(comm, task, run_options);

  failure = mpi::capture_failure([&] {
    if (!comm.is_root()) return;
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
    write_folder_metadata(task, staging->path());
    ManifestRecord record;
    record.task = &task;
    record.plan_json = plan_to_json(task.plan);
    record.catalog_path = options.catalog_path;
    record.bytes_base = outcome.run.bytes.base + prepass_base;
    record.bytes_expert = outcome.run.bytes.expert + prepass_expert;
    record.bytes_catalog = options.catalog_bytes;
    record.bytes_output = outcome.run.bytes.output_written;
    record.tensor_hashes = outcome.run.tensor_hashes;
    record.output_files = outcome.run.files;
    record.ranks = comm.size();
    record.threads = options.threads;
    record.max_rss_bytes = outcome.run.max_rss_bytes;
    record.lineage_parents = lineage_of(task);
    record.replay_of = options.replay_of;
    outcome.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() +
        options.plan_seconds;
    record.timings = {
        {"plan", options.plan_seconds},           {"threshold_prepass", prepass_seconds},
        {"merge", outcome.run.merge_seconds},     {"read_wait", outcome.run.read_wait_seconds},
        {"compute", outcome.run.compute_seconds}, {"write", outcome.run.write_seconds},
        {"total", outcome.total_seconds}};
    outcome.manifest = make_manifest(record);
    io::write_text_file(staging->path() + "/" + kManifestFileName, outcome.manifest.dump(2) + "\n");
    staging->publish();
  });
  comm.check(failure, "publish output");
  outcome.run.bytes.base += prepass_base;
  outcome.run.bytes.expert += prepass_expert;
  return outcome;
}

}  // namespace mergepipe::app
