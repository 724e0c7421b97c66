#include "services/worker/model/model_weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/test_gguf_files.h"

namespace lazyattn {
namespace {

TEST(UnpermuteGgufRopeRowsTest, InvertsTheConvertersPermutation) {
  // llama.cpp's converter: w.reshape(n_head, 2, d/2, cols).swapaxes(1, 2): GGUF row h*d + 2i + j
  // holds HF row h*d + j*d/2 + i. Build the permuted matrix from row labels and undo it.
  const int heads = 3, d = 8, cols = 2;
  std::vector<float> gguf(heads * d * cols);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < d / 2; ++i)
      for (int j = 0; j < 2; ++j)
        for (int c = 0; c < cols; ++c)
          gguf[((h * d) + 2 * i + j) * cols + c] = float((h * d + j * d / 2 + i) * 10 + c);
  UnpermuteGgufRopeRows(gguf.data(), heads, d, cols);
  for (int r = 0; r < heads * d; ++r)
    for (int c = 0; c < cols; ++c) EXPECT_EQ(gguf[r * cols + c], float(r * 10 + c)) << r;
}

// The GGUF placement list fills every element of every slot exactly once, tied or not.
TEST(GgufWeightPlacementsTest, CoverEverySlotOnce) {
  for (bool tied : {true, false}) {
    ModelConfig c = TinyTestConfig();
    c.tie_word_embeddings = tied;
    std::map<std::pair<int, int>, std::vector<int>> filled;  // (slot, layer) -> per element
    int rope_tensors = 0;
    for (const WeightPlacement& p : GgufWeightPlacements(c)) {
      auto& cover = filled[{static_cast<int>(p.slot), p.layer}];
      cover.resize(WeightSlotElements(c, p.slot));
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      ASSERT_LE(p.offset + n, static_cast<int64_t>(cover.size())) << p.name;
      for (int64_t i = 0; i < n; ++i) ++cover[p.offset + i];
      if (p.rope_heads > 0) {
        ++rope_tensors;
        EXPECT_EQ(p.rope_heads * int64_t{c.head_dim}, p.shape[0]) << p.name;
      }
    }
    EXPECT_EQ(rope_tensors, 2 * c.num_layers);  // q and k of every layer
    EXPECT_EQ(filled.size(), 2u + (tied ? 0u : 1u) + 6u * c.num_layers);
    for (const auto& [key, cover] : filled) {
      EXPECT_TRUE(std::all_of(cover.begin(), cover.end(), [](int k) { return k == 1; }))
          << "slot " << key.first << " layer " << key.second;
    }
  }
}

// The fingerprint read straight from a GGUF file equals the one over the loaded weights, for
// every GGUF the tests carry (F32, F16, Q8_0, Q4_0; tied and untied; Llama-3 RoPE) and SmolLM2's
// Q4_1 when tools/fetch-model has fetched it.
TEST(GgufModelFingerprintTest, EqualsTheFingerprintOfTheLoadedWeights) {
  const std::vector<std::string> paths = testing::TestGgufFiles();
  ASSERT_GE(paths.size(), 4u) << "tests/data/tiny holds the tiny models' GGUF files";
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    auto weights = LoadModelWeights(path);
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    auto fingerprint = GgufModelFingerprint(**file);
    ASSERT_TRUE(fingerprint.ok()) << fingerprint.status();
    EXPECT_EQ(*fingerprint, ModelFingerprint(**weights));
    // Packed weights stand for the same values, so they fingerprint the same.
    auto packed = LoadModelWeights(path, {.packed = true});
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_EQ(*fingerprint, ModelFingerprint(**packed));
  }
}

