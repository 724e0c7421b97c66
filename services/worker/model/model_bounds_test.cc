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

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/model_fingerprint.h"
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
  std::string HfWith(const std::string& file, const std::function<void(nlohmann::json&)>& edit,
                     const std::string& from = kTinyHf) {
    const fs::path out = dir_ / "hf";
    fs::create_directories(out);
    for (const auto& f : fs::directory_iterator(from)) {
      fs::copy_file(f.path(), out / f.path().filename(), fs::copy_options::overwrite_existing);
    }
    nlohmann::json j = nlohmann::json::parse(ReadBytes((out / file).string()));
    edit(j);
    WriteBytes((out / file).string(), j.dump());
    return out.string();
  }

  // A copy of the GGUF at `from` with `bytes` written over tensor `name`'s data, `byte_offset`
  // bytes in; `type` receives the tensor's ggml type id.
  std::string GgufWithTensorBytes(const std::string& from, const std::string& name,
                                  size_t byte_offset, const std::string& bytes, uint32_t* type) {
    std::string b = ReadBytes(from);
    const GgufLayout layout = Walk(b);
    const size_t field = layout.tensor_offsets.at(name);
    std::memcpy(type, b.data() + field - 4, 4);  // the type id precedes the data offset
    uint64_t offset;
    std::memcpy(&offset, b.data() + field, 8);
    const size_t data_start = (layout.directory_end + 31) / 32 * 32;  // the default alignment
    b.replace(data_start + offset + byte_offset, bytes.size(), bytes);
    return Save(fs::path(from).filename().string(), b);
  }

  // The tensors of the tiny HF model: name -> (header entry, data bytes).
  static std::map<std::string, std::pair<nlohmann::json, std::string>> TinyHfTensors(
      const std::string& from = kTinyHf) {
    const std::string bytes = ReadBytes((fs::path(from) / "model.safetensors").string());
    uint64_t header_len;
    std::memcpy(&header_len, bytes.data(), 8);
    const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
    std::map<std::string, std::pair<nlohmann::json, std::string>> tensors;
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
      tensors[name] = {entry, bytes.substr(8 + header_len + begin, end - begin)};
    }
    return tensors;
  }

  // A safetensors file of `tensors` (name -> (header entry, bytes)) at `path`.
  static void WriteSafetensors(
      const std::string& path,
      const std::map<std::string, std::pair<nlohmann::json, std::string>>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& [name, t] : tensors) {
      nlohmann::json entry = t.first;
      entry["data_offsets"] = {data.size(), data.size() + t.second.size()};
      header[name] = entry;
      data += t.second;
    }
    const std::string text = header.dump();
    std::string out(8, '\0');
    const uint64_t n = text.size();
    std::memcpy(out.data(), &n, 8);
    WriteBytes(path, out + text + data);
  }

  // The tiny HF model in a fresh folder whose weights are `shards` (file name -> tensors), with
  // `index` as model.safetensors.index.json unless empty.
  std::string ShardedHf(
      const std::map<std::string, std::map<std::string, std::pair<nlohmann::json, std::string>>>&
          shards,
      const std::string& index) {
    const fs::path out = dir_ / "sharded";
    fs::remove_all(out);
    fs::create_directories(out);
    for (const char* file : {"config.json", "tokenizer.json"}) {
      fs::copy_file(fs::path(kTinyHf) / file, out / file);
    }
    for (const auto& [name, tensors] : shards) WriteSafetensors((out / name).string(), tensors);
    if (!index.empty()) WriteBytes((out / "model.safetensors.index.json").string(), index);
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

// A NaN or Inf weight is refused in both forms the loader makes (fp32, and packed for the CPU
// backend), naming the file, the tensor, the element (in the file's order) and its value.
void ExpectNonFiniteRefused(const std::string& path, const std::string& tensor, int64_t element,
                            const std::string& value) {
  ExpectRefused(path, absl::StrCat("tensor ", tensor, " has a non-finite value at element ",
                                   element, " (", value, ")"));
  auto packed = LoadModelWeights(path, {.packed = true});
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status(), LoadModelWeights(path).status());
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
