#include "mergepipe/mpi/catalog_load.hpp"

#include <cstdint>
#include <vector>

#include "mergepipe/io/catalog_prefetch.hpp"
#include "mergepipe/mpi/packing.hpp"

namespace mergepipe::mpi {

namespace {

void put_string(Packer& p, const std::string& s) {
  p.put_vector(std::vector<char>(s.begin(), s.end()));
}

std::string get_string(Unpacker& u) {
  const auto chars = u.get_vector<char>();
  return {chars.begin(), chars.end()};
}

std::string pack_request(const CatalogRequest& r) {
  Packer p;
  put_string(p, r.path);
  p.put<std::uint8_t>(r.only.has_value());
  if (r.only) {
    p.put<std::uint64_t>(r.only->size());
    for (const std::string& dir : *r.only) put_string(p, dir);
  }
  p.put(r.sketches.kind);
  p.put_vector(r.sketches.densities);
  p.put<std::uint8_t>(r.check_every_block);
  return p.out;
}

CatalogRequest unpack_request(const std::string& bytes) {
  Unpacker u(bytes, "catalog request");
  CatalogRequest r;
  r.path = get_string(u);
  if (u.get<std::uint8_t>() != 0) {
    r.only.emplace(u.get<std::uint64_t>());
    for (std::string& dir : *r.only) dir = get_string(u);
  }
  r.sketches.kind = u.get<io::SketchLoad::Kind>();
  r.sketches.densities = u.get_vector<double>();
  r.check_every_block = u.get<std::uint8_t>() != 0;
  return r;
}

}  // namespace

Catalog load_checked_catalog(const Comm& comm, const CatalogRequest& request,
                             const std::function<void()>& root_before_load) {
  std::string bytes = comm.is_root() ? pack_request(request) : std::string();
  comm.broadcast(bytes, 0, "broadcast catalog request");
  Catalog catalog;
  auto failure = capture_failure([&] {
    const CatalogRequest r = comm.is_root() ? request : unpack_request(bytes);
    const bool alone = comm.size() == 1;
    // The checking ranks' shares of the files: rank i checks share i - 1 of size - 1.
    const io::FileShare share =
        alone ? io::FileShare{}
              : io::FileShare{static_cast<std::size_t>(comm.rank() > 0 ? comm.rank() - 1 : 0),
                              static_cast<std::size_t>(comm.size() - 1)};
    const bool check = alone || !comm.is_root();
    io::prefetch_catalog_inputs(r.path, r.only, {comm.is_root(), check, share});
    if (comm.is_root()) {
      if (root_before_load) root_before_load();
      catalog = io::load_catalog(r.path, r.only, r.sketches);
      if (alone) io::check_catalog_fresh(catalog, r.only, {}, r.path, r.check_every_block);
      return;
    }
    // The file identities come from catalog.json alone.
    io::check_catalog_fresh(io::load_catalog_summary(r.path), r.only, share, r.path,
                            r.check_every_block);
  });
  comm.check(failure, "load catalog");
  return catalog;
}

}  // namespace mergepipe::mpi
