#include "mergepipe/io/output_io.hpp"

namespace mergepipe::io {

std::string_view output_io_name(OutputIo io) {
  switch (io) {
    case OutputIo::kBuffered:
      return "buffered";
    case OutputIo::kDirect:
      return "direct";
  }
  return "?";
}

}  // namespace mergepipe::io