// The packed form holds the values of the fp32 form, bit for bit, in every slot; its fp32 matrix
// vectors are empty (one copy of the weights).
TEST(PackedWeightsTest, HoldTheFp32FormsValues) {
  std::vector<std::string> paths = testing::TestGgufFiles();
  paths.push_back("tests/data/tiny/tiny-llama/hf-bf16");
  paths.push_back("tests/data/tiny/tiny-llama/hf-f32");
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    if (path.find("SmolLM2") != std::string::npos) continue;  // 540 MB of fp32: the golden test
    auto fp32 = LoadModelWeights(path);
    auto packed = LoadModelWeights(path, {.packed = true});
    ASSERT_TRUE(fp32.ok()) << fp32.status();
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_TRUE((*packed)->packed());
    EXPECT_FALSE((*fp32)->packed());
    const ModelConfig& c = (*fp32)->config;
    std::vector<std::pair<WeightSlot, int>> slots = {{WeightSlot::kTokenEmbedding, -1},
                                                     {WeightSlot::kLmHead, -1}};
    for (int l = 0; l < c.num_layers; ++l) {
      for (WeightSlot s : {WeightSlot::kWqkv, WeightSlot::kWo, WeightSlot::kGateUp,
                           WeightSlot::kDown}) {
        slots.emplace_back(s, l);
      }
    }
    for (const auto& [slot, layer] : slots) {
      const std::vector<float>& want = WeightSlotVector(**fp32, slot, layer);
      const PackedMatrix& got = *WeightSlotPacked(**packed, slot, layer);
      EXPECT_TRUE(WeightSlotVector(**packed, slot, layer).empty());
      ASSERT_EQ(got.rows() * got.cols, static_cast<int64_t>(want.size()));
      const std::vector<float> values = got.Values(0, got.rows() * got.cols);
      // Bit for bit (the sign of zero too: the fingerprint hashes these bytes). An absent slot
      // (a tied LM head) is empty on both sides; memcmp is not called on its null data.
      ASSERT_EQ(values.size(), want.size());
      if (want.empty()) continue;
      EXPECT_EQ(std::memcmp(values.data(), want.data(), want.size() * sizeof(float)), 0)
          << "slot " << static_cast<int>(slot) << " layer " << layer;
    }
    if (path.find(".gguf") != std::string::npos && path.find("f32") == std::string::npos) {
      EXPECT_LT((*packed)->token_embedding_packed.bytes(),
                (*fp32)->token_embedding.size() * sizeof(float));
    }
  }
}

