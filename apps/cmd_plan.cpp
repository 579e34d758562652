// mergepipe plan CONFIG --catalog CAT [--budget B] [--max-error E] [--out plan.json] [--json]
// Plans on rank 0 from the catalog alone (expert weights are never read; freshness is checked
// from file headers) and prints a summary; other ranks only wait for the outcome.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>

#include "cli.hpp"
#include "commands.hpp"
#include "mergepipe/budget.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/byte_counters.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/merge_config.hpp"
#include "mergepipe/io/output_guard.hpp"
#include "mergepipe/io/slice_composition.hpp"
#include "mergepipe/planner.hpp"
#include "output_style.hpp"

namespace mergepipe::app {
namespace {

struct PlanOptions {
  std::string config, catalog, budget, out;
  std::optional<double> max_error;
  bool json = false;
};

double percent(std::uint64_t part, std::uint64_t whole) {
  return whole ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

void print_summary(const Plan& plan, const Catalog& catalog, const std::string& budget_text,
                   const io::ByteCounts& bytes) {
  std::printf("plan %s: %s, %zu experts, %llu tensors, %llu blocks (target %s)\n",
              plan.hash.c_str(), plan.method.c_str(), plan.expert_count(),
              static_cast<unsigned long long>(plan.tensor_count),
              static_cast<unsigned long long>(plan.block_count),
              format_bytes(catalog.blocking.block_bytes).c_str());
  std::printf("  family             %s\n", plan.family_id.c_str());
  std::printf("  budget             %s = %s\n", budget_text.c_str(),
              format_bytes(plan.budget_bytes).c_str());
  if (plan.max_error) std::printf("  max error          %.6g\n", *plan.max_error);
  std::printf("  planned reads      %s of %s full expert read (%.2f%%)\n",
              format_bytes(plan.planned_expert_bytes).c_str(),
              format_bytes(plan.full_expert_bytes).c_str(),
              percent(plan.planned_expert_bytes, plan.full_expert_bytes));
  std::printf("  pairs              %llu admitted / %llu total (%llu zero, never read)\n",
              static_cast<unsigned long long>(plan.pairs_admitted),
              static_cast<unsigned long long>(plan.pairs_total),
              static_cast<unsigned long long>(plan.pairs_zero));
  std::printf("  error bound        %.6g%s\n", plan.error_bound,
              plan.bound_is_guarantee ? "  (guaranteed: ||M - M_A|| <= bound)"
                                      : "  (estimate, not a guarantee)");
  std::printf("  deviation estimate %.6g\n", plan.deviation_estimate);
  if (plan.base_is_reference) {
    std::printf(
        "  reference model    %s (no base_model in the config: its first model, weight %g,"
        " the others' deltas taken against it)\n",
        plan.base_dir.c_str(), plan.base_weight.value_or(1.0));
  }

  std::printf("\n  per-expert coverage (admitted / non-zero)\n");
  std::printf("  %3s  %-44s %8s %8s %17s %20s %8s\n", "#", "expert", "weight", "density", "pairs",
              "bytes", "cover");
  for (std::size_t k = 0; k < plan.expert_count(); ++k) {
    const Coverage& c = plan.expert_coverage[k];
    std::string dir = plan.expert_dirs[k];
    if (dir.size() > 44) dir = "..." + dir.substr(dir.size() - 41);
    const std::string pairs =
        std::to_string(c.admitted_pairs) + "/" + std::to_string(c.nonzero_pairs);
    const std::string b = format_bytes(c.admitted_bytes) + "/" + format_bytes(c.nonzero_bytes);
    std::printf("  %3zu  %-44s %8.4g %8.4g %17s %20s %7.1f%%\n", k, dir.c_str(), plan.weights[k],
                plan.densities[k], pairs.c_str(), b.c_str(), 100.0 * c.fraction());
  }

  std::vector<std::size_t> order(plan.tensor_count);
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return plan.tensor_coverage[a].fraction() < plan.tensor_coverage[b].fraction();
  });
  const std::size_t shown = std::min<std::size_t>(10, order.size());
  std::printf("\n  %zu least-covered tensors (admitted / non-zero bytes over all experts)\n",
              shown);
  for (std::size_t i = 0; i < shown; ++i) {
    const Coverage& c = plan.tensor_coverage[order[i]];
    std::printf("  %7.1f%%  %-48s %s / %s\n", 100.0 * c.fraction(),
                plan.tensor_names[order[i]].c_str(), format_bytes(c.admitted_bytes).c_str(),
                format_bytes(c.nonzero_bytes).c_str());
  }
  std::printf("\n  plan hash          %s\n", plan.hash.c_str());
  std::printf("  planning time      %.3f ms\n", 1e3 * plan.planning_seconds);
  std::printf("  bytes read         catalog %s, expert weights %s\n",
              format_bytes(bytes.catalog).c_str(), format_bytes(bytes.expert).c_str());
}

}  // namespace

