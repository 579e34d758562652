// `mergepipe inspect PATH`: describes a checkpoint folder, a single .safetensors file, a catalog
// folder, a plan JSON (`mergepipe plan --out`) or a merge manifest.
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "mergepipe/checkpoint.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/safetensors.hpp"
#include "mergepipe/manifest.hpp"

namespace mergepipe::app {

namespace {

namespace fs = std::filesystem;

enum class PathKind { kCheckpointFolder, kSafetensorsFile, kCatalog, kPlan, kManifest, kUnknown };

// A JSON file is a manifest (its format key) or a plan (its stable plan keys).
PathKind classify_json(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError("inspect: " + path + ": not valid JSON: " + e.what());
  }
  if (j.is_object() && j.value("format", "") == kManifestFormat) return PathKind::kManifest;
  if (j.is_object() && j.contains("plan_hash") && j.contains("pairs_total")) return PathKind::kPlan;
  return PathKind::kUnknown;
}

PathKind classify(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw UsageError("inspect: " + path + ": no such file or folder");
  if (fs::is_directory(st) && io::is_catalog_folder(path)) return PathKind::kCatalog;
  if (fs::is_regular_file(st) && fs::path(path).extension() == ".json") return classify_json(path);
  if (fs::is_directory(st)) {
    const fs::path dir(path);
    if (fs::exists(dir / "model.safetensors", ec) ||
        fs::exists(dir / "model.safetensors.index.json", ec)) {
      return PathKind::kCheckpointFolder;
    }
    return PathKind::kUnknown;
  }
  if (fs::is_regular_file(st) && fs::path(path).extension() == ".safetensors") {
    return PathKind::kSafetensorsFile;
  }
  return PathKind::kUnknown;
}

std::string line(const char* label, const std::string& value) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-22s %s\n", label, value.c_str());
  return buf;
}

std::string percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return buf;
}

std::string describe_plan_json(const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(io::read_text_file(path));
  const double planned = j.at("planned_expert_bytes").get<double>(),
               full = j.at("full_expert_bytes").get<double>();
  std::string out = "plan " + path + "\n";
  out += line("method", j.value("method", "?"));
  out += line("plan hash", j.at("plan_hash").get<std::string>());
  out += line("budget bytes", std::to_string(j.at("budget_bytes").get<std::uint64_t>()));
  out += line("planned expert bytes",
              std::to_string(j.at("planned_expert_bytes").get<std::uint64_t>()) + " (" +
                  percent(planned, full) + " of the full read)");
  out +=
      line("pairs admitted", std::to_string(j.at("pairs_admitted").get<std::uint64_t>()) + " of " +
                                 std::to_string(j.at("pairs_total").get<std::uint64_t>()));
  char bound[64];
  std::snprintf(bound, sizeof bound, "%.6g%s", j.at("error_bound").get<double>(),
                j.value("bound_is_guarantee", true) ? "" : " (estimate)");
  out += line("error bound", bound);
  return out;
}

std::string describe_manifest(const std::string& path) {
  const nlohmann::json m = nlohmann::json::parse(io::read_text_file(path));
  const auto& bytes = m.at("bytes_read");
  std::string out = "manifest " + path + "\n";
  out += line("tool version", m.at("tool_version").get<std::string>());
  out += line("method", m.at("method").get<std::string>());
  out += line("plan hash", m.at("plan_hash").get<std::string>());
  out += line("budget", m.at("budget").get<std::string>() + " = " +
                            std::to_string(m.at("budget_bytes").get<std::uint64_t>()) + " bytes");
  out += line("experts", std::to_string(m.at("inputs").at("experts").size()));
  out += line("expert bytes read", std::to_string(bytes.at("expert").get<std::uint64_t>()) + " (" +
                                       percent(bytes.at("expert").get<double>(),
                                               m.at("full_expert_bytes").get<double>()) +
                                       " of the full read)");
  out += line("base bytes read", std::to_string(bytes.at("base").get<std::uint64_t>()));
  out +=
      line("output bytes written", std::to_string(bytes.at("output_written").get<std::uint64_t>()));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", m.at("error_bound").get<double>());
  out += line("error bound", buf);
  std::snprintf(buf, sizeof buf, "%.3f s", m.at("timings").at("total").get<double>());
  out += line("wall time", buf);
  out += line("ranks x threads", std::to_string(m.at("ranks").get<int>()) + " x " +
                                     std::to_string(m.at("threads").get<int>()));
  out += line("lineage parents", std::to_string(m.at("lineage").at("parents").size()));
  return out;
}