TEST(LoadModelWeightsTest, ClearErrorsForMissingOrUnknownPaths) {
  auto missing = LoadModelWeights("/nonexistent/model.gguf");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/model.gguf"), std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() / "lazyattn_model_weights_test";
  std::filesystem::create_directories(dir);
  // A symbolic-link loop exists but cannot be opened: the system's reason, not "not found".
  const auto loop = dir / "loop.gguf";
  std::filesystem::remove(loop);
  std::filesystem::create_symlink(loop.filename(), loop);
  auto looped = LoadModelWeights(loop.string());
  EXPECT_EQ(looped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(looped.status().message().find(loop.string()), std::string::npos);
  EXPECT_NE(looped.status().message().find("symbolic links"), std::string::npos)
      << looped.status().message();
  EXPECT_EQ(looped.status().message().find("not found"), std::string::npos);
  std::filesystem::remove(loop);
  // A FIFO as the model, or as an HF directory's config.json: refused, not waited on for a writer
  // (a worker hung at "loading the model").
  const auto fifo = dir / "fifo.gguf";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto fifo_model = LoadModelWeights(fifo.string());
  EXPECT_EQ(fifo_model.status().code(), absl::StatusCode::kInvalidArgument) << fifo_model.status();
  EXPECT_NE(fifo_model.status().message().find("not a regular file"), std::string::npos)
      << fifo_model.status();
  std::filesystem::remove(fifo);
  const auto fifo_dir = dir / "fifo-config";
  std::filesystem::remove_all(fifo_dir);
  std::filesystem::create_directories(fifo_dir);
  ASSERT_EQ(mkfifo((fifo_dir / "config.json").c_str(), 0600), 0);
  auto fifo_config = LoadModelWeights(fifo_dir.string());
  EXPECT_EQ(fifo_config.status().code(), absl::StatusCode::kInvalidArgument)
      << fifo_config.status();
  EXPECT_NE(fifo_config.status().message().find("not a regular file"), std::string::npos)
      << fifo_config.status();
  std::filesystem::remove_all(fifo_dir);

  auto no_config = LoadModelWeights(dir.string());
  EXPECT_EQ(no_config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_config.status().message().find("config.json"), std::string::npos);

  std::ofstream(dir / "config.json") << R"({"model_type": "gpt_neox", "hidden_size": 8})";
  auto wrong_arch = LoadModelWeights(dir.string());
  EXPECT_EQ(wrong_arch.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(wrong_arch.status().message().find("gpt_neox"), std::string::npos);

  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "hidden_size": "big"})";
  auto bad_field = LoadModelWeights(dir.string());
  EXPECT_EQ(bad_field.status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}


// --- Tiny random models in both formats against llama.cpp (tests/data/tiny, made by
// tools/reference/make-golden). One set of weights is written as HF safetensors (F32 and BF16,
// half-split Q/K) and as GGUF (F32, F16, quantized; Q/K rows permuted as llama.cpp's converter
// does), so every loader path must reproduce the same logits.

constexpr char kTinyGolden[] = "tests/data/tiny/golden.json";
// The reference computes in fp32 too; only summation order differs.
constexpr float kTinyLogitTolerance = 1e-4f;

const nlohmann::json& TinyGolden() {
  static const nlohmann::json* golden = [] {
    std::ifstream in(kTinyGolden);
    return new nlohmann::json(in ? nlohmann::json::parse(in) : nlohmann::json());
  }();
  return *golden;
}

// Logits of every position of `tokens` in one prefill.
std::vector<float> AllLogits(const ModelWeights& w, const std::vector<int32_t>& tokens) {
  CpuRunner runner(&w);
  // f32 pools: the comparison with llama.cpp F32 is exact up to summation order.
  KvCacheCpu kv(w.config, 8, kDefaultKvBlockSize, KvCacheDtype::kF32);
  std::vector<int64_t> slots(tokens.size());
  std::vector<KvBlockEntry> table;
  for (size_t i = 0; i < tokens.size(); ++i) slots[i] = static_cast<int64_t>(i);
  for (size_t b = 0; b * 16 < tokens.size(); ++b) {
    table.push_back(PackKvBlockEntry(b, 0, std::min<size_t>(16, tokens.size() - b * 16)));
  }
  ForwardChunk ch{.tokens = tokens, .kv_slots = slots, .block_table = table,
                  .logits_for_all_tokens = true};
  auto logits = runner.Forward(std::span(&ch, 1), kv);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

void ExpectLogits(const std::vector<float>& ours, int64_t vocab, const nlohmann::json& positions,
                  const nlohmann::json& expected, const std::string& what) {
  float worst = 0;
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i].get<int64_t>();
    const auto row = expected[i].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(row.size()), vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, std::abs(ours[p * vocab + v] - row[v]));
    }
  }
  EXPECT_LT(worst, kTinyLogitTolerance) << what;
}

class TinyModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (TinyGolden().is_null()) GTEST_SKIP() << kTinyGolden << " missing";
  }
};

