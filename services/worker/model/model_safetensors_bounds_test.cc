// Malformed safetensors models (the weights, the shard index, tokenizer.json), made from the tiny
// HF model in tests/data/tiny: every one is refused with a Status naming the file and the field,
// and none aborts the process. The GGUF and config.json cases: model_bounds_test.cc.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/malformed_model_test_fixture.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;
using malformed_model_test::ExpectNonFiniteRefused;
using malformed_model_test::ExpectRefused;
using malformed_model_test::kTinyHf;
using malformed_model_test::MalformedModelTest;
using malformed_model_test::ReadBytes;
using malformed_model_test::WriteBytes;
using ::testing::HasSubstr;

TEST_F(MalformedModelTest, SafetensorsLyingOffsetsAndTruncation) {
  const std::string dir = HfWith("config.json", [](nlohmann::json&) {});
  const std::string st = (fs::path(dir) / "model.safetensors").string();
  const std::string bytes = ReadBytes(st);
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  const std::string data = bytes.substr(8 + header_len);
  auto rewrite = [&](const nlohmann::json& h, const std::string& tail) {
    const std::string text = h.dump();
    std::string out(8, '\0');
    const uint64_t n = text.size();
    std::memcpy(out.data(), &n, 8);
    WriteBytes(st, out + text + tail);
  };
  {
    nlohmann::json h = header;
    h["model.norm.weight"]["data_offsets"] = {uint64_t{1} << 40, (uint64_t{1} << 40) + 256};
    rewrite(h, data);
    ExpectRefused(dir, "model.norm.weight", absl::StatusCode::kDataLoss);
  }
  {
    nlohmann::json h = header;
    h["model.norm.weight"]["shape"] = {int64_t{1} << 31, int64_t{1} << 31};
    rewrite(h, data);
    ExpectRefused(dir, "model.norm.weight");
  }
  {
    // An unknown dtype's extent is not tied to its shape: refused before its shape is allocated.
    nlohmann::json h = header;
    h["model.norm.weight"]["dtype"] = "Q9_X";
    rewrite(h, data);
    ExpectRefused(dir, "model.norm.weight", absl::StatusCode::kUnimplemented);
  }
  for (size_t n :
       {size_t{0}, size_t{7}, size_t{8}, size_t{100}, size_t(8 + header_len), bytes.size() - 1}) {
    SCOPED_TRACE(n);
    WriteBytes(st, bytes.substr(0, n));
    auto model = LoadModel(dir);
    ASSERT_FALSE(model.ok());
    EXPECT_TRUE(IsModelFileError(model.status())) << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr("model.safetensors"));
  }
  {
    std::string huge(8, '\0');
    const uint64_t n = uint64_t{1} << 62;
    std::memcpy(huge.data(), &n, 8);
    WriteBytes(st, huge + bytes.substr(8));
    ExpectRefused(dir, "header length", absl::StatusCode::kDataLoss);
  }
}

