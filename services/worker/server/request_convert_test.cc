// Proto -> EngineRequest conversion: proto defaults, wire-only errors, chat prompts, prefetch.
#include "services/worker/server/request_convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

class RequestConvertTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> tokenizer_ = MakeByteTokenizer();
  ModelConfig config_ = TinyTestConfig();
};

TEST_F(RequestConvertTest, ProtoDefaultsBecomeServerDefaults) {
  v1::GenerateRequest r;
  r.set_system("sys");
  r.add_documents()->set_text("doc");
  r.add_documents()->mutable_tokens()->add_ids(65);
  r.mutable_documents(1)->set_id("b");
  r.set_question("q?");
  auto e = EngineRequestFromProto(r, *tokenizer_, config_, {.default_max_tokens = 77});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->mode, CacheMode::kLazy);
  EXPECT_EQ(e->sampling.max_tokens, 77);
  EXPECT_EQ(e->sampling.top_p, 1.0f);
  EXPECT_EQ(e->system_prefix, "sys");
  EXPECT_EQ(e->question, "q?");
  ASSERT_EQ(e->documents.size(), 2u);
  EXPECT_EQ(e->documents[0].text, "doc");
  EXPECT_FALSE(e->documents[0].token_ids.has_value());
  EXPECT_EQ(e->documents[1].id, "b");
  EXPECT_EQ(*e->documents[1].token_ids, std::vector<int32_t>{65});
  EXPECT_FALSE(e->sampling.seed.has_value());  // unseeded: the engine draws one
  EXPECT_FALSE(e->sampling.logprobs);
}

TEST_F(RequestConvertTest, ASetSeedEvenZeroAndLogprobsCarryOver) {
  v1::GenerateRequest r;
  r.set_question("q?");
  r.mutable_sampling()->set_seed(0);
  r.mutable_sampling()->set_logprobs(true);
  auto e = EngineRequestFromProto(r, *tokenizer_, config_, {});
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->sampling.seed.has_value());
  EXPECT_EQ(*e->sampling.seed, 0u);
  EXPECT_TRUE(e->sampling.logprobs);
  r.mutable_sampling()->set_seed(~uint64_t{0});
  e = EngineRequestFromProto(r, *tokenizer_, config_, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->sampling.seed, ~uint64_t{0});
}

