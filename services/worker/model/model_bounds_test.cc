// Malformed model files, made from the tiny models in tests/data/tiny by rewriting header bytes or
// JSON keys: every one is refused with a Status naming the file and the field, before anything
// sized by the bad value is allocated, and none aborts the process. GGUF files and HF configs
// here; safetensors files, their index and tokenizer.json in model_safetensors_bounds_test.cc.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/malformed_model_test_fixture.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;
using malformed_model_test::ExpectNonFiniteRefused;
using malformed_model_test::ExpectRefused;
using malformed_model_test::kTinyGguf;
using malformed_model_test::kTinyHf;
using malformed_model_test::MalformedModelTest;
using malformed_model_test::ReadBytes;
using malformed_model_test::WriteBytes;
using ::testing::HasSubstr;

TEST_F(MalformedModelTest, TheTinyModelsLoad) {
  // The baseline the mutations start from; and its bytes walked as the tests expect.
  ASSERT_TRUE(LoadModel(kTinyGguf).ok());
  ASSERT_TRUE(LoadModel(kTinyHf).ok());
  EXPECT_EQ(layout_.values.at("llama.context_length").first, 4u);  // uint32
  EXPECT_EQ(layout_.tensor_offsets.size(), 38u);
  EXPECT_TRUE(LoadModel(GgufWith("llama.context_length", uint32_t{1} << 24)).ok())
      << "the largest context the packed block entry allows";
}

// The aborts of the issue: each of these reached operator new with a size from the header.
TEST_F(MalformedModelTest, GgufContextLengthPastThePackedDelta) {
  ExpectRefused(GgufWith("llama.context_length", uint32_t{0xFFFFFFFF}), "llama.context_length");
  ExpectRefused(GgufWith("llama.context_length", (uint32_t{1} << 24) + 1), "llama.context_length");
  ExpectRefused(GgufWith("llama.context_length", uint32_t{0}), "llama.context_length");
}

TEST_F(MalformedModelTest, GgufHugeDimensions) {
  for (const char* key : {"llama.embedding_length", "llama.feed_forward_length", "llama.vocab_size",
                          "llama.block_count", "llama.attention.head_count",
                          "llama.attention.key_length", "llama.rope.dimension_count"}) {
    SCOPED_TRACE(key);
    ExpectRefused(GgufWith(key, uint32_t{1} << 31), key);
    ExpectRefused(GgufWith(key, uint32_t{0xFFFFFFFF}), key);
  }
  ExpectRefused(GgufWith("llama.attention.head_count_kv", uint32_t{8}),
                "llama.attention.head_count_kv");  // more kv heads than heads
}

// Values inside the bounds that the file's tensors do not back: refused by the shape check, which
// runs before the fp32 weights are allocated (a 2^21 x 65,536 embedding would be 512 GiB).
TEST_F(MalformedModelTest, GgufSizesTheTensorsDoNotBack) {
  ExpectRefused(GgufWith("llama.vocab_size", uint32_t{1} << 21), "token_embd.weight");
  ExpectRefused(GgufWith("llama.feed_forward_length", uint32_t{1} << 18), "ffn_gate.weight");
  ExpectRefused(GgufWith("llama.block_count", uint32_t{1024}), "blk.4.attn_norm.weight",
                absl::StatusCode::kNotFound);
  // hidden 65,536 with key_length 16: 4 heads of 16 no longer make the hidden size, and the
  // embedding's shape says so.
  ExpectRefused(GgufWith("llama.embedding_length", uint32_t{65536}), "token_embd.weight");
}

