// mergepipe replay MANIFEST --out DIR: re-runs a recorded merge and checks it reproduces the
// recorded output hashes byte for byte before publishing.
#include <cstdio>

#include "cli.hpp"
#include "commands.hpp"
#include "merge_pipeline.hpp"
#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/checkpoint_location.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/slice_composition.hpp"
#include "mergepipe/manifest.hpp"
#include "mergepipe/planner.hpp"

namespace mergepipe::app {

namespace {

// Each recorded file is still there with the same size and header hash.
void check_same_files(const CheckpointLocation& recorded, const CheckpointLocation& now,
                      const std::string& manifest) {
  if (now.files.size() != recorded.files.size())
    throw InputError(manifest + ": input " + recorded.dir + " has other files than when merged");
  for (std::size_t i = 0; i < now.files.size(); ++i) {
    const FileIdentity& was = recorded.files[i];
    const FileIdentity& is = now.files[i];
    if (was.size != is.size || was.header_hash != is.header_hash) {
      throw InputError(manifest + ": input " + is.path +
                       " changed since the recorded merge (size or header differ)");
    }
  }
}

// The recorded inputs must still be the same files (size and header hash; mtime may change
// when a family is copied).
CheckpointLocation reopen_checked(const CheckpointLocation& recorded,
                                  const std::vector<TensorInfo>& tensors,
                                  const std::string& manifest) {
  const Checkpoint now = io::open_checkpoint(recorded.dir);
  if (now.shard_names != recorded.shard_names) {
    throw InputError(manifest + ": input " + recorded.dir +
                     " has different shard files than when it was merged");
  }
  CheckpointLocation located = io::locate_tensors(now, tensors);
  check_same_files(recorded, located, manifest);
  return located;
}

}  // namespace

int cmd_replay(CommandContext& ctx) {
  std::string manifest_path;
  PipelineOptions pipeline;
  RunOptionText run_text;
  po::options_description desc("replay options");
  desc.add_options()("manifest", po::value(&manifest_path)->required(),
                     "mergepipe.manifest.json of a merge")(
      "out", po::value(&pipeline.out)->required(), "output folder (published atomically)");
  add_run_options(desc, pipeline, run_text);
  po::positional_options_description pos;
  pos.add("manifest", 1);
  const auto vm =
      parse_command_line("replay", "MANIFEST --out DIR", desc, pos, ctx.args, ctx.comm.is_root());
  if (!vm) return 0;
  finish_run_options(run_text, pipeline, "replay");

  MergeTask task;
  auto failure = mpi::capture_failure([&] {
    if (!ctx.comm.is_root()) return;
    const ManifestReplayInfo info =
        parse_manifest(io::read_text_file(manifest_path), manifest_path);
    task.spec = info.spec;
    task.plan = plan_from_json(info.plan_json);
    if (task.plan.hash != info.plan_hash || compute_plan_hash(task.plan) != info.plan_hash) {
      throw InputError(manifest_path + ": the recorded plan does not match its plan hash");
    }
    task.tensors = info.tensors;
    task.out_dtypes = info.out_dtypes;
    task.block_bytes = info.block_bytes;
    task.max_shard_bytes = info.max_shard_bytes;
    task.format = info.format;
    task.full_read = info.full_read;
    std::vector<io::GuardedInput> inputs{{"manifest", manifest_path},
                                         {"base model", info.base.dir}};
    for (const auto& e : info.experts) inputs.push_back({"expert", e.dir});
    for (const auto& slice : task.spec.slices) inputs.push_back({"slice model", slice.model});
    check_merge_target("replay", pipeline, inputs);
    if (!task.spec.slices.empty()) {
      // A frankenmerge: its base location spans the slices' models; compose it again.
      io::SliceComposition now = io::compose_slices(task.spec);
      if (now.tensors != task.tensors)
        throw InputError(manifest_path + ": the slices' models no longer hold the tensors merged");
      check_same_files(info.base, now.location, manifest_path);
      task.base = std::move(now.location);
    } else {
      task.base = reopen_checked(info.base, task.tensors, manifest_path);
    }
    for (const auto& e : info.experts)
      task.experts.push_back(reopen_checked(e, task.tensors, manifest_path));
    pipeline.expected_hashes = info.tensor_hashes;
    pipeline.replay_of = info.plan_hash;
    pipeline.folder = {info.copy_tokenizer, info.write_model_card, info.config_text,
                       info.card_title};
  });
  ctx.comm.check(failure, "prepare replay");

  const PipelineOutcome outcome = execute_and_publish(ctx, task, pipeline);
  if (ctx.comm.is_root() && !pipeline.style.quiet && pipeline.style.json) {
    print_json_line(
        {{"event", "result"},
         {"command", "replay"},
         {"out", pipeline.out},
         {"plan_hash", task.plan.hash},
         {"tensors", task.tensors.size()},
         {"bytes_read", {{"base", outcome.run.bytes.base}, {"expert", outcome.run.bytes.expert}}},
         {"seconds", outcome.total_seconds}});
  } else if (ctx.comm.is_root() && !pipeline.style.quiet) {
    std::printf(
        "replayed plan %s into %s: %zu tensors byte-identical to the manifest, %s expert bytes "
        "read, %.2f s\n",
        task.plan.hash.c_str(), pipeline.out.c_str(), task.tensors.size(),
        format_bytes(outcome.run.bytes.expert).c_str(), outcome.total_seconds);
  }
  return 0;
}

}  // namespace mergepipe::app
