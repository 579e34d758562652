#include "mergepipe/io/input_io.hpp"

namespace mergepipe::io {

std::string_view input_io_name(InputIo io) {
  switch (io) {
    case InputIo::kBuffered:
      return "buffered";
    case InputIo::kDirect:
      return "direct";
    case InputIo::kAuto:
      return "auto";
  }
  return "?";
}

}  // namespace mergepipe::io
