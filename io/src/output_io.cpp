#include "mergepipe/io/output_io.hpp"

namespace mergepipe::io {

std::string_view output_io_name(OutputIo io) {
  switch (io) {
    case OutputIo::kBuffered:
      return "buffered";
    case OutputIo::kDirect:
      return "direct";
    case OutputIo::kAuto:
      return "auto";
  }
  return "?";
}

OutputIo resolve_output_io(OutputIo requested, bool streams_inputs_through_cache) {
  if (requested != OutputIo::kAuto) return requested;
  return streams_inputs_through_cache ? OutputIo::kBuffered : OutputIo::kDirect;
}

}  // namespace mergepipe::io
