#include "mergepipe/catalog.hpp"

#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "mergepipe/hash.hpp"

namespace mergepipe {

std::size_t trim_grid_step(double density) {
  const double scaled = std::round(density * static_cast<double>(kTrimGridSteps));
  if (!(scaled >= 1.0 && scaled <= static_cast<double>(kTrimGridSteps))) return 0;
  const auto step = static_cast<std::size_t>(scaled);
  return static_cast<double>(step) / static_cast<double>(kTrimGridSteps) == density ? step : 0;
}

bool ExpertCatalog::has_trim_thresholds(double density, std::size_t tensors) const {
  if (sketches.size() == tensors) return true;
  for (const DensityThresholds& d : thresholds)
    if (d.density == density && d.by_tensor.size() == tensors) return true;
  return false;
}

float ExpertCatalog::trim_threshold(std::size_t tensor, double density) const {
  for (const DensityThresholds& d : thresholds)
    if (d.density == density && tensor < d.by_tensor.size()) return d.by_tensor[tensor];
  if (tensor < sketches.size()) return sketches[tensor].threshold(density);
  throw std::out_of_range("catalog: no magnitude sketch or threshold of tensor " +
                          std::to_string(tensor) + " at density " + std::to_string(density));
}

TrimBand ExpertCatalog::trim_band(std::size_t tensor, double density, double gamma) const {
  if (tensor < sketches.size()) return sketches[tensor].band(density, gamma);
  throw std::out_of_range("catalog: no magnitude sketch of tensor " + std::to_string(tensor));
}

std::uint64_t Catalog::full_expert_bytes() const {
  std::uint64_t per_expert = 0;
  for (const Block& b : blocking.blocks) per_expert += b.byte_length;
  return per_expert * experts.size();
}

std::string normalize_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(dir), ec);
  if (ec) {
    ec.clear();
    p = fs::absolute(fs::path(dir), ec);
    if (ec) p = fs::path(dir);
    p = p.lexically_normal();
  }
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

int Catalog::find_expert(const std::string& dir) const {
  return find_experts({dir}).front();
}

std::vector<int> Catalog::find_experts(const std::vector<std::string>& dirs) const {
  std::unordered_map<std::string, int> index;  // the first of equal folders wins
  for (std::size_t k = 0; k < experts.size(); ++k)
    index.emplace(normalize_checkpoint_dir(experts[k].location.dir), static_cast<int>(k));
  std::vector<int> found;
  found.reserve(dirs.size());
  for (const std::string& dir : dirs) {
    const auto it = index.find(normalize_checkpoint_dir(dir));
    found.push_back(it == index.end() ? -1 : it->second);
  }
  return found;
}

std::uint64_t Catalog::family_bytes() const {
  std::uint64_t total = 0;
  for (const FileIdentity& f : base.files) total += f.size;
  for (const ExpertCatalog& e : experts)
    for (const FileIdentity& f : e.location.files) total += f.size;
  return total;
}

std::string compute_family_id(const std::vector<TensorInfo>& tensors,
                              const std::vector<FileIdentity>& base_files) {
  // Content only (no paths, sizes or times): a copied base keeps its family id.
  Hasher128 h;
  const auto put_u64 = [&h](std::uint64_t v) {
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(v >> (8 * i));
    h.update(le, sizeof le);
  };
  const auto put_str = [&](const std::string& s) {
    put_u64(s.size());
    h.update(s.data(), s.size());
  };
  put_str("mergepipe-family-1");
  put_u64(tensors.size());
  for (const TensorInfo& t : tensors) {
    put_str(t.name);
    put_str(std::string(dtype_name(t.dtype)));
    put_u64(t.shape.size());
    for (std::uint64_t d : t.shape) put_u64(d);
  }
  put_u64(base_files.size());
  for (const FileIdentity& f : base_files) put_str(f.header_hash);
  return h.hex();
}

}  // namespace mergepipe
