#include "mergepipe/io/model_reference.hpp"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "mergepipe/error.hpp"

namespace mergepipe::io {
namespace {

namespace fs = std::filesystem;

std::string normal(const fs::path& p) {
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  std::string s = (ec ? p : abs).lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// `org/name` or `name`: letters, digits, '-', '_', '.', not starting with '.' (a path).
bool looks_like_hub_id(const std::string& s) {
  if (s.empty() || s[0] == '.' || s[0] == '/' || s[0] == '~') return false;
  int slashes = 0;
  for (char c : s) {
    if (c == '/') {
      ++slashes;
    } else if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return slashes == 1 && s.back() != '/' && s.find("/.") == std::string::npos;
}

std::string read_first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// The snapshot folder of `id` at `revision` (empty: main) in `cache`, or "" when absent.
std::string cached_snapshot(const fs::path& cache, const std::string& id,
                            const std::string& revision) {
  std::string folder = "models--" + id;
  for (std::size_t pos = folder.find('/'); pos != std::string::npos; pos = folder.find('/'))
    folder.replace(pos, 1, "--");
  const fs::path repo = cache / folder;
  if (!is_dir(repo / "snapshots")) return "";
  const std::string rev = revision.empty() ? "main" : revision;
  // A branch or tag name, through refs/.
  if (const fs::path ref = repo / "refs" / rev; fs::exists(ref)) {
    const std::string commit = read_first_line(ref);
    if (!commit.empty() && is_dir(repo / "snapshots" / commit))
      return normal(repo / "snapshots" / commit);
  }
  // A commit, whole or a prefix of at least 7 digits; with no revision given and no refs/main,
  // the only snapshot there is.
  std::vector<fs::path> matches;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(repo / "snapshots", ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (revision.empty() || (revision.size() >= 7 && name.rfind(revision, 0) == 0))
      matches.push_back(entry.path());
  }
  return matches.size() == 1 ? normal(matches.front()) : "";
}

}  // namespace

std::string hugging_face_cache_dir() {
  if (const char* hub = std::getenv("HF_HUB_CACHE"); hub && *hub) return hub;
  if (const char* home = std::getenv("HF_HOME"); home && *home)
    return (fs::path(home) / "hub").string();
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (fs::path(xdg) / "huggingface" / "hub").string();
  const char* user = std::getenv("HOME");
  return (fs::path(user && *user ? user : "/") / ".cache" / "huggingface" / "hub").string();
}

ResolvedModel resolve_model_reference(const std::string& reference,
                                      const std::string& config_folder) {
  const fs::path as_path(reference);
  if (as_path.is_absolute()) return {normal(as_path), std::nullopt};
  if (is_dir(as_path)) return {normal(as_path), std::nullopt};
  if (const std::size_t plus = reference.find('+'); plus != std::string::npos) {
    throw UsageError("model '" + reference +
                     "': applying a LoRA adapter to a model (mergekit's model+adapter) is not "
                     "supported yet; merge the adapter into '" +
                     reference.substr(0, plus) + "' first and list that folder");
  }
  if (!config_folder.empty()) {
    const fs::path beside = fs::path(config_folder) / as_path;
    if (is_dir(beside)) {
      const std::string path = normal(beside);
      return {path, "model '" + reference + "' is not a folder of the current directory; using " +
                        path +
                        " beside the config (mergekit resolves paths against the current "
                        "directory only)"};
    }
  }
  std::string id = reference, revision;
  if (const std::size_t at = reference.find('@'); at != std::string::npos) {
    id = reference.substr(0, at);
    revision = reference.substr(at + 1);
  }
  if (!looks_like_hub_id(id)) return {normal(as_path), std::nullopt};
  const std::string cache = hugging_face_cache_dir();
  const std::string snapshot = cached_snapshot(cache, id, revision);
  if (!snapshot.empty()) return {snapshot, std::nullopt};
  throw UsageError("model '" + reference +
                   "' is neither a folder of the current directory nor in the Hugging Face "
                   "cache (" +
                   cache +
                   "); there is no network access here: download it first (huggingface-cli "
                   "download " +
                   id + (revision.empty() ? "" : " --revision " + revision) +
                   ") or give a local path");
}

}  // namespace mergepipe::io
