// The shortest context a model loads with (model_config.cc, kMinContextLength = 64): a context
// or sliding window too short for a chat prompt and one generated token is refused at load,
// naming the key and the minimum, instead of loading a model that refuses every request.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kMinContext = 64;  // kMinContextLength
constexpr char kTinyGguf[] = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf";
constexpr char kTinyHfConfig[] = "tests/data/tiny/tiny-llama/hf-f32/config.json";

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ModelContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("model_context_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The tiny HF config with `key` set to `value`, read back.
  absl::StatusOr<ModelConfig> HfWith(const std::string& key, int64_t value) {
    nlohmann::json j = nlohmann::json::parse(ReadBytes(kTinyHfConfig));
    j[key] = value;
    const std::string path = (dir_ / "config.json").string();
    std::ofstream(path) << j.dump();
    return ModelConfigFromHfJson(path);
  }

  // The tiny GGUF with llama.context_length (a uint32 there) set to `value`, read back.
  absl::StatusOr<ModelConfig> GgufWithContext(uint32_t value) {
    std::string bytes = ReadBytes(kTinyGguf);
    // A metadata entry is the key's length and bytes, its uint32 type id, then the value.
    constexpr std::string_view kKey = "llama.context_length";
    const size_t at = bytes.find(kKey);
    EXPECT_NE(at, std::string::npos) << kTinyGguf;
    if (at == std::string::npos) return absl::InternalError("no llama.context_length");
    uint32_t type = 0;
    std::memcpy(&type, bytes.data() + at + kKey.size(), 4);
    EXPECT_EQ(type, 4u) << "uint32";
    std::memcpy(bytes.data() + at + kKey.size() + 4, &value, 4);
    const std::string path = (dir_ / "model.gguf").string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    if (!file.ok()) return file.status();
    return ModelConfigFromGguf(**file);
  }

  fs::path dir_;
};

void ExpectRefused(const absl::StatusOr<ModelConfig>& config, const std::string& message) {
  ASSERT_FALSE(config.ok()) << message;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(message));
}

TEST_F(ModelContextTest, HfMaxPositionEmbeddingsBelowTheMinimumIsRefused) {
  for (const int64_t n : {int64_t{1}, int64_t{2}, kMinContext - 1}) {
    SCOPED_TRACE(n);
    ExpectRefused(HfWith("max_position_embeddings", n),
                  "\"max_position_embeddings\" = " + std::to_string(n) +
                      ": must be an integer in [64, 16777216]");
  }
  absl::StatusOr<ModelConfig> shortest = HfWith("max_position_embeddings", kMinContext);
  ASSERT_TRUE(shortest.ok()) << shortest.status();
  EXPECT_EQ(shortest->max_positions, kMinContext);
}

// A sliding window caps the context it is served with (attention is never windowed), so a
// window of 1 made a model whose every request was refused.
TEST_F(ModelContextTest, HfSlidingWindowBelowTheMinimumIsRefused) {
  for (const int64_t n : {int64_t{1}, int64_t{2}, kMinContext - 1}) {
    SCOPED_TRACE(n);
    ExpectRefused(HfWith("sliding_window", n),
                  "\"sliding_window\" = " + std::to_string(n) + ": must be an integer in [64, ");
  }
  absl::StatusOr<ModelConfig> windowed = HfWith("sliding_window", kMinContext);
  ASSERT_TRUE(windowed.ok()) << windowed.status();
  EXPECT_EQ(windowed->max_positions, kMinContext);
}

TEST_F(ModelContextTest, GgufContextLengthBelowTheMinimumIsRefused) {
  for (const uint32_t n : {1u, 2u, uint32_t{kMinContext - 1}}) {
    SCOPED_TRACE(n);
    ExpectRefused(GgufWithContext(n),
                  "llama.context_length = " + std::to_string(n) + ": must be in [64, 16777216]");
  }
  absl::StatusOr<ModelConfig> shortest = GgufWithContext(kMinContext);
  ASSERT_TRUE(shortest.ok()) << shortest.status();
  EXPECT_EQ(shortest->max_positions, kMinContext);
}

// Configurations made in code (random weights, benchmarks) pass the same check.
TEST(ValidateModelConfigTest, MaxPositionsBelowTheMinimumIsRefused) {
  ModelConfig c = TinyTestConfig();
  c.max_positions = 1;
  const absl::Status s = ValidateModelConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_positions = 1: must be in [64, "));
  c.max_positions = kMinContext;
  EXPECT_TRUE(ValidateModelConfig(c).ok());
}

}  // namespace
}  // namespace lazyattn
