#pragma once
// Reads into the page cache, all at once, the small files a budgeted merge reads one after the
// other before it can plan: catalog.h5 and the safetensors headers the freshness check hashes.
// Rank 0 does this before its base read-ahead starts: a cold catalog load reads catalog.h5 in
// about a hundred small requests, each queued behind megabytes of read-ahead (measured: 0.6-0.8 s
// instead of the 0.3 s it takes from the page cache); issued together on an idle disk the same
// bytes take about 20 ms.
#include <string>

#include "mergepipe/io/catalog_store.hpp"

namespace mergepipe::io {

// What to read: catalog.h5 (for load_catalog), the safetensors headers of a share of the files
// (for check_catalog_fresh with the same share), or both.
struct CatalogPrefetch {
  bool catalog_file = true;
  bool headers = true;
  FileShare header_share;
};

// Best effort: a missing or unreadable file is skipped (the catalog load that follows reports it
// with its context). Files of experts outside `only` are left alone. Returns the bytes read.
std::uint64_t prefetch_catalog_inputs(const std::string& catalog_path,
                                      const ExpertSelection& only = std::nullopt,
                                      const CatalogPrefetch& what = {});

}  // namespace mergepipe::io
