// libFuzzer target: the input is the text of a `model.safetensors.index.json`. The pure reader
// (parse_index_weight_map) must accept it or throw mergepipe::Error. An accepted index is then
// written into a small fixed folder, and open_checkpoint checks it against the file system: two
// valid shards (a.safetensors: x, y; b.safetensors: z), a symlink leaving the folder
// (escape.safetensors), a subfolder (sub) and a file that is not safetensors (notes.txt).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_folder.hpp"
#include "mergepipe/io/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

class FixtureFolder {
 public:
  // Under $MERGEPIPE_FUZZ_SCRATCH when set (scripts/fuzz.sh: libFuzzer ends a timed run with
  // _Exit, so no destructor removes the folder), else a fresh folder in /tmp.
  FixtureFolder() {
    if (const char* scratch = std::getenv("MERGEPIPE_FUZZ_SCRATCH")) {
      root_ = std::string(scratch) + "/index-json-" + std::to_string(::getpid());
      fs::remove_all(root_);
      fs::create_directories(root_);
    } else {
      char pattern[] = "/tmp/mergepipe-index-fuzz-XXXXXX";
      if (!::mkdtemp(pattern)) std::abort();
      root_ = pattern;
    }
    dir_ = root_ + "/model";
    fs::create_directories(dir_ + "/sub");
    const std::byte zeros[16] = {};
    using mergepipe::DType;
    mergepipe::io::write_safetensors(dir_ + "/a.safetensors",
                                     {{"x", DType::kF32, {2}}, {"y", DType::kBF16, {2, 2}}},
                                     {std::span(zeros, 8), std::span(zeros, 8)});
    mergepipe::io::write_safetensors(dir_ + "/b.safetensors", {{"z", DType::kF16, {3}}},
                                     {std::span(zeros, 6)});
    mergepipe::io::write_text_file(root_ + "/outside.safetensors", "not inside the folder");
    fs::create_symlink("../outside.safetensors", dir_ + "/escape.safetensors");
    mergepipe::io::write_text_file(dir_ + "/notes.txt", "not a checkpoint");
  }
  ~FixtureFolder() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string root_, dir_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const FixtureFolder folder;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string index_path = folder.dir() + "/model.safetensors.index.json";
  try {
    (void)mergepipe::io::parse_index_weight_map(text, index_path);
  } catch (const mergepipe::Error&) {
    return 0;  // rejected cleanly without touching the folder
  }
  mergepipe::io::write_text_file(index_path, std::string(text));
  try {
    const mergepipe::Checkpoint ckpt = mergepipe::io::open_checkpoint(folder.dir());
    // Accepted: every tensor it lists is one of the fixture's, in the shard the index names.
    for (const auto& t : ckpt.tensors) {
      const std::string shard = fs::path(t.file).filename().string();
      const bool known = (shard == "a.safetensors" && (t.info.name == "x" || t.info.name == "y")) ||
                         (shard == "b.safetensors" && t.info.name == "z");
      if (!known) __builtin_trap();
    }
  } catch (const mergepipe::Error&) {
  }
  return 0;
}
