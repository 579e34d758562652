#include "mergepipe/io/output_guard.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/manifest.hpp"
#include "mergepipe/plan.hpp"

namespace mergepipe::io {

namespace fs = std::filesystem;

namespace {

// The longest suffix a writer adds to the target's name beside it (staging.hpp): the name must
// leave room for it.
constexpr const char* kLongestSiblingSuffix = ".mergepipe-staging.replaced";

// True when `inner` is `outer` or lies below it (both resolved).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

std::string describe(const GuardedInput& input) {
  return "the " + input.role + " " + input.path;
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

std::string resolved_path(const std::string& path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(fs::path(path), ec);
  if (ec) throw IoError(path + ": cannot resolve the path: " + ec.message());
  fs::path resolved = fs::weakly_canonical(absolute, ec);
  if (ec) resolved = absolute.lexically_normal();
  std::string text = resolved.string();
  return without_trailing_slashes(text);
}

void check_output_target(const std::string& what, const std::string& target,
                         const std::vector<GuardedInput>& inputs) {
  if (target.empty()) throw UsageError(what + " is empty: give the path to write");
  const std::string given = without_trailing_slashes(target);
  if (is_symlink(given)) {
    std::error_code ec;
    const fs::path to = fs::read_symlink(given, ec);
    throw UsageError(what + " " + given + " is a symbolic link (to " + to.string() +
                     "); give the real path (a link is never written through or replaced)");
  }
  const fs::path resolved(resolved_path(given));
  const std::string name = resolved.filename().string();
  const fs::path parent = resolved.parent_path();
  long name_max = ::pathconf(parent.c_str(), _PC_NAME_MAX);
  if (name_max <= 0) name_max = NAME_MAX;
  const std::size_t room = 1 + std::char_traits<char>::length(kLongestSiblingSuffix);
  if (name.size() + room > static_cast<std::size_t>(name_max)) {
    throw UsageError(what + " " + given + ": the name '" + name.substr(0, 40) + "...' is " +
                     std::to_string(name.size()) + " bytes; at most " +
                     std::to_string(static_cast<std::size_t>(name_max) - room) +
                     " fit beside its staging folder");
  }
  if (resolved.string().size() + room >= PATH_MAX)
    throw UsageError(what + " " + given + ": the path is too long");

  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    const fs::path here(resolved_path(cwd.string()));
    if (is_within(here, resolved)) {
      throw UsageError(
          what + " " + given + " is " +
          (here == resolved ? "the current folder" : "a parent of the current folder") +
          "; writing it would replace what it holds");
    }
  }
  for (const GuardedInput& input : inputs) {
    if (input.path.empty()) continue;
    const fs::path in(resolved_path(input.path));
    if (in == resolved) throw UsageError(what + " " + given + " is " + describe(input));
    if (is_within(resolved, in))
      throw UsageError(what + " " + given + " lies inside " + describe(input));
    if (is_within(in, resolved))
      throw UsageError(what + " " + given + " contains " + describe(input) +
                       "; writing it would replace an input");
  }
}

void check_replaceable_merge_output(const std::string& target, bool force) {
  const std::string t = without_trailing_slashes(target);
  struct stat st {};
  if (::lstat(t.c_str(), &st) != 0) return;
  if (!force) throw UsageError(t + ": output folder already exists (pass --force to replace it)");
  if (!S_ISDIR(st.st_mode)) {
    throw UsageError(t +
                     ": exists and is not a folder; --force replaces only a folder that a "
                     "mergepipe merge wrote");
  }
  std::vector<std::string> entries;
  std::size_t count = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(t, ec)) {
    ++count;
    if (entries.size() < 3) entries.push_back(entry.path().filename().string());
  }
  if (ec) throw IoError(t + ": cannot list the folder: " + ec.message());
  if (count == 0) return;
  const std::string manifest = t + "/" + kManifestFileName;
  std::string why = "it holds no " + std::string(kManifestFileName);
  struct stat mst {};
  if (::lstat(manifest.c_str(), &mst) == 0 && S_ISREG(mst.st_mode)) {
    try {
      const auto json = nlohmann::json::parse(read_text_file(manifest));
      if (json.is_object() && json.value("format", "") == kManifestFormat) return;
      why = "its " + std::string(kManifestFileName) + " is not a mergepipe manifest";
    } catch (const nlohmann::json::exception&) {
      why = "its " + std::string(kManifestFileName) + " is not valid JSON";
    }
  }
  std::string listed;
  for (std::size_t i = 0; i < entries.size(); ++i) listed += (i ? ", " : "") + entries[i];
  if (count > entries.size()) listed += ", ...";
  throw UsageError(t + ": refusing to replace a folder that no mergepipe merge wrote (" + why +
                   "): --force would delete its " + std::to_string(count) + " entr" +
                   (count == 1 ? "y" : "ies") + " (" + listed + ")");
}

void check_replaceable_plan_file(const std::string& target) {
  struct stat st {};
  if (::lstat(target.c_str(), &st) != 0) return;
  if (!S_ISREG(st.st_mode))
    throw UsageError("plan: --out " + target + ": exists and is not a file");
  constexpr off_t kLargestPlan = off_t{1} << 30;
  bool is_plan = false;
  if (st.st_size < kLargestPlan) {
    try {
      const auto json = nlohmann::json::parse(read_text_file(target));
      is_plan = json.is_object() && json.value("format", "") == kPlanFormat;
    } catch (const nlohmann::json::exception&) {
    }
  }
  if (!is_plan) {
    throw UsageError("plan: --out " + target +
                     ": exists and is not a mergepipe plan; refusing to overwrite it");
  }
}

}  // namespace mergepipe::io
