#include "mergepipe/io/hf_folder.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint_test_util.hpp"
#include "mergepipe/error.hpp"
#include "mergepipe/io/safetensors.hpp"

using namespace mergepipe;
using namespace mergepipe::io;
using mergepipe::test::error_message;
using mergepipe::test::TempDir;
namespace fs = std::filesystem;

namespace {

// Writes a safetensors file whose tensor i is filled with byte value i+1.
void write_shard(const std::string& path, const std::vector<TensorInfo>& tensors) {
  std::vector<std::vector<std::byte>> bytes;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    bytes.emplace_back(tensors[i].nbytes(), static_cast<std::byte>(i + 1));
  write_safetensors(path, tensors,
                    std::vector<std::span<const std::byte>>(bytes.begin(), bytes.end()));
}

const std::vector<TensorInfo> kShard1 = {
    {"model.embed_tokens.weight", DType::kBF16, {16, 8}},
    {"model.layers.0.mlp.up_proj.weight", DType::kBF16, {4, 8}}};
const std::vector<TensorInfo> kShard2 = {{"model.norm.weight", DType::kF32, {8}},
                                         {"lm_head.weight", DType::kBF16, {16, 8}}};

// A two-shard folder as transformers writes it.
void write_sharded(const std::string& dir) {
  const std::vector<std::string> names = {shard_file_name(1, 2), shard_file_name(2, 2)};
  write_shard(dir + "/" + names[0], kShard1);
  write_shard(dir + "/" + names[1], kShard2);
  test::write_file(dir + "/model.safetensors.index.json",
                   make_index_json(names, {kShard1, kShard2}));
}

// Replaces the index with one built from `weight_map`.
void write_index(const std::string& dir, const nlohmann::json& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 1}}}, {"weight_map", weight_map}};
  test::write_file(dir + "/model.safetensors.index.json", index.dump());
}

nlohmann::json good_weight_map() {
  nlohmann::json wm;
  for (const auto& t : kShard1) wm[t.name] = shard_file_name(1, 2);
  for (const auto& t : kShard2) wm[t.name] = shard_file_name(2, 2);
  return wm;
}

std::string open_error(const std::string& dir) {
  return error_message<InputError>([&] { open_checkpoint(dir); });
}

}  // namespace

TEST(HfFolder, SingleFileFolder) {
  TempDir dir;
  write_shard(dir.file("model.safetensors"), kShard1);
  const std::string config = "{\"model_type\": \"llama\"}\n";
  test::write_file(dir.file("config.json"), config);
  for (const char* name : {"tokenizer.json", "generation_config.json", "README.md", "notes.txt",
                           "special_tokens_map.json", "mergepipe.manifest.json"})
    test::write_file(dir.file(name), "{}");

  const Checkpoint c = open_checkpoint(dir.path());
  EXPECT_EQ(c.dir, dir.path());
  EXPECT_EQ(c.shard_names, std::vector<std::string>{"model.safetensors"});
  ASSERT_EQ(c.files.size(), 1u);
  const SafetensorsHeader h = read_safetensors_header(dir.file("model.safetensors"));
  EXPECT_EQ(c.files[0].path, dir.file("model.safetensors"));
  EXPECT_EQ(c.files[0].size, fs::file_size(dir.file("model.safetensors")));
  EXPECT_EQ(c.files[0].header_hash, h.header_hash);
  EXPECT_GT(c.files[0].mtime_ns, 0);
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_LT(c.tensors[0].offset, c.tensors[1].offset);
  EXPECT_EQ(c.tensors[0].file, dir.file("model.safetensors"));
  EXPECT_EQ(c.find("model.layers.0.mlp.up_proj.weight"), std::optional<std::size_t>(1));
  EXPECT_FALSE(c.find("lm_head.weight"));
  EXPECT_EQ(c.config_json, config);
  const std::vector<std::string> extra = {"generation_config.json", "special_tokens_map.json",
                                          "tokenizer.json"};
  EXPECT_EQ(c.extra_files, extra);
  EXPECT_EQ(c.total_bytes(), (16 * 8 + 4 * 8) * 2u);
}

