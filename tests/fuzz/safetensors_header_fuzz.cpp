// libFuzzer target: the input is the start of a .safetensors file (8-byte length, header, data)
// and the file is as long as the input. Every input must either parse or throw mergepipe::Error;
// anything else (a crash, another exception, a leak, UB) is a finding. An accepted header must
// also survive a round trip: the writer lays out the same tensors and the parser reads them back.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "mergepipe/error.hpp"
#include "mergepipe/io/safetensors.hpp"

namespace {

bool same_tensors(std::vector<mergepipe::TensorInfo> a, std::vector<mergepipe::TensorInfo> b) {
  const auto by_name = [](const auto& x, const auto& y) { return x.name < y.name; };
  std::sort(a.begin(), a.end(), by_name);
  std::sort(b.begin(), b.end(), by_name);
  return a == b;
}

std::vector<mergepipe::TensorInfo> infos_of(const mergepipe::io::SafetensorsHeader& header) {
  std::vector<mergepipe::TensorInfo> infos;
  for (const auto& t : header.tensors) infos.push_back(t.info);
  return infos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  mergepipe::io::SafetensorsHeader header;
  try {
    header = mergepipe::io::parse_safetensors_header(bytes, size, "fuzz.safetensors");
  } catch (const mergepipe::Error&) {
    return 0;  // rejected cleanly
  }
  const auto infos = infos_of(header);
  const mergepipe::io::SafetensorsLayout layout = mergepipe::io::layout_safetensors(infos);
  // The data section is not needed by the parser beyond its length.
  std::string file = layout.header_bytes;
  file.resize(layout.file_size);
  const auto reread = mergepipe::io::parse_safetensors_header(
      std::as_bytes(std::span(file.data(), file.size())), file.size(), "roundtrip.safetensors");
  if (!same_tensors(infos, infos_of(reread))) __builtin_trap();
  return 0;
}