// The attack's HF case (NaN in model.norm.weight, F32) and BF16 ones.
TEST_F(MalformedModelTest, SafetensorsNonFiniteWeights) {
  struct Case {
    std::string from, tensor;
    int64_t element;
    std::string bytes, value;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t bf16_inf = 0x7F80, bf16_nan = 0xFFC0;
  const Case cases[] = {
      {kTinyHf, "model.norm.weight", 3, std::string(reinterpret_cast<const char*>(&nan), 4), "nan"},
      {"tests/data/tiny/tiny-llama/hf-bf16", "model.layers.0.self_attn.q_proj.weight", 9,
       std::string(reinterpret_cast<const char*>(&bf16_inf), 2), "inf"},
      {"tests/data/tiny/tiny-llama/hf-bf16", "model.embed_tokens.weight", 1234,
       std::string(reinterpret_cast<const char*>(&bf16_nan), 2), "nan"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.from + " " + c.tensor);
    const std::string dir = HfWith(
        "config.json", [](nlohmann::json&) {}, c.from);
    auto tensors = TinyHfTensors(c.from);
    std::string& data = tensors.at(c.tensor).second;
    data.replace(c.element * c.bytes.size(), c.bytes.size(), c.bytes);
    const std::string st = (fs::path(dir) / "model.safetensors").string();
    WriteSafetensors(st, tensors);
    ExpectNonFiniteRefused(dir, c.tensor, c.element, c.value);
    EXPECT_THAT(std::string(LoadModelWeights(dir).status().message()), HasSubstr(st));
  }
}

// With model.safetensors.index.json each tensor comes from the shard the index names: a stale
// shard holding another (NaN) copy of model.norm.weight is never read, whether the index names
// it for nothing (the attack's case) or for other tensors. The weights equal the single file's.
TEST_F(MalformedModelTest, SafetensorsIndexPicksTheNamedShard) {
  const auto tensors = TinyHfTensors();
  auto stale = tensors.at("model.norm.weight");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < stale.second.size(); i += 4) std::memcpy(&stale.second[i], &nan, 4);
  auto want = LoadModelWeights(kTinyHf);
  ASSERT_TRUE(want.ok()) << want.status();

  constexpr char kShard1[] = "model-00001-of-00002.safetensors";
  constexpr char kShard2[] = "model-00002-of-00002.safetensors";
  {
    nlohmann::json index = {{"metadata", nlohmann::json::object()},
                            {"weight_map", nlohmann::json::object()}};
    for (const auto& [name, t] : tensors) index["weight_map"][name] = kShard2;
    const std::string dir =
        ShardedHf({{kShard1, {{"model.norm.weight", stale}}}, {kShard2, tensors}}, index.dump());
    auto got = LoadModel(dir);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->weights->output_norm, (*want)->output_norm);
    EXPECT_EQ(ModelFingerprint(*got->weights), ModelFingerprint(**want));
  }
  {
    // Split in two, the stale copy in the first shard while the index names the second.
    std::map<std::string, std::pair<nlohmann::json, std::string>> first, second;
    nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
    size_t i = 0;
    for (const auto& [name, t] : tensors) {
      const bool in_first = name != "model.norm.weight" && i++ % 2 == 0;
      (in_first ? first : second)[name] = t;
      index["weight_map"][name] = in_first ? kShard1 : kShard2;
    }
    first["model.norm.weight"] = stale;
    ASSERT_FALSE(first.empty());
    const std::string dir = ShardedHf({{kShard1, first}, {kShard2, second}}, index.dump());
    for (bool packed : {false, true}) {
      auto got = LoadModelWeights(dir, {.packed = packed});
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ((*got)->output_norm, (*want)->output_norm);
      EXPECT_EQ(ModelFingerprint(**got), ModelFingerprint(**want));
    }
  }
}

TEST_F(MalformedModelTest, SafetensorsShardsWithoutIndexMustNotOverlap) {
  const auto tensors = TinyHfTensors();
  std::map<std::string, std::pair<nlohmann::json, std::string>> first, second;
  size_t i = 0;
  for (const auto& [name, t] : tensors) (i++ % 2 == 0 ? first : second)[name] = t;
  // Split without overlap and no index: loads as before.
  const std::string ok = ShardedHf({{"a.safetensors", first}, {"b.safetensors", second}}, "");
  auto got = LoadModelWeights(ok);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(ModelFingerprint(**got), ModelFingerprint(**LoadModelWeights(kTinyHf)));
  // One tensor in both: which copy is meant cannot be told.
  second["model.norm.weight"] = tensors.at("model.norm.weight");
  first["model.norm.weight"] = tensors.at("model.norm.weight");
  const std::string dir = ShardedHf({{"a.safetensors", first}, {"b.safetensors", second}}, "");
  ExpectRefused(dir, "tensor model.norm.weight is in both");
  const std::string message(LoadModelWeights(dir).status().message());
  EXPECT_THAT(message, HasSubstr((fs::path(dir) / "a.safetensors").string()));
  EXPECT_THAT(message, HasSubstr((fs::path(dir) / "b.safetensors").string()));
}

