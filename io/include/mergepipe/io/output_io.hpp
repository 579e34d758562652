#pragma once
// How the output shards are written: through the page cache, or their whole pages around it.
#include <string_view>

namespace mergepipe::io {

enum class OutputIo {
  kBuffered,  // every byte through the page cache
  kDirect,    // whole 4 KiB pages with O_DIRECT, the partial pages at a range's ends buffered
};

// "buffered", "direct": the --output-io spelling, also recorded in the manifest.
std::string_view output_io_name(OutputIo io);

}  // namespace mergepipe::io