// What is shown for a checkpoint folder or a single file.
struct Described {
  std::string kind;  // "checkpoint" or "safetensors"
  std::string path;
  Checkpoint ckpt;
  std::map<std::string, std::string> metadata;  // single file only
};

Described describe_folder(const std::string& path) {
  Described d;
  d.kind = "checkpoint";
  d.path = path;
  d.ckpt = io::open_checkpoint(path);
  return d;
}

Described describe_file(const std::string& path) {
  Described d;
  d.kind = "safetensors";
  d.path = path;
  io::SafetensorsHeader header = io::read_safetensors_header(path);
  FileIdentity identity = io::stat_identity(path);
  identity.header_hash = header.header_hash;
  d.ckpt.dir = fs::path(path).parent_path().string();
  d.ckpt.shard_names.push_back(fs::path(path).filename().string());
  d.ckpt.files.push_back(identity);
  d.ckpt.tensors = std::move(header.tensors);
  d.metadata = std::move(header.metadata);
  return d;
}

struct Totals {
  std::uint64_t tensors = 0, parameters = 0, bytes = 0;
};

Totals totals_of(const Checkpoint& ckpt) {
  Totals t;
  for (const StoredTensor& s : ckpt.tensors) {
    ++t.tensors;
    t.parameters += s.info.numel();
    t.bytes += s.length;
  }
  return t;
}

// Shard file name of each tensor, and tensor count per shard.
struct ShardIndex {
  std::vector<std::size_t> shard_of;  // parallel to ckpt.tensors
  std::vector<std::size_t> count;     // parallel to ckpt.shard_names
};

ShardIndex index_shards(const Checkpoint& ckpt) {
  std::map<std::string, std::size_t> by_path;
  for (std::size_t i = 0; i < ckpt.files.size(); ++i) by_path.emplace(ckpt.files[i].path, i);
  ShardIndex idx;
  idx.count.assign(ckpt.shard_names.size(), 0);
  for (const StoredTensor& t : ckpt.tensors) {
    const std::size_t s = by_path.at(t.file);
    idx.shard_of.push_back(s);
    ++idx.count[s];
  }
  return idx;
}

// Indented top level, one line per array element: readable and still small for 400 tensors.
std::string dump_one_item_per_line(const nlohmann::ordered_json& doc) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : doc.items()) {
    out += first ? "\n  " : ",\n  ";
    first = false;
    out += nlohmann::json(key).dump() + ": ";
    if (value.is_array() && !value.empty() && value.front().is_structured()) {
      out += "[";
      for (std::size_t i = 0; i < value.size(); ++i)
        out += (i ? ",\n    " : "\n    ") + value[i].dump();
      out += "\n  ]";
    } else {
      out += value.dump();
    }
  }
  return out + "\n}\n";
}

std::string render_json(const Described& d) {
  const Checkpoint& ckpt = d.ckpt;
  const ShardIndex idx = index_shards(ckpt);
  const Totals tot = totals_of(ckpt);
  nlohmann::ordered_json out;
  out["kind"] = d.kind;
  out["path"] = d.path;
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < ckpt.shard_names.size(); ++i) {
    shards.push_back({{"file", ckpt.shard_names[i]},
                      {"size", ckpt.files[i].size},
                      {"tensors", idx.count[i]},
                      {"header_hash", ckpt.files[i].header_hash}});
  }
  out["shards"] = std::move(shards);
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < ckpt.tensors.size(); ++i) {
    const StoredTensor& t = ckpt.tensors[i];
    tensors.push_back({{"name", t.info.name},
                       {"dtype", std::string(dtype_name(t.info.dtype))},
                       {"shape", t.info.shape},
                       {"shard", ckpt.shard_names[idx.shard_of[i]]},
                       {"offset", t.offset},
                       {"bytes", t.length}});
  }
  out["tensors"] = std::move(tensors);
  out["totals"] = {{"tensors", tot.tensors}, {"parameters", tot.parameters}, {"bytes", tot.bytes}};
  if (d.kind == "checkpoint") {
    out["config_json"] = !ckpt.config_json.empty();
    out["extra_files"] = ckpt.extra_files;
  } else {
    out["metadata"] = d.metadata;
  }
  return dump_one_item_per_line(out);
}

// Display width of UTF-8 text (code points; no wide-character handling).
std::size_t text_width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