// An index that cannot be trusted is refused naming the index file and the key, never read
// around (the attack's cases: a shard at ../../../etc/passwd, an index that is not JSON).
TEST_F(MalformedModelTest, SafetensorsBadIndex) {
  const auto tensors = TinyHfTensors();
  std::map<std::string, std::pair<nlohmann::json, std::string>> first, second;
  size_t i = 0;
  for (const auto& [name, t] : tensors) {
    (name != "model.norm.weight" && i++ % 2 == 0 ? first : second)[name] = t;
  }
  constexpr char kShard1[] = "model-00001-of-00002.safetensors";
  constexpr char kShard2[] = "model-00002-of-00002.safetensors";
  nlohmann::json good = {{"metadata", {{"total_size", 1}}},
                         {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : first) good["weight_map"][name] = kShard1;
  for (const auto& [name, t] : second) good["weight_map"][name] = kShard2;
  const auto shards = std::map<std::string, decltype(first)>{{kShard1, first}, {kShard2, second}};
  ASSERT_TRUE(LoadModel(ShardedHf(shards, good.dump())).ok());

  constexpr char kKey[] = "weight_map[\"model.norm.weight\"]";
  auto with_norm_in = [&](const nlohmann::json& shard) {
    nlohmann::json index = good;
    index["weight_map"]["model.norm.weight"] = shard;
    return index.dump();
  };
  struct Case {
    std::string index, field;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  const Case cases[] = {
      {"garbage", "model.safetensors.index.json: not a JSON object"},
      {"[1, 2]", "model.safetensors.index.json: not a JSON object"},
      {R"({"metadata": {}})", "model.safetensors.index.json: weight_map"},
      {R"({"weight_map": ["model.norm.weight"]})", "model.safetensors.index.json: weight_map"},
      {with_norm_in("../../../etc/passwd"), kKey},
      {with_norm_in("/etc/passwd"), kKey},
      {with_norm_in("sub/model.safetensors"), kKey},
      {with_norm_in(".."), kKey},
      {with_norm_in("."), kKey},
      {with_norm_in(""), kKey},
      {with_norm_in(7), kKey},
      {with_norm_in("model-00003-of-00003.safetensors"), kKey},  // missing
      {with_norm_in(kShard1), kKey},                             // does not hold it
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.index.substr(0, 80));
    const std::string dir = ShardedHf(shards, c.index);
    ExpectRefused(dir, c.field, c.code);
    EXPECT_THAT(std::string(LoadModelWeights(dir).status().message()),
                HasSubstr((fs::path(dir) / "model.safetensors.index.json").string()));
  }
  // A tensor the index lists but no shard holds, which the model does not read (a tied
  // lm_head.weight dropped at save time, another component's weights): loads, as transformers
  // and vLLM load it.
  nlohmann::json extra = good;
  extra["weight_map"]["lm_head.weight"] = kShard1;
  extra["weight_map"]["vision_tower.patch_embed.weight"] = kShard2;
  ASSERT_TRUE(LoadModel(ShardedHf(shards, extra.dump())).ok());
  // A tensor the model needs that the index does not list.
  nlohmann::json partial = good;
  partial["weight_map"].erase("model.norm.weight");
  ExpectRefused(ShardedHf(shards, partial.dump()),
                "model.safetensors.index.json: tensor model.norm.weight not found in weight_map",
                absl::StatusCode::kNotFound);
  // An index that is not a regular file (here a folder) is refused, not skipped.
  const std::string dir = ShardedHf(shards, "");
  fs::create_directory(fs::path(dir) / "model.safetensors.index.json");
  ExpectRefused(dir, "model.safetensors.index.json: not a regular file");
}

TEST_F(MalformedModelTest, TokenizerJsonHugeAndWrongIds) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string field;
  };
  const Case cases[] = {
      {[](nlohmann::json& j) { j["model"]["vocab"]["hello"] = int64_t{1} << 30; }, "model.vocab"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["hello"] = 1e30; }, "model.vocab"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["hello"] = -1; }, "model.vocab"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["hello"] = "1"; }, "model.vocab"},
      {[](nlohmann::json& j) {
         j["added_tokens"].push_back({{"id", int64_t{1} << 40}, {"content", "<x>"}});
       },
       "added_tokens"},
      {[](nlohmann::json& j) { j["added_tokens"].push_back(7); }, "added_tokens"},
      {[](nlohmann::json& j) {
         j["model"]["merges"].push_back(nlohmann::json::array({1, 2}));
       },
       "merge"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    const std::string dir = HfWith("tokenizer.json", c.edit);
    auto tokenizer = LoadTokenizer(dir);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << tokenizer.status();
    EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(c.field));
    EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("tokenizer.json"));
    EXPECT_TRUE(IsModelFileError(LoadModel(dir).status()));
  }
}

TEST(IsModelFileErrorTest, FileErrorsButNotResourceErrors) {
  EXPECT_TRUE(IsModelFileError(absl::InvalidArgumentError("x")));
  EXPECT_TRUE(IsModelFileError(absl::DataLossError("x")));
  EXPECT_TRUE(IsModelFileError(absl::NotFoundError("x")));
  EXPECT_TRUE(IsModelFileError(absl::UnimplementedError("x")));
  EXPECT_FALSE(IsModelFileError(absl::ResourceExhaustedError("x")));
  EXPECT_FALSE(IsModelFileError(absl::InternalError("x")));
  EXPECT_FALSE(IsModelFileError(absl::OkStatus()));
}

}  // namespace
}  // namespace lazyattn