TEST(HfFolder, ShardedFolderInShardThenOffsetOrder) {
  TempDir dir;
  write_sharded(dir.path());
  const Checkpoint c = open_checkpoint(dir.path());
  EXPECT_EQ(c.shard_names, (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                     "model-00002-of-00002.safetensors"}));
  ASSERT_EQ(c.tensors.size(), 4u);
  // Shard 1 then shard 2; inside a shard, by offset (the writer's order: F32 before BF16).
  EXPECT_EQ(c.tensors[0].info.name, "model.embed_tokens.weight");
  EXPECT_EQ(c.tensors[1].info.name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(c.tensors[2].info.name, "model.norm.weight");
  EXPECT_EQ(c.tensors[3].info.name, "lm_head.weight");
  EXPECT_EQ(c.tensors[3].file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_LT(c.tensors[2].offset, c.tensors[3].offset);
  for (std::size_t i = 0; i < c.tensors.size(); ++i)
    EXPECT_EQ(c.by_name.at(c.tensors[i].info.name), i);
  EXPECT_EQ(c.files[1].path, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_TRUE(c.config_json.empty());
  EXPECT_TRUE(c.extra_files.empty());
}

TEST(HfFolder, RejectsIndexEntriesLeavingTheFolder) {
  TempDir dir;
  write_sharded(dir.path());
  const std::string index = dir.file("model.safetensors.index.json");
  struct Case {
    std::string file, problem;
  } cases[] = {{"../model-00001-of-00002.safetensors", "refers outside the folder ('..')"},
               {"..", "refers outside the folder ('..')"},
               {"..model.safetensors", "refers outside the folder"},
               {"/etc/passwd", "is an absolute path"},
               {"sub/model.safetensors", "contains a path separator"},
               {"sub\\model.safetensors", "contains a path separator"},
               {"", "is an empty file name"}};
  for (const Case& c : cases) {
    nlohmann::json wm = good_weight_map();
    wm["lm_head.weight"] = c.file;
    write_index(dir.path(), wm);
    const std::string msg = open_error(dir.path());
    EXPECT_NE(msg.find(index), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'lm_head.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.problem), std::string::npos) << c.file << ": " << msg;
  }
}

TEST(HfFolder, RejectsSymlinkEscapingTheFolder) {
  TempDir root;
  fs::create_directories(root.file("ckpt"));
  const std::string dir = root.file("ckpt");
  write_sharded(dir);
  // Shard 2 becomes a symlink to an identical file outside the folder.
  fs::rename(dir + "/model-00002-of-00002.safetensors", root.file("outside.safetensors"));
  fs::create_symlink("../outside.safetensors", dir + "/model-00002-of-00002.safetensors");
  const std::string msg = open_error(dir);
  EXPECT_NE(msg.find("model-00002-of-00002.safetensors' is a symlink to"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("outside the folder"), std::string::npos) << msg;

  // The same link into the folder itself is fine.
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  fs::rename(root.file("outside.safetensors"), dir + "/real-shard-2.bin");
  fs::create_symlink("real-shard-2.bin", dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(open_checkpoint(dir).tensors.size(), 4u);

  // A dangling link is an error too.
  fs::remove(dir + "/real-shard-2.bin");
  EXPECT_NE(open_error(dir).find("cannot be resolved"), std::string::npos);
}

TEST(HfFolder, RejectsSingleFileSymlinkEscaping) {
  TempDir root;
  fs::create_directories(root.file("ckpt"));
  write_shard(root.file("elsewhere.safetensors"), kShard1);
  fs::create_symlink(root.file("elsewhere.safetensors"), root.file("ckpt/model.safetensors"));
  EXPECT_NE(open_error(root.file("ckpt")).find("outside the folder"), std::string::npos);
}

TEST(HfFolder, AcceptsHubCacheSnapshotLinks) {
  // huggingface_hub cache: snapshots/REV/model.safetensors -> ../../blobs/HASH.
  TempDir root;
  const std::string repo = root.file("models--org--tiny");
  fs::create_directories(repo + "/blobs");
  fs::create_directories(repo + "/snapshots/abc123");
  write_shard(repo + "/blobs/0123abcd", kShard1);
  fs::create_symlink("../../blobs/0123abcd", repo + "/snapshots/abc123/model.safetensors");
  const Checkpoint c = open_checkpoint(repo + "/snapshots/abc123");
  EXPECT_EQ(c.tensors.size(), 2u);
  EXPECT_EQ(c.tensors[0].file, repo + "/snapshots/abc123/model.safetensors");
}

TEST(HfFolder, RejectsMissingShard) {
  TempDir dir;
  write_sharded(dir.path());
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  const std::string msg = open_error(dir.path());
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model-00002-of-00002.safetensors' does not exist"), std::string::npos)
      << msg;
}

TEST(HfFolder, RejectsTensorNotInTheNamedShard) {
  TempDir dir;
  write_sharded(dir.path());
  nlohmann::json wm = good_weight_map();
  wm["model.embed_tokens.weight"] = shard_file_name(2, 2);
  write_index(dir.path(), wm);
  EXPECT_NE(open_error(dir.path())
                .find("weight_map puts tensor 'model.embed_tokens.weight' in "
                      "model-00002-of-00002.safetensors but it is stored in "
                      "model-00001-of-00002.safetensors"),
            std::string::npos);
}

TEST(HfFolder, RejectsIndexedTensorMissingFromShards) {
  TempDir dir;
  write_sharded(dir.path());
  nlohmann::json wm = good_weight_map();
  wm["ghost.weight"] = shard_file_name(1, 2);
  write_index(dir.path(), wm);
  EXPECT_NE(open_error(dir.path())
                .find("weight_map lists tensor 'ghost.weight' in model-00001-of-00002.safetensors "
                      "but model-00001-of-00002.safetensors does not contain it"),
            std::string::npos);
}

TEST(HfFolder, RejectsShardTensorMissingFromIndex) {
  TempDir dir;
  write_sharded(dir.path());
  nlohmann::json wm = good_weight_map();
  wm.erase("model.norm.weight");
  write_index(dir.path(), wm);
  EXPECT_NE(open_error(dir.path())
                .find("tensor 'model.norm.weight' of "
                      "model-00002-of-00002.safetensors is not listed in weight_map"),
            std::string::npos);
}

TEST(HfFolder, RejectsDuplicateTensorAcrossShards) {
  TempDir dir;
  std::vector<TensorInfo> second = kShard2;
  second.push_back(kShard1[0]);
  write_shard(dir.file(shard_file_name(1, 2)), kShard1);
  write_shard(dir.file(shard_file_name(2, 2)), second);
  write_index(dir.path(), good_weight_map());
  const std::string msg = open_error(dir.path());
  EXPECT_NE(msg.find("tensor 'model.embed_tokens.weight' appears in both"), std::string::npos)
      << msg;
}

TEST(HfFolder, RejectsBadIndexFiles) {
  TempDir dir;
  write_sharded(dir.path());
  const std::string index = dir.file("model.safetensors.index.json");
  test::write_file(index, "{\"weight_map\": ");
  EXPECT_NE(open_error(dir.path()).find(index + ": not valid JSON"), std::string::npos);
  test::write_file(index, "{\"metadata\": {}}");
  EXPECT_NE(open_error(dir.path()).find("no \"weight_map\""), std::string::npos);
  test::write_file(index, "{\"weight_map\": {}}");
  EXPECT_NE(open_error(dir.path()).find("\"weight_map\" is empty"), std::string::npos);
  test::write_file(index, "{\"weight_map\": {\"a\": 3}}");
  EXPECT_NE(open_error(dir.path()).find("weight_map entry for tensor 'a' is not a file name"),
            std::string::npos);
  test::write_file(index,
                   "{\"weight_map\": {\"lm_head.weight\": \"model-00001-of-00002.safetensors\","
                   " \"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
  EXPECT_NE(open_error(dir.path()).find("duplicate key 'lm_head.weight' in 'weight_map'"),
            std::string::npos);
}

TEST(IndexWeightMap, ParsesWithoutTouchingTheFileSystem) {
  const auto map = parse_index_weight_map(
      R"({"metadata": {"total_size": 1}, "weight_map": {"b": "x.safetensors", "a": "y"}})",
      "/nowhere/model.safetensors.index.json");
  EXPECT_EQ(map, (std::map<std::string, std::string>{{"a", "y"}, {"b", "x.safetensors"}}));
  const auto message = [](const std::string& text) {
    return error_message<InputError>([&] { parse_index_weight_map(text, "idx.json"); });
  };
  EXPECT_NE(message(R"({"weight_map": {"t": "../x"}})")
                .find("idx.json: weight_map entry for tensor 't' ('../x') refers outside"),
            std::string::npos);
  EXPECT_NE(message(R"({"weight_map": {"t": "/abs"}})").find("is an absolute path"),
            std::string::npos);
  EXPECT_NE(message(R"({"weight_map": {"t": "a/b"}})").find("contains a path separator"),
            std::string::npos);
  EXPECT_NE(message(R"({"weight_map": {"t": ""}})").find("is an empty file name"),
            std::string::npos);
  EXPECT_NE(message("[1]").find("idx.json: not a JSON object"), std::string::npos);
  // A long non-string value is shown cut short.
  std::string many = "1";
  for (int i = 0; i < 5000; ++i) many += ",1";
  std::string msg = message(R"({"weight_map": {"t": [)" + many + "]}}");
  EXPECT_NE(msg.find("is not a file name: [1,1,1"), std::string::npos) << msg.substr(0, 200);
  EXPECT_LT(msg.size(), 200u);
  // So is a parse error quoting a long token.
  msg = message(R"({"weight_map": {"t": )" + std::string(9999, '1') + "}}");
  EXPECT_NE(msg.find("idx.json: not valid JSON: number overflow"), std::string::npos);
  EXPECT_LT(msg.size(), 300u);
}

TEST(HfFolder, MissingShardNamesTheIndexEntry) {
  TempDir dir;
  write_sharded(dir.path());
  fs::remove(dir.file(shard_file_name(2, 2)));
  const std::string msg = open_error(dir.path());
  EXPECT_NE(msg.find(dir.file("model.safetensors.index.json") +
                     ": weight_map entry for tensor 'lm_head.weight': file '" +
                     shard_file_name(2, 2) + "' does not exist"),
            std::string::npos)
      << msg;
}

TEST(HfFolder, RefusesAHugeIndexBeforeReadingIt) {
  TempDir dir;
  write_sharded(dir.path());
  const std::string index = dir.file("model.safetensors.index.json");
  fs::resize_file(index, kMaxHeaderBytes + 1);  // sparse: nothing is written
  EXPECT_NE(open_error(dir.path()).find(index + ": 100000001 bytes, more than the limit"),
            std::string::npos);
}

TEST(HfFolder, RejectsFoldersThatAreNotCheckpoints) {
  TempDir dir;
  EXPECT_NE(open_error(dir.path()).find("not a Hugging Face checkpoint folder"), std::string::npos);
  write_shard(dir.file("model-00001-of-00002.safetensors"), kShard1);
  EXPECT_NE(open_error(dir.path()).find("missing its index"), std::string::npos);
  EXPECT_NE(open_error(dir.file("nope")).find("no such checkpoint folder"), std::string::npos);
  EXPECT_NE(open_error(dir.file("model-00001-of-00002.safetensors")).find("not a folder"),
            std::string::npos);
}

TEST(HfFolder, ReportsAMalformedShardByName) {
  TempDir dir;
  write_sharded(dir.path());
  const std::string shard = dir.file("model-00002-of-00002.safetensors");
  fs::resize_file(shard, fs::file_size(shard) - 1);
  const std::string msg = open_error(dir.path());
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(HfFolder, CarriedFiles) {
  for (const char* yes : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                          "special_tokens_map.json", "vocab.json", "merges.txt",
                          "generation_config.json", "chat_template.jinja", "added_tokens.json"})
    EXPECT_TRUE(is_carried_file(yes)) << yes;
  for (const char* no : {"config.json", "model.safetensors", "model.safetensors.index.json",
                         "mergepipe.manifest.json", "README.md", "pytorch_model.bin"})
    EXPECT_FALSE(is_carried_file(no)) << no;
}

TEST(HfFolder, ShardFileNames) {
  EXPECT_EQ(shard_file_name(1, 4), "model-00001-of-00004.safetensors");
  EXPECT_EQ(shard_file_name(4, 4), "model-00004-of-00004.safetensors");
  EXPECT_EQ(shard_file_name(12, 123456), "model-00012-of-123456.safetensors");
  EXPECT_THROW(shard_file_name(0, 4), UsageError);
  EXPECT_THROW(shard_file_name(5, 4), UsageError);
}

TEST(AssignShards, ClosesAShardBeforeItWouldOverflow) {
  auto u8 = [](std::uint64_t n) {
    return TensorInfo{std::string("t").append(std::to_string(n)), DType::kU8, {n}};
  };
  using Shards = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(assign_shards({u8(4), u8(4), u8(4)}, 8), (Shards{{0, 1}, {2}}));  // exact fit allowed
  EXPECT_EQ(assign_shards({u8(5), u8(4), u8(3)}, 8), (Shards{{0}, {1, 2}}));
  // A tensor above the maximum sits alone; order is kept.
  EXPECT_EQ(assign_shards({u8(2), u8(20), u8(2)}, 8), (Shards{{0}, {1}, {2}}));
  EXPECT_EQ(assign_shards({u8(20)}, 8), (Shards{{0}}));
  // Zero-size tensors never open a shard of their own.
  EXPECT_EQ(assign_shards({u8(8), u8(0), u8(1)}, 8), (Shards{{0, 1}, {2}}));
  // Sizes are bytes, not elements: 2 BF16 x 3 = 12 bytes.
  EXPECT_EQ(assign_shards({{"a", DType::kBF16, {2, 3}}, {"b", DType::kBF16, {2}}}, 12),
            (Shards{{0}, {1}}));
  EXPECT_TRUE(assign_shards({}, 8).empty());
  EXPECT_THROW(assign_shards({u8(1)}, 0), UsageError);
}

TEST(IndexJson, SortedWeightMapTotalsAndIndentation) {
  const std::string text =
      make_index_json({"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"},
                      {{{"z.weight", DType::kBF16, {2, 3}}, {"a.weight", DType::kF32, {4}}},
                       {{"m.weight", DType::kF16, {5}}}});
  const std::string expected =
      "{\n"
      "  \"metadata\": {\n"
      "    \"total_parameters\": 15,\n"
      "    \"total_size\": 38\n"
      "  },\n"
      "  \"weight_map\": {\n"
      "    \"a.weight\": \"model-00001-of-00002.safetensors\",\n"
      "    \"m.weight\": \"model-00002-of-00002.safetensors\",\n"
      "    \"z.weight\": \"model-00001-of-00002.safetensors\"\n"
      "  }\n"
      "}\n";
  EXPECT_EQ(text, expected);
  EXPECT_THROW(make_index_json({"a", "b"}, {{{"w", DType::kF32, {1}}}, {{"w", DType::kF32, {1}}}}),
               UsageError);
  EXPECT_THROW(make_index_json({"a"}, {}), UsageError);
}

TEST(IndexJson, RoundTripsThroughOpenCheckpoint) {
  TempDir dir;
  write_sharded(dir.path());
  const nlohmann::json index =
      nlohmann::json::parse(test::read_file(dir.file("model.safetensors.index.json")));
  const Checkpoint c = open_checkpoint(dir.path());
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), c.total_bytes());
  EXPECT_EQ(index["weight_map"].size(), c.tensors.size());
}

TEST(ConfigDtype, KeepsOtherKeysAndTheirOrder) {
  const std::string base =
      "{\"architectures\": [\"Qwen3ForCausalLM\"], \"torch_dtype\": \"float32\", "
      "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000, \"tie_word_embeddings\": true, "
      "\"zeta\": {\"b\": 1, \"a\": 2}}";
  const std::string out = rewrite_config_dtype(base, "bfloat16");
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(out);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  const std::vector<std::string> expected = {"architectures", "torch_dtype",         "rms_norm_eps",
                                             "rope_theta",    "tie_word_embeddings", "zeta",
                                             "dtype"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["rms_norm_eps"].get<double>(), 1e-06);
  EXPECT_EQ(j["rope_theta"].get<std::uint64_t>(), 1000000u);
  EXPECT_EQ(j["zeta"].begin().key(), "b");                                    // nested order too
  EXPECT_NE(out.find("\n  \"architectures\": ["), std::string::npos) << out;  // 2-space indent
  EXPECT_NE(out.find("1e-06"), std::string::npos) << out;

  // A config that already has "dtype" keeps it in place.
  const nlohmann::ordered_json j2 = nlohmann::ordered_json::parse(
      rewrite_config_dtype("{\"dtype\": \"float16\", \"x\": 1}", "float32"));
  EXPECT_EQ(j2.begin().key(), "dtype");
  EXPECT_EQ(j2["dtype"], "float32");
  EXPECT_EQ(j2.back(), "float32");  // torch_dtype appended last
}

TEST(ConfigDtype, EmptyConfigGivesAMinimalObjectAndBadConfigIsRejected) {
  const nlohmann::json j = nlohmann::json::parse(rewrite_config_dtype("", "float16"));
  EXPECT_EQ(j, (nlohmann::json{{"torch_dtype", "float16"}, {"dtype", "float16"}}));
  EXPECT_NE(error_message<InputError>([] {
              rewrite_config_dtype("{\"a\":", "float16");
            }).find("config.json: not valid JSON"),
            std::string::npos);
  EXPECT_THROW(rewrite_config_dtype("[1]", "float16"), InputError);
  EXPECT_THROW(rewrite_config_dtype("{}", ""), UsageError);
}