int cmd_plan(CommandContext& ctx) {
  PlanOptions o;
  double max_error = 0;
  po::options_description desc("plan options");
  desc.add_options()("config", po::value(&o.config)->required(), "merge description (YAML)")(
      "catalog", po::value(&o.catalog)->required(),
      "catalog folder of the family (from `mergepipe catalog`)")(
      "budget", po::value(&o.budget),
      "expert read budget: 25%, 12GiB, 900MB or bytes (default: config, else 100%)")(
      "max-error", po::value(&max_error),
      "read the fewest blocks (of the ranked order) whose omitted-update bound is <= E (linear, "
      "task_arithmetic)")("out", po::value(&o.out), "write the plan as JSON to this file")(
      "json", po::bool_switch(&o.json), "print the plan JSON instead of the summary");
  po::positional_options_description pos;
  pos.add("config", 1);
  const auto vm = parse_command_line(
      "plan", "CONFIG --catalog CAT [--budget B] [--max-error E] [--out plan.json] [--json]", desc,
      pos, ctx.args, ctx.comm.is_root());
  if (!vm) return 0;
  if (vm->count("max-error")) o.max_error = max_error;
  if (vm->count("budget") && o.budget.empty())
    throw UsageError("plan: --budget is empty (forms: 25%, 12GiB, 900MB, 4096)");

  // Rank 0 plans; the others learn only whether it worked, so every rank exits with its code.
  auto failure = mpi::capture_failure([&] {
    if (!ctx.comm.is_root()) return;
    const MergeSpec spec = io::load_merge_config(o.config);
    for (const std::string& line : spec.config_warnings) print_warning(OutputStyle{}, line);
    io::check_whole_model_slice(spec);
    if (vm->count("out")) {
      std::vector<io::GuardedInput> inputs{
          {"config", o.config}, {"catalog", o.catalog}, {"base model", spec.base_model}};
      for (const auto& e : spec.experts) inputs.push_back({"expert", e.path});
      io::check_output_target("plan: --out", o.out, inputs);
      io::check_replaceable_plan_file(o.out);
    }
    // Only the experts this merge uses: their statistics, their freshness.
    const Catalog catalog =
        io::load_catalog(o.catalog, spec.expert_paths(), io::sketch_load_for(spec));
    io::check_catalog_fresh(catalog, spec.expert_paths(), {}, o.catalog);
    const PlanRequest request = plan_request_for(spec, o.budget, o.max_error);
    const auto t0 = std::chrono::steady_clock::now();
    Plan plan = make_plan(catalog, spec, request);
    plan.planning_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const nlohmann::json json = plan_to_json(plan);
    if (!o.out.empty()) io::write_file_atomically(o.out, json.dump(2) + "\n");
    if (o.json) {
      std::cout << json.dump(2) << "\n";
    } else {
      print_summary(plan, catalog, request.budget.to_string(),
                    io::global_byte_counters().snapshot());
      if (!o.out.empty()) std::printf("  written            %s\n", o.out.c_str());
    }
    std::fflush(stdout);
  });
  ctx.comm.check(failure, "plan");
  return 0;
}

}  // namespace mergepipe::app
