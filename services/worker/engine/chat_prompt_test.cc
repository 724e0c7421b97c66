// Where the chat prompt is cut around the documents, and what the template does to the question.
#include "services/worker/engine/chat_prompt.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

// Llama-3 trims the user message (|trim). With documents before it, only the question's trailing
// whitespace ends the message; with none, the question is the whole message, trimmed both sides,
// as HF's apply_chat_template renders [{"role": "user", "content": question}].
TEST(ChatPromptTest, Llama3TrimsTheQuestionAsTheWholeUserMessage) {
  auto tmpl = ChatTemplate::FromName("llama3");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::string question = "\n   Summarize the text.  \n";
  const std::string header = "<|start_header_id|>user<|end_header_id|>\n\n";
  const std::string tail = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

  auto with_docs = CutChatPrompt(*tmpl, "", question, /*has_documents=*/true);
  ASSERT_TRUE(with_docs.ok()) << with_docs.status();
  EXPECT_EQ(with_docs->system_prefix, "<|begin_of_text|>" + header);
  EXPECT_EQ(with_docs->question, "\n   Summarize the text." + tail);

  auto alone = CutChatPrompt(*tmpl, "", question, /*has_documents=*/false);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->system_prefix, "<|begin_of_text|>" + header);
  EXPECT_EQ(alone->question, "Summarize the text." + tail);
  auto whole = tmpl->Apply({{"user", question}});
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(alone->system_prefix + alone->question, *whole);
}

// ChatML keeps the message as it is, with or without documents.
TEST(ChatPromptTest, ChatMLKeepsTheQuestionVerbatim) {
  auto tmpl = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  for (bool has_documents : {true, false}) {
    auto parts = CutChatPrompt(*tmpl, "Be brief.", "\n  Why?", has_documents);
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_EQ(parts->question, "\n  Why?<|im_end|>\n<|im_start|>assistant\n");
    auto whole = tmpl->Apply({{"system", "Be brief."}, {"user", "\n  Why?"}});
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(parts->system_prefix + parts->question, *whole);
  }
}

}  // namespace
}  // namespace lazyattn
