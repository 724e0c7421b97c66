#include "services/worker/model/tokenizer/chat_template.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// SmolLM2-135M-Instruct's tokenizer.chat_template (GGUF metadata), verbatim.
constexpr char kSmolLM2Jinja[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

// Meta's Llama-3-Instruct (3.0) template, verbatim.
constexpr char kLlama3Jinja[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// Markers of Meta's Llama-3.1 / 3.2 templates (abridged).
constexpr char kLlama31Jinja[] =
    "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" "
    "%}{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting "
    "Knowledge Date: December 2023\\n\" }}... {{- \"<|eot_id|>\" }}";
constexpr char kLlama32Jinja[] =
    "{%- if strftime_now is defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}"
    "{%- endif %}<|start_header_id|>Cutting Knowledge Date<|eot_id|>";

std::string Render(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt = true) {
  absl::StatusOr<std::string> s = t.Apply(messages, add_generation_prompt);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.value_or("<error>");
}

// Expected strings below were rendered with jinja2 3.1 from the models' own templates.

TEST(ChatTemplateTest, SmolLM2FromModelTemplate) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(kSmolLM2Jinja);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplate::Kind::kChatML);
  EXPECT_EQ(t->name(), "smollm2");
  EXPECT_EQ(t->default_system_message(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");

  EXPECT_EQ(Render(*t, {{"user", "Hi!"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(*t, {{"system", "Be brief."},
                        {"user", "Hi!"},
                        {"assistant", "Hello."},
                        {"user", " spaces \n"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n spaces \n<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(Render(*t, {{"user", "x"}}, /*add_generation_prompt=*/false),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
  EXPECT_EQ(Render(*t, {}), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, NamedTemplates) {
  absl::StatusOr<ChatTemplate> smol = ChatTemplate::FromName("smollm2");
  ASSERT_TRUE(smol.ok());
  EXPECT_EQ(Render(*smol, {{"user", "Hi!"}}),
            Render(*ChatTemplate::FromJinja(kSmolLM2Jinja), {{"user", "Hi!"}}));
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(Render(*chatml, {{"user", "Hi!"}}),
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  absl::StatusOr<ChatTemplate> bad = ChatTemplate::FromName("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("vicuna"));
  // An explicit name wins over the model's template.
  absl::StatusOr<ChatTemplate> resolved = ChatTemplate::Resolve("chatml", kLlama3Jinja);
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(resolved->name(), "chatml");
}

TEST(ChatTemplateTest, Llama3) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(kLlama3Jinja);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplate::Kind::kLlama3);
  EXPECT_EQ(Render(*t, {{"system", "Be brief."}, {"user", "\tHi!\n"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
            "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(*t, {}, false), "");
}

TEST(ChatTemplateTest, Llama31) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(kLlama31Jinja);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind(), ChatTemplate::Kind::kLlama31);
  EXPECT_EQ(t->name(), "llama3.1");
  EXPECT_EQ(Render(*t, {{"system", "  Be brief.\n"}, {"user", " Hi! "}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(*t, {{"user", "Hi"}}, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  ChatTemplate::Options options;
  options.date_string = "01 Jan 2025";
  EXPECT_THAT(*t->Apply({{"user", "Hi"}}, options), HasSubstr("Today Date: 01 Jan 2025\n"));
  EXPECT_FALSE(t->Apply({}, true).ok());
  absl::StatusOr<std::string> tool = t->Apply({{"user", "Hi"}, {"tool", "{}"}}, true);
  ASSERT_FALSE(tool.ok());
  EXPECT_EQ(tool.status().code(), absl::StatusCode::kUnimplemented);

  absl::StatusOr<ChatTemplate> t32 = ChatTemplate::FromJinja(kLlama32Jinja);
  ASSERT_TRUE(t32.ok());
  EXPECT_EQ(t32->name(), "llama3.2");
  EXPECT_THAT(Render(*t32, {{"user", "Hi"}}), StartsWith("<|begin_of_text|>"));
}

TEST(ChatTemplateTest, UnknownTemplates) {
  EXPECT_EQ(ChatTemplate::FromJinja("").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<ChatTemplate> t =
      ChatTemplate::FromJinja("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
  // ChatML with tools would be rendered wrongly: refused.
  t = ChatTemplate::FromJinja("{% if tools %}...{% endif %}<|im_start|>");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
}

// A template that writes the markers of both families is refused rather than taken for the one
// whose marker is checked first: the name must say which.
TEST(ChatTemplateTest, MarkersOfBothFamiliesAreRefused) {
  for (const std::string& jinja :
       {std::string(kSmolLM2Jinja) + kLlama31Jinja, std::string(kLlama3Jinja) + "<|im_start|>"}) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(jinja);
    ASSERT_FALSE(t.ok()) << t->name();
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(t.status().message(), HasSubstr("both ChatML"));
    EXPECT_THAT(t.status().message(), HasSubstr("a template of one family"));
  }
  // Either family's marker alone keeps its detection.
  EXPECT_EQ(ChatTemplate::FromJinja(kLlama31Jinja)->name(), "llama3.1");
  EXPECT_EQ(ChatTemplate::FromJinja(kSmolLM2Jinja)->name(), "smollm2");
}

}  // namespace
}  // namespace lazyattn