TEST_P(TinyModelTest, EveryFormatMatchesLlamaCpp) {
  const auto& golden = TinyGolden();
  const auto& m = golden["models"][GetParam()];
  const auto tokens = golden["token_ids"].get<std::vector<int32_t>>();
  const int64_t vocab = m["config"]["vocab_size"].get<int64_t>();
  int checked = 0;
  for (const auto& [variant, file] : m["files"].items()) {
    for (const bool packed : {false, true}) {
      SCOPED_TRACE(variant + (packed ? " packed" : " fp32"));
      auto w = LoadModelWeights(file["path"].get<std::string>(), {.packed = packed});
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_EQ((*w)->config.vocab_size, vocab);
      EXPECT_EQ((*w)->config.tie_word_embeddings, m["config"]["tie_word_embeddings"].get<bool>());
      const auto logits = AllLogits(**w, tokens);
      const std::string quant = variant.substr(variant.find('-') + 1);
      if (quant == "f32" || quant == "bf16" || quant == "f16") {
        // These hold the same numbers exactly (the weights were rounded to bf16 first).
        ExpectLogits(logits, vocab, m["logits_positions"], m["logits"], variant);
        // Greedy continuation through the engine (KV cache, decode steps), the tokens as a
        // document-free prompt in mode full.
        auto tok = LoadTokenizer(file["path"].get<std::string>());
        ASSERT_TRUE(tok.ok()) << tok.status();
        Engine engine(w->get(), tok->get(), {.num_kv_blocks = 16});
        const auto greedy = m["greedy_ids"].get<std::vector<int32_t>>();
        // An empty system prefix still carries BOS for models that add one; these do not.
        ASSERT_FALSE((*tok)->add_bos());
        auto r = engine.Run({.question_token_ids = tokens,
                             .mode = CacheMode::kFull,
                             .sampling = {.max_tokens = static_cast<int>(greedy.size()),
                                          .ignore_eos = true}});
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->token_ids, greedy);
      } else {
        const auto& q = m["quantized_variants"][quant];
        ASSERT_TRUE(q.contains("logits")) << "no golden for " << variant;
        ExpectLogits(logits, vocab, q["logits_positions"], q["logits"], variant);
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
}

TEST(TinyModelRopeTest, Llama3RopeScalingComesThroughBothFormats) {
  if (TinyGolden().is_null()) GTEST_SKIP() << kTinyGolden << " missing";
  const auto& m = TinyGolden()["models"]["tiny-llama3-rope"];
  ASSERT_FALSE(m["rope_freqs"].is_null());
  // GGUF carries the divisors as rope_freqs.weight; HF carries the rope_scaling parameters. Both
  // must give the same inverse frequencies.
  auto gguf = LoadModelWeights(m["files"]["gguf-f32"]["path"].get<std::string>());
  auto hf = LoadModelWeights(m["files"]["hf-f32"]["path"].get<std::string>());
  ASSERT_TRUE(gguf.ok() && hf.ok());
  const auto expected = m["rope_freqs"].get<std::vector<double>>();
  EXPECT_EQ((*gguf)->config.rope.freq_factors.size(), expected.size());
  const auto a = RopeInverseFrequencies((*gguf)->config.rope);
  const auto b = RopeInverseFrequencies((*hf)->config.rope);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6 * b[i]) << i;
}

// transformers 5 writes {"rope_parameters": {"rope_theta", "rope_type", ...}} instead of
// rope_theta and rope_scaling; both spellings must give the same configuration.
TEST(HfConfigTest, RopeParametersOfTransformers5ReadLikeRopeScaling) {
  const std::string dir = ::testing::TempDir();
  const nlohmann::json base = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                               {"vocab_size", 300},
                               {"hidden_size", 64}, {"intermediate_size", 128},
                               {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                               {"num_key_value_heads", 2}, {"max_position_embeddings", 4096}};
  const nlohmann::json scaling = {{"rope_type", "llama3"}, {"factor", 8.0},
                                  {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 1024}};
  nlohmann::json v4 = base, v5 = base;
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = scaling;
  v5["rope_parameters"] = scaling;
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  auto read = [&](const nlohmann::json& j, const std::string& name) {
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << j.dump();
    return ModelConfigFromHfJson(path);
  };
  auto a = read(v4, "config_v4"), b = read(v5, "config_v5");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rope.theta, 500000.0);
  EXPECT_EQ(b->rope.scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(b->rope.scaling.original_max_positions, 1024);
  EXPECT_EQ(RopeInverseFrequencies(a->rope), RopeInverseFrequencies(b->rope));
  v5["rope_parameters"]["rope_type"] = "yarn";
  auto c = read(v5, "config_yarn");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("rope_parameters.rope_type"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(AllTinyModels, TinyModelTest,
                         ::testing::Values("tiny-llama", "tiny-llama-untied", "tiny-llama3-rope"));

}  // namespace
}  // namespace lazyattn