TEST_F(MalformedModelTest, GgufBadRmsNormEps) {
  constexpr char kEps[] = "llama.attention.layer_norm_rms_epsilon";
  for (float eps : {std::numeric_limits<float>::quiet_NaN(), -1e-5f, 0.0f,
                    std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(eps);
    ExpectRefused(GgufWith(kEps, eps), kEps);
  }
  ExpectRefused(GgufWith("llama.rope.freq_base", std::numeric_limits<float>::quiet_NaN()),
                "llama.rope.freq_base");
}

TEST_F(MalformedModelTest, GgufLyingTensorOffset) {
  std::string b = gguf_;
  const uint64_t past_end = uint64_t{1} << 40;
  std::memcpy(b.data() + layout_.tensor_offsets.at("blk.0.ffn_down.weight"), &past_end, 8);
  ExpectRefused(Save("lying.gguf", b), "blk.0.ffn_down.weight", absl::StatusCode::kDataLoss);
  // An offset inside the data section whose tensor (32 KiB) then runs past its end.
  const size_t data_start = (layout_.directory_end + 31) / 32 * 32;
  const uint64_t near_end = (gguf_.size() - data_start - 64) / 32 * 32;
  std::memcpy(b.data() + layout_.tensor_offsets.at("blk.0.ffn_down.weight"), &near_end, 8);
  ExpectRefused(Save("lying.gguf", b), "blk.0.ffn_down.weight", absl::StatusCode::kDataLoss);
}

TEST_F(MalformedModelTest, GgufTruncatedAnywhere) {
  // Every prefix up to the end of the metadata, then a sample through the tensor data.
  std::vector<size_t> sizes;
  const size_t directory_end = layout_.directory_end;
  for (size_t n = 0; n < directory_end + 64; n += (n < 1024 ? 1 : 7)) sizes.push_back(n);
  for (size_t n = directory_end; n < gguf_.size(); n += 4099) sizes.push_back(n);
  sizes.push_back(gguf_.size() - 1);
  for (size_t n : sizes) {
    const std::string path = Save("truncated.gguf", gguf_.substr(0, n));
    auto model = LoadModel(path);
    ASSERT_FALSE(model.ok()) << n;
    EXPECT_TRUE(IsModelFileError(model.status())) << n << ": " << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(path)) << n;
  }
}

TEST_F(MalformedModelTest, GgufHugeTokenizerArrays) {
  // A token array that claims 2^40 strings: refused against the bytes left before any reserve.
  std::string b = gguf_;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(b.data() + layout_.values.at("tokenizer.ggml.tokens").second + 4, &huge, 8);
  const std::string path = Save("tokens.gguf", b);
  auto tokenizer = LoadTokenizer(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kDataLoss) << tokenizer.status();
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("tokenizer.ggml.tokens"));
}