// Left-aligned text columns; the numeric columns are right-aligned.
std::string render_table(const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& right_align) {
  std::vector<std::size_t> width(right_align.size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], text_width(row[c]));
  std::string out;
  for (const auto& row : rows) {
    out += "  ";
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - text_width(row[c]), ' ');
      const bool last = c + 1 == row.size();
      if (right_align[c])
        out += pad + row[c];
      else
        out += last ? row[c] : row[c] + pad;
      if (!last) out += "  ";
    }
    out += "\n";
  }
  return out;
}

std::string render_text(const Described& d) {
  const Checkpoint& ckpt = d.ckpt;
  const ShardIndex idx = index_shards(ckpt);
  const Totals tot = totals_of(ckpt);
  std::string out;
  if (d.kind == "checkpoint") {
    out += "checkpoint " + d.path + " (" + std::to_string(ckpt.shard_names.size()) +
           (ckpt.shard_names.size() == 1 ? " file" : " shards") + ")\n";
    out += "config.json: " + std::string(ckpt.config_json.empty() ? "absent" : "present") + "\n";
    out += "carried files:";
    if (ckpt.extra_files.empty()) out += " none";
    for (const std::string& f : ckpt.extra_files) out += " " + f;
    out += "\n";
  } else {
    out += "safetensors file " + d.path + "\n";
    out += "metadata:";
    for (const auto& [k, v] : d.metadata) out += " " + k + "=" + v;
    out += "\n";
  }

  std::vector<std::vector<std::string>> shard_rows = {{"FILE", "BYTES", "TENSORS"}};
  for (std::size_t i = 0; i < ckpt.shard_names.size(); ++i) {
    shard_rows.push_back(
        {ckpt.shard_names[i], std::to_string(ckpt.files[i].size), std::to_string(idx.count[i])});
  }
  out += "\nshards:\n" + render_table(shard_rows, {false, true, true});

  std::vector<std::vector<std::string>> rows = {
      {"NAME", "DTYPE", "SHAPE", "SHARD", "OFFSET", "BYTES"}};
  for (std::size_t i = 0; i < ckpt.tensors.size(); ++i) {
    const StoredTensor& t = ckpt.tensors[i];
    rows.push_back({t.info.name, std::string(dtype_name(t.info.dtype)), format_shape(t.info.shape),
                    ckpt.shard_names[idx.shard_of[i]], std::to_string(t.offset),
                    std::to_string(t.length)});
  }
  out += "\ntensors:\n" + render_table(rows, {false, false, false, false, true, true});
  out += "\ntotal: " + std::to_string(tot.tensors) + " tensors, " + std::to_string(tot.parameters) +
         " parameters, " + std::to_string(tot.bytes) + " bytes\n";
  return out;
}

}  // namespace

int cmd_inspect(CommandContext& ctx) {
  po::options_description options("inspect options");
  options.add_options()(
      "path", po::value<std::string>(),
      "checkpoint folder, .safetensors file, catalog folder, plan JSON or manifest")(
      "json", po::bool_switch(), "print a machine-readable JSON description");
  po::positional_options_description positional;
  positional.add("path", 1);
  const auto vm = parse_command_line("inspect", "PATH [--json]", options, positional, ctx.args,
                                     ctx.comm.is_root());
  if (!vm) return 0;
  if (!vm->count("path"))
    throw UsageError("inspect: missing PATH (see 'mergepipe inspect --help')");
  const std::string path = (*vm)["path"].as<std::string>();
  const bool as_json = (*vm)["json"].as<bool>();

  // Rank 0 does the work; the collective check makes every rank fail together.
  std::string report;
  std::optional<Error> failure;
  if (ctx.comm.is_root()) {
    failure = mpi::capture_failure([&] {
      Described d;
      switch (classify(path)) {
        case PathKind::kCheckpointFolder:
          d = describe_folder(path);
          break;
        case PathKind::kSafetensorsFile:
          d = describe_file(path);
          break;
        case PathKind::kCatalog:
          report = io::describe_catalog(io::load_catalog(path));
          return;
        case PathKind::kPlan:
          report = as_json ? io::read_text_file(path) : describe_plan_json(path);
          return;
        case PathKind::kManifest:
          report = as_json ? io::read_text_file(path) : describe_manifest(path);
          return;
        case PathKind::kUnknown:
          throw UsageError("inspect: " + path + ": not a checkpoint, catalog, plan or manifest");
      }
      report = as_json ? render_json(d) : render_text(d);
    });
  }
  ctx.comm.check(failure, "inspect");
  if (ctx.comm.is_root()) {
    std::fwrite(report.data(), 1, report.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace mergepipe::app
