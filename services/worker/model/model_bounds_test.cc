// Malformed model files, made from the tiny models in tests/data/tiny by rewriting header bytes or
// JSON keys: every one is refused with a Status naming the file and the field, before anything
// sized by the bad value is allocated, and none aborts the process.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/safetensors_file.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kTinyGguf[] = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf";
constexpr char kTinyHf[] = "tests/data/tiny/tiny-llama/hf-f32";

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Where each metadata value and each tensor's data offset sits in a GGUF file (v3, as the tiny
// models are), so a test can rewrite them in place.
struct GgufLayout {
  std::map<std::string, std::pair<uint32_t, size_t>> values;  // key -> (type id, offset)
  std::map<std::string, size_t> tensor_offsets;               // name -> offset of its data offset
  size_t directory_end = 0;                                   // the tensor directory's end
};

GgufLayout Walk(const std::string& b) {
  GgufLayout layout;
  size_t p = 8;
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  const uint64_t n_tensors = u64(p), n_kv = u64(p + 8);
  p += 16;
  auto str = [&]() {
    const uint64_t n = u64(p);
    std::string s = b.substr(p + 8, n);
    p += 8 + n;
    return s;
  };
  auto skip = [&](uint32_t t) {
    static const std::map<uint32_t, size_t> kSize = {
        {0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 4}, {5, 4}, {6, 4}, {7, 1}, {10, 8}, {11, 8}, {12, 8}};
    if (t == 8) {
      str();
    } else {
      p += kSize.at(t);
    }
  };
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = str();
    const uint32_t type = u32(p);
    p += 4;
    layout.values[key] = {type, p};
    if (type == 9) {
      const uint32_t et = u32(p);
      const uint64_t n = u64(p + 4);
      p += 12;
      for (uint64_t k = 0; k < n; ++k) skip(et);
    } else {
      skip(type);
    }
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string name = str();
    const uint32_t n_dims = u32(p);
    p += 4 + 8 * n_dims + 4;
    layout.tensor_offsets[name] = p;
    p += 8;
  }
  layout.directory_end = p;
  return layout;
}

class MalformedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lazyattn_bounds_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    gguf_ = ReadBytes(kTinyGguf);
    ASSERT_GT(gguf_.size(), 4096u) << kTinyGguf;
    layout_ = Walk(gguf_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny GGUF with `key`'s value (a uint32 or float32 there) replaced by `value`'s bytes.
  template <typename T>
  std::string GgufWith(const std::string& key, T value) {
    auto it = layout_.values.find(key);
    EXPECT_NE(it, layout_.values.end()) << key;
    if (it == layout_.values.end()) return "";
    std::string b = gguf_;
    static_assert(sizeof(T) == 4);
    std::memcpy(b.data() + it->second.second, &value, sizeof(T));
    return Save("model.gguf", b);
  }

  std::string Save(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    WriteBytes(path, bytes);
    return path;
  }

  // A copy of the tiny HF model with config.json (or tokenizer.json) edited by `edit`.
  std::string HfWith(const std::string& file, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path out = dir_ / "hf";
    fs::create_directories(out);
    for (const auto& f : fs::directory_iterator(kTinyHf)) {
      fs::copy_file(f.path(), out / f.path().filename(), fs::copy_options::overwrite_existing);
    }
    nlohmann::json j = nlohmann::json::parse(ReadBytes((out / file).string()));
    edit(j);
    WriteBytes((out / file).string(), j.dump());
    return out.string();
  }

  fs::path dir_;
  std::string gguf_;
  GgufLayout layout_;
};

// Both entry points a worker uses fail with InvalidArgument naming the file and the key.
void ExpectRefused(const std::string& path, const std::string& field,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  auto weights = LoadModelWeights(path);
  ASSERT_FALSE(weights.ok()) << path << " " << field;
  EXPECT_EQ(weights.status().code(), code) << weights.status();
  EXPECT_THAT(std::string(weights.status().message()), HasSubstr(field));
  EXPECT_THAT(std::string(weights.status().message()), HasSubstr(path));
  EXPECT_TRUE(IsModelFileError(weights.status())) << weights.status();
  auto model = LoadModel(path);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status(), weights.status());
}

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
