#include "services/worker/engine/generator.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/engine/testing_tokenizer.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

class GeneratorTest : public ::testing::Test {
 protected:
  GeneratorTest()
      : weights_(MakeRandomWeights(TinyTestConfig(), 21)),
        tokenizer_(MakeByteTokenizer()),
        runner_(weights_.get()),
        kv_(weights_->config, 32),
        generator_(&runner_, tokenizer_.get(), &kv_, /*prefill_chunk_tokens=*/8) {}

  // Greedy continuation computed by hand: one full forward pass per step, no KV reuse.
  std::vector<int32_t> NaiveGreedy(std::vector<int32_t> seq, int steps) {
    std::vector<int32_t> out;
    for (int s = 0; s < steps; ++s) {
      KvCacheCpu kv(weights_->config, 32);
      std::vector<int64_t> slots(seq.size());
      std::vector<KvBlockEntry> table;
      for (size_t i = 0; i < seq.size(); ++i) slots[i] = static_cast<int64_t>(i);
      for (size_t b = 0; b * 16 < seq.size(); ++b) {
        table.push_back(PackKvBlockEntry(b, 0, std::min<size_t>(16, seq.size() - b * 16)));
      }
      ForwardChunk ch{.tokens = seq, .kv_slots = slots, .block_table = table};
      auto logits = runner_.Forward(std::span(&ch, 1), kv);
      EXPECT_TRUE(logits.ok());
      out.push_back(ArgMax(*logits));
      seq.push_back(out.back());
    }
    return out;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  CpuRunner runner_;
  KvCacheCpu kv_;
  Generator generator_;
};

TEST_F(GeneratorTest, GreedyMatchesStepByStepRecomputation) {
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33,
                                       10, 65, 66, 67, 68, 69, 70, 71};
  auto r = generator_.Generate(prompt, {.temperature = 0, .max_tokens = 12, .ignore_eos = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_ids, NaiveGreedy(prompt, 12));
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->prompt_tokens, 20);
  EXPECT_GT(r->ttft_ms, 0);
  EXPECT_EQ(kv_.num_free_blocks(), kv_.num_blocks()) << "blocks leaked";
}

TEST_F(GeneratorTest, TextIsTheDecodedTokensAndStreamsPieceByPiece) {
  std::string streamed;
  auto r = generator_.Generate({1, 2, 3}, {.temperature = 0.8f, .seed = 9, .max_tokens = 20,
                                           .ignore_eos = true},
                               [&](int32_t, std::string_view text) { streamed += text; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_ids.size(), 20u);
  EXPECT_EQ(streamed, r->text);
  auto decoded = tokenizer_->Decode(r->token_ids);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(r->text, *decoded);
}

TEST_F(GeneratorTest, StopTokenEndsGenerationAndIsNotReturned) {
  const std::vector<int32_t> prompt = {5, 6, 7};
  const auto greedy = NaiveGreedy(prompt, 4);
  auto r = generator_.Generate(prompt, {.max_tokens = 10, .stop_token_ids = {greedy[2]},
                                        .ignore_eos = true});
  ASSERT_TRUE(r.ok()) << r.status();
  // Greedy may hit the stop id earlier than index 2 if it repeats.
  const auto stop_at = std::find(greedy.begin(), greedy.end(), greedy[2]) - greedy.begin();
  EXPECT_EQ(r->token_ids, std::vector<int32_t>(greedy.begin(), greedy.begin() + stop_at));
  EXPECT_EQ(r->finish_reason, "stop");
}

TEST_F(GeneratorTest, StopStringCutsTheText) {
  auto full = generator_.Generate({40, 41, 42}, {.max_tokens = 16, .ignore_eos = true});
  ASSERT_TRUE(full.ok());
  ASSERT_GE(full->text.size(), 4u);
  const std::string stop = full->text.substr(2, 2);
  auto r = generator_.Generate({40, 41, 42}, {.max_tokens = 16, .stop = {stop}, .ignore_eos = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finish_reason, "stop");
  EXPECT_EQ(r->text, full->text.substr(0, full->text.find(stop)));
}

TEST_F(GeneratorTest, BadRequestsAreRejectedAndLeakNothing) {
  EXPECT_EQ(generator_.Generate({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  auto oov = generator_.Generate({1, 300}, {});
  EXPECT_EQ(oov.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(oov.status().message().find("300"), std::string::npos);
  auto bad_temp = generator_.Generate({1}, {.temperature = -1});
  EXPECT_NE(bad_temp.status().message().find("temperature"), std::string::npos);
  std::vector<int32_t> too_long(4096, 1);
  EXPECT_EQ(generator_.Generate(too_long, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // 32 blocks hold 512 tokens: a 600-token prompt cannot fit.
  std::vector<int32_t> big(600, 1);
  EXPECT_EQ(generator_.Generate(big, {}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv_.num_free_blocks(), kv_.num_blocks());
}

}  // namespace
}  // namespace lazyattn
