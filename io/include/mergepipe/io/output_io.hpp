#pragma once
// How the output shards are written: through the page cache, or their whole pages around it.
#include <string_view>

namespace mergepipe::io {

enum class OutputIo {
  kBuffered,  // every byte through the page cache
  kDirect,    // whole 4 KiB pages with O_DIRECT, the partial pages at a range's ends buffered
  kAuto,      // kDirect unless the merge streams whole input files through the page cache
};

// "buffered", "direct", "auto": the --output-io spelling, also recorded in the manifest.
std::string_view output_io_name(OutputIo io);

// What kAuto becomes. A merge that streams whole input files through the page cache (a linear
// or DARE --full-read) keeps the device's queue full of read-ahead, behind which a direct write
// waits (mq-deadline serves reads first) and stalls the merge on its few write buffers; the page
// cache absorbs the same writes without a wait. Measured on the benchmark disk, K = 20, cold:
// linear --full-read direct / buffered 1.17 (2 reps; the merge waited 8-13 s on its writer),
// TIES 10% 0.86 (8), TIES --full-read with its windows held (O_DIRECT reads) 0.79 and 0.91 (3+3).
OutputIo resolve_output_io(OutputIo requested, bool streams_inputs_through_cache);

}  // namespace mergepipe::io
