#include "mergepipe/io/synth_family.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "mergepipe/error.hpp"
#include "mergepipe/io/file.hpp"
#include "mergepipe/io/hf_writer.hpp"

namespace mergepipe::io {

namespace {

struct WorkUnit {
  std::size_t tensor;
  std::uint64_t row_begin, row_end;
};

std::vector<WorkUnit> split_work(const synth::FamilyGenerator& family,
                                 std::uint64_t chunk_elements) {
  std::vector<WorkUnit> units;
  for (std::size_t t = 0; t < family.tensors().size(); ++t) {
    const std::uint64_t rows = family.rows(t), cols = family.cols(t);
    if (rows == 0 || cols == 0) continue;  // zero-size tensor: the header says it all
    const std::uint64_t step = std::max<std::uint64_t>(1, chunk_elements / cols);
    for (std::uint64_t r = 0; r < rows; r += step)
      units.push_back({t, r, std::min(rows, r + step)});
  }
  return units;
}

}  // namespace

SynthWriteResult write_synth_family(const synth::FamilyGenerator& family, const std::string& dir,
                                    const SynthWriteOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const synth::ModelPreset& preset = family.options().preset;
  const DType dtype = family.options().dtype;
  const std::size_t experts = family.experts().size();
  const std::size_t tensor_count = family.tensors().size();
  const std::vector<TensorInfo> infos = family.tensor_infos();

  // models[0] is the base, models[1 + e] expert e.
  std::vector<std::unique_ptr<HfFolderWriter>> models;
  models.push_back(std::make_unique<HfFolderWriter>(dir + "/base", infos, options.max_shard_bytes));
  for (std::size_t e = 0; e < experts; ++e) {
    const std::string name = synth::expert_dir_name(static_cast<int>(e), static_cast<int>(experts));
    models.push_back(
        std::make_unique<HfFolderWriter>(dir + "/" + name, infos, options.max_shard_bytes));
  }

  const std::vector<WorkUnit> units =
      split_work(family, std::max<std::uint64_t>(1, options.chunk_elements));
  const int threads = static_cast<int>(
      std::clamp<std::size_t>(static_cast<std::size_t>(std::max(1, options.threads)), 1,
                              std::max<std::size_t>(1, units.size())));
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  // Per thread [expert][tensor] counts, summed afterwards (the sum does not depend on the split).
  std::vector<std::vector<std::vector<std::uint64_t>>> counts(
      static_cast<std::size_t>(threads), std::vector<std::vector<std::uint64_t>>(
                                             experts, std::vector<std::uint64_t>(tensor_count, 0)));

  auto worker = [&](int w) {
    try {
      synth::GeneratorScratch scratch;
      std::vector<std::byte> base;
      std::vector<std::vector<std::byte>> expert_bytes(experts);
      std::vector<std::span<std::byte>> outs(experts);
      auto& my_counts = counts[static_cast<std::size_t>(w)];
      while (!failed.load(std::memory_order_relaxed)) {
        const std::size_t i = next.fetch_add(1);
        if (i >= units.size()) break;
        const WorkUnit& u = units[i];
        const std::uint64_t cols = family.cols(u.tensor);
        const std::size_t nbytes =
            static_cast<std::size_t>((u.row_end - u.row_begin) * cols * dtype_size(dtype));
        base.resize(nbytes);
        for (std::size_t e = 0; e < experts; ++e) {
          if (family.experts()[e].touches[u.tensor]) {
            expert_bytes[e].resize(nbytes);
            outs[e] = expert_bytes[e];
          } else {
            outs[e] = {};
          }
        }
        family.generate_rows(u.tensor, u.row_begin, u.row_end, base, outs, scratch);
        const std::uint64_t offset = u.row_begin * cols * dtype_size(dtype);
        models[0]->write_tensor(u.tensor, offset, base);
        for (std::size_t e = 0; e < experts; ++e) {
          if (outs[e].empty()) {
            models[1 + e]->write_tensor(u.tensor, offset, base);  // untouched: the base's bytes
          } else {
            models[1 + e]->write_tensor(u.tensor, offset, outs[e]);
            my_counts[e][u.tensor] += synth::count_changed_elements(dtype, base, outs[e]);
          }
        }
      }
    } catch (...) {
      failed = true;
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int w = 1; w < threads; ++w) pool.emplace_back(worker, w);
    worker(0);
  }
  if (error) std::rethrow_exception(error);

  SynthWriteResult result;
  result.changed_elements.assign(experts, std::vector<std::uint64_t>(tensor_count, 0));
  for (const auto& per_thread : counts)
    for (std::size_t e = 0; e < experts; ++e)
      for (std::size_t t = 0; t < tensor_count; ++t)
        result.changed_elements[e][t] += per_thread[e][t];

  const std::string config = synth::make_config_json(preset, dtype);
  const std::string tokenizer = synth::make_tokenizer_config_json(preset);
  const std::string generation = synth::make_generation_config_json(preset);
  for (auto& m : models) {
    m->write_small_file("config.json", config);
    m->write_small_file("generation_config.json", generation);
    m->write_small_file("tokenizer_config.json", tokenizer);
    m->finish();
    result.files += m->file_count();
    result.bytes += m->bytes_written();
  }
  const std::string family_json = synth::make_family_json(family, result.changed_elements);
  write_text_file(dir + "/family.json", family_json);
  result.files += 1;
  result.bytes += family_json.size();
  sync_directory(dir);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace mergepipe::io
