#pragma once
// A merge's catalog, loaded on rank 0 while the other ranks check the input files against it.
// Before, rank 0 did both while the others waited for the plan: the freshness check (a stat and
// a header hash per file, 42 files for K = 20) was 22 ms of a cold K = 20 TIES merge's 80 ms
// catalog phase.
#include <functional>
#include <string>

#include "mergepipe/catalog.hpp"
#include "mergepipe/io/catalog_store.hpp"
#include "mergepipe/mpi/comm.hpp"

namespace mergepipe::mpi {

struct CatalogRequest {
  std::string path;
  io::ExpertSelection only;  // the merge's expert folders (io::load_catalog)
  io::SketchLoad sketches = io::SketchLoad::none();
  // --verify-reads all: every block of every file is read and compared with its content hash,
  // not only those of files whose inode changed.
  bool check_every_block = false;
};

// Collective; `request` is rank 0's (broadcast). Rank 0 reads catalog.h5 into its page cache,
// calls `root_before_load`, and loads the catalog (io::load_catalog); ranks 1..n-1 each check a
// share of the base's and the selected experts' files (io::check_catalog_fresh, headers read
// together first); on one rank, rank 0 does both. Any rank's failure (a damaged catalog, a stale
// file: their messages and exit codes) ends every rank with CollectiveError.
//
// Returns the catalog on rank 0, an empty one elsewhere.
Catalog load_checked_catalog(const Comm& comm, const CatalogRequest& request,
                             const std::function<void()>& root_before_load = {});

}  // namespace mergepipe::mpi
