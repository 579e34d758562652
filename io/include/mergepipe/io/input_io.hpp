#pragma once
// How input checkpoints are read: through the page cache, or around it with O_DIRECT.
#include <string_view>

namespace mergepipe::io {

enum class InputIo {
  kBuffered,  // through the page cache
  kDirect,    // O_DIRECT wherever the file system allows it
  kAuto,      // O_DIRECT for a file unless the page cache already holds most of it
};

// "buffered", "direct", "auto": the --input-io spelling, also recorded in the manifest.
std::string_view input_io_name(InputIo io);

}  // namespace mergepipe::io
