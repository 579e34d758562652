// libFuzzer target: the input is the text of a merge config (YAML). parse_merge_config must
// return a (validated) spec or throw mergepipe::Error; anything else (a crash, a yaml-cpp
// exception escaping, a leak, UB, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mergepipe/error.hpp"
#include "mergepipe/io/merge_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)mergepipe::io::parse_merge_config(text, "fuzz/merge.yaml");
  } catch (const mergepipe::Error&) {
  }
  return 0;
}