// The aborts of the issue in the HF config.
TEST_F(MalformedModelTest, HfConfigHugeValues) {
  struct Case {
    const char* key;
    nlohmann::json value;
  };
  const Case cases[] = {
      {"hidden_size", int64_t{1} << 40},
      {"vocab_size", int64_t{1} << 31},
      {"num_hidden_layers", 1000000000},
      {"num_hidden_layers", 1e30},  // past int64: no undefined cast
      {"num_hidden_layers", 4.5},
      {"num_hidden_layers", "4"},
      {"num_attention_heads", -4},
      {"intermediate_size", uint64_t{0xFFFFFFFFFFFFFFFF}},
      {"num_key_value_heads", 8},  // more than num_attention_heads
      {"head_dim", 1 << 20},
      {"max_position_embeddings", int64_t{0xFFFFFFFF}},
      {"max_position_embeddings", 0},
      {"rms_norm_eps", -1e-5},
      {"rms_norm_eps", 0},
      {"rms_norm_eps", 1e300},  // finite as a double, inf as the float it becomes
      {"rope_theta", 0.5},
      {"tie_word_embeddings", "yes"},
      {"sliding_window", -1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    const std::string dir = HfWith("config.json", [&](nlohmann::json& j) { j[c.key] = c.value; });
    ExpectRefused(dir, c.key);
  }
}

TEST_F(MalformedModelTest, HfConfigWrongTypesAndShapes) {
  // model_type of the wrong type once threw out of nlohmann's value().
  ExpectRefused(HfWith("config.json", [](nlohmann::json& j) { j["model_type"] = 7; }), "model_type",
                absl::StatusCode::kUnimplemented);
  // An informational key of the wrong type is ignored, as an absent one is.
  auto weights =
      LoadModelWeights(HfWith("config.json", [](nlohmann::json& j) { j["_name_or_path"] = 7; }));
  EXPECT_TRUE(weights.ok()) << weights.status();
}

TEST_F(MalformedModelTest, HfConfigTooLarge) {
  const std::string dir = HfWith("config.json", [](nlohmann::json&) {});
  const std::string config = (fs::path(dir) / "config.json").string();
  std::string text = ReadBytes(config);
  text.append(kMaxConfigJsonBytes + 1 - text.size(), ' ');  // valid JSON, one byte too many
  WriteBytes(config, text);
  ExpectRefused(dir, "larger than 16777216 bytes");
  text.pop_back();
  WriteBytes(config, text);
  EXPECT_TRUE(LoadModelWeights(dir).ok());
}

TEST_F(MalformedModelTest, HfConfigSizesTheTensorsDoNotBack) {
  // In bounds, but the safetensors file holds a 320 x 64 embedding.
  ExpectRefused(HfWith("config.json", [](nlohmann::json& j) { j["vocab_size"] = 1 << 21; }),
                "model.embed_tokens.weight");
  ExpectRefused(HfWith("config.json", [](nlohmann::json& j) { j["num_hidden_layers"] = 1024; }),
                "model.layers.4.input_layernorm.weight", absl::StatusCode::kNotFound);
}

// The attack's cases (NaN in output_norm.weight, +Inf in blk.0.attn_q.weight) and one in every
// type the tiny GGUF files store: F32 and F16 elements, and the scales of Q8_0, Q4_0 and Q4_1
// blocks (d, and Q4_1's m). Before the check these loaded, and every request then ended with no
// tokens.
TEST_F(MalformedModelTest, GgufNonFiniteWeights) {
  const std::string tiny = "tests/data/tiny/tiny-llama/tiny-llama-";
  auto f32 = [](float v) { return std::string(reinterpret_cast<const char*>(&v), 4); };
  auto f16 = [](uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); };
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string file, tensor;
    uint32_t type;       // the tensor's ggml type id in that file
    size_t byte_offset;  // where `bytes` go in the tensor's data
    std::string bytes;
    int64_t element;
    std::string value;
  };
  const Case cases[] = {
      {"f32.gguf", "output_norm.weight", 0, 3 * 4, f32(kNan), 3, "nan"},
      {"f32.gguf", "blk.0.attn_q.weight", 0, 100 * 4, f32(kInf), 100, "inf"},
      {"f32.gguf", "token_embd.weight", 0, 20000 * 4, f32(-kInf), 20000, "-inf"},
      {"f16.gguf", "blk.1.ffn_up.weight", 1, 5 * 2, f16(0xFC00), 5, "-inf"},
      {"f16.gguf", "token_embd.weight", 1, 77 * 2, f16(0x7E00), 77, "nan"},
      // Q8_0 blocks: d, 32 int8 (34 bytes); a NaN scale makes the whole block NaN.
      {"q8_0.gguf", "blk.2.ffn_down.weight", 8, 2 * 34, f16(0x7E00), 64, "nan"},
      // Q4_0 blocks: d, 16 bytes of nibbles; d = +inf over quants of either sign.
      {"q4_0.gguf", "blk.0.attn_k.weight", 2, 1 * 18, f16(0x7C00), 32, ""},
      // Q4_1 blocks: d, m, 16 bytes; m = +inf under a finite d is +inf everywhere.
      {"q4_1.gguf", "blk.3.attn_output.weight", 3, 3 * 20 + 2, f16(0x7C00), 96, "inf"},
      {"q4_1.gguf", "blk.0.ffn_gate.weight", 3, 0, f16(0x7E00), 0, "nan"},
      {"q4_1.gguf", "token_embd.weight", 8, 5 * 34, f16(0x7E00), 160, "nan"},  // a Q8_0 tensor
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file + " " + c.tensor);
    uint32_t type = 0;
    const std::string path =
        GgufWithTensorBytes(tiny + c.file, c.tensor, c.byte_offset, c.bytes, &type);
    ASSERT_EQ(type, c.type) << "the tiny model's tensor type changed";
    if (c.value.empty()) {
      ExpectRefused(path, absl::StrCat("tensor ", c.tensor, " has a non-finite value at element ",
                                       c.element, " ("));
    } else {
      ExpectNonFiniteRefused(path, c.tensor, c.element, c.value);
    }
  }
  // The largest finite values load.
  uint32_t type = 0;
  const std::string big = GgufWithTensorBytes(tiny + "f32.gguf", "output_norm.weight", 0,
                                              f32(std::numeric_limits<float>::max()), &type);
  EXPECT_TRUE(LoadModelWeights(big).ok());
  EXPECT_TRUE(LoadModelWeights(big, {.packed = true}).ok());
}

}  // namespace
}  // namespace lazyattn