// A minimal ChatML template as models ship it (recognized by its <|im_start|> markers).
constexpr char kChatMLJinja[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The conversation is rendered by the template; the documents open the last user turn, so the
// history is the system prefix.
TEST_F(RequestConvertTest, MultiTurnRendersTheConversationWithDocumentsInTheLastUserTurn) {
  auto tokenizer = MakeByteTokenizer(kChatMLJinja);
  ASSERT_NE(tokenizer, nullptr);
  v1::GenerateRequest r;
  for (auto [role, content] : {std::pair{"system", "Be brief."}, std::pair{"user", "Hi"},
                               std::pair{"assistant", "Hello."}, std::pair{"user", "Sum it up."}}) {
    v1::ChatMessage* m = r.add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  r.add_documents()->set_text("doc");
  auto e = EngineRequestFromProto(r, *tokenizer, config_, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->system_prefix,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(e->question, "Sum it up.<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_EQ(e->documents.size(), 1u);
  EXPECT_EQ(e->documents[0].text, "doc");

  // Without documents the prompt is the template's whole rendering.
  r.clear_documents();
  e = EngineRequestFromProto(r, *tokenizer, config_, {});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->system_prefix + e->question,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nSum it up.<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST_F(RequestConvertTest, MultiTurnErrorsNameTheField) {
  auto tokenizer = MakeByteTokenizer(kChatMLJinja);
  v1::GenerateRequest r;
  r.add_messages()->set_role("user");
  r.add_messages()->set_role("assistant");
  auto e = EngineRequestFromProto(r, *tokenizer, config_, {});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("messages[1].role"));
  r.mutable_messages()->RemoveLast();
  r.set_question("q");
  e = EngineRequestFromProto(r, *tokenizer, config_, {});
  EXPECT_THAT(e.status().message(), HasSubstr("question: must be empty with messages"));
  // A model without a chat template cannot render a conversation.
  r.clear_question();
  e = EngineRequestFromProto(r, *tokenizer_, config_, {});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(), HasSubstr("messages: the model's chat template"));
}

TEST_F(RequestConvertTest, CacheModes) {
  EXPECT_EQ(*CacheModeFromProto(v1::CACHE_MODE_FULL), CacheMode::kFull);
  EXPECT_EQ(*CacheModeFromProto(v1::CACHE_MODE_PREFIX), CacheMode::kPrefix);
  EXPECT_EQ(*CacheModeFromProto(v1::CACHE_MODE_BLOCK), CacheMode::kBlock);
  EXPECT_EQ(*CacheModeFromProto(v1::CACHE_MODE_UNSPECIFIED), CacheMode::kLazy);
  auto bad = CacheModeFromProto(9);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("cache_mode"));
}

TEST_F(RequestConvertTest, DocumentWithoutContentNamesItsIndexAndId) {
  v1::GenerateRequest r;
  r.add_documents()->set_text("ok");
  r.add_documents()->set_id("policy");
  r.set_question("q");
  auto e = EngineRequestFromProto(r, *tokenizer_, config_, {});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(),
            "documents[1]: neither text nor tokens set (document \"policy\")");
}

TEST_F(RequestConvertTest, PrefetchIsOneTokenOverTheDocuments) {
  v1::PrefetchRequest p;
  p.add_documents()->set_text("doc");
  p.set_cache_mode(v1::CACHE_MODE_BLOCK);
  auto e = PrefetchEngineRequest(p);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->mode, CacheMode::kBlock);
  EXPECT_EQ(e->sampling.max_tokens, 1);
  EXPECT_TRUE(e->system_prefix.empty());
  EXPECT_EQ(e->documents.size(), 1u);
  EXPECT_EQ(PrefetchEngineRequest(v1::PrefetchRequest()).status().code(),
            absl::StatusCode::kInvalidArgument);
  p.set_cache_mode(v1::CACHE_MODE_PREFIX);
  EXPECT_THAT(PrefetchEngineRequest(p).status().message(), HasSubstr("cache_mode"));
}

TEST_F(RequestConvertTest, UsageFieldsMap) {
  RequestUsage u{.prompt_tokens = 10,
                 .cached_tokens = 4,
                 .computed_tokens = 6,
                 .documents = 2,
                 .documents_hit = 1,
                 .document_hit_tokens = 2,
                 .document_copied_tokens = 1,
                 .prefix_tokens = 5,
                 .completion_tokens = 3};
  v1::Usage p;
  UsageToProto(u, &p);
  EXPECT_EQ(p.prompt_tokens(), 10);
  EXPECT_EQ(p.cached_tokens(), 4);
  EXPECT_EQ(p.computed_tokens(), 6);
  EXPECT_EQ(p.documents(), 2);
  EXPECT_EQ(p.documents_hit(), 1);
  EXPECT_EQ(p.document_hit_tokens(), 2);
  EXPECT_EQ(p.document_copied_tokens(), 1);
  EXPECT_EQ(p.prefix_tokens(), 5);
  EXPECT_EQ(p.completion_tokens(), 3);
}

TEST(ToValidUtf8Test, KeepsValidTextAndReplacesEachBadByte) {
  EXPECT_EQ(ToValidUtf8("plain ascii"), "plain ascii");
  EXPECT_EQ(ToValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(ToValidUtf8("a\xFF" "b"), "a" + fffd + "b");
  EXPECT_EQ(ToValidUtf8("\xE2\x82"), fffd + fffd);          // truncated sequence
  EXPECT_EQ(ToValidUtf8("\xC0\xAF"), fffd + fffd);          // overlong
  EXPECT_EQ(ToValidUtf8("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(ToValidUtf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // > U+10FFFF
  EXPECT_EQ(ToValidUtf8(std::string("\0x", 2)), std::string("\0x", 2));
}

}  // namespace
}  // namespace lazyattn
