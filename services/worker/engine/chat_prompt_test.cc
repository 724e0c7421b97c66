// Where the chat prompt is cut around the documents, and what the template does to the question.
#include "services/worker/engine/chat_prompt.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// A client's text holding the marker the cut uses (in the system message, an earlier turn or the
// question itself) does not move the cut: the parts still join into the template's own rendering
// and the question is the last user message. (Found by fuzz_chat_template: with the marker in the
// system message, the cut fell inside it.)
TEST(ChatPromptTest, MarkerTextInTheMessagesDoesNotMoveTheCut) {
  auto tmpl = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::string marker = "\x01lazyattn-user-content\x01";
  const std::vector<ChatMessage> conversation = {
      {"system", "Keep " + marker + " as it is."},
      {"user", marker},
      {"assistant", "ok " + marker + "\x01lazyattn-user-content-0-1\x01"},
      {"user", "Why " + marker + "?"}};
  auto whole = tmpl->Apply(conversation);
  ASSERT_TRUE(whole.ok());
  for (bool has_documents : {true, false}) {
    auto parts = CutChatMessages(*tmpl, conversation, has_documents);
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_EQ(parts->question, "Why " + marker + "?<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(parts->system_prefix + parts->question, *whole);
  }
}

// A conversation that holds every numbered marker up to 20,000 (spread over turns, largest first)
// still gets one it does not hold, cut as before. Checking each candidate against every message
// made this quadratic: 256 turns of 64 KB kept a worker thread busy for most of an hour.
TEST(ChatPromptTest, ManyMarkerLikeTextsInTheMessagesAreFoundInOnePass) {
  auto tmpl = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  std::vector<ChatMessage> conversation;
  std::string text = "\x01lazyattn-user-content\x01";
  for (int n = 20000; n >= 0; --n) {
    absl::StrAppend(&text, "\x01lazyattn-user-content-0-", n, "\x01");
    if (n % 1000 == 0) {
      conversation.push_back({conversation.size() % 2 == 0 ? "user" : "assistant", text});
      text.clear();
    }
  }
  conversation.push_back({"user", "Why?"});
  auto whole = tmpl->Apply(conversation);
  ASSERT_TRUE(whole.ok());
  auto parts = CutChatMessages(*tmpl, conversation, /*has_documents=*/true);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->question, "Why?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(parts->system_prefix + parts->question, *whole);
}

// A conversation is cut at the start of the last user message: the history (and SmolLM2's
// default system message, inserted because the first turn is not a system turn) is the prefix,
// the documents' place is the start of the last user content. Expected text written out from the
// model's Jinja template.
TEST(ChatPromptTest, MultiTurnSmolLM2CutsAtTheLastUserMessage) {
  auto tmpl = ChatTemplate::FromName("smollm2");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::vector<ChatMessage> conversation = {
      {"user", "Hi"}, {"assistant", "Hello! How can I help?"}, {"user", "What is 2+2?"}};
  const std::string prefix =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I "
      "help?<|im_end|>\n<|im_start|>user\n";
  for (bool has_documents : {true, false}) {
    auto parts = CutChatMessages(*tmpl, conversation, has_documents);
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_EQ(parts->system_prefix, prefix);
    EXPECT_EQ(parts->question, "What is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  }
}

TEST(ChatPromptTest, MultiTurnLlama3KeepsSystemAndHistoryInThePrefix) {
  auto tmpl = ChatTemplate::FromName("llama3");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::vector<ChatMessage> conversation = {{"system", "Be brief."},
                                                 {"user", "Name a colour."},
                                                 {"assistant", " Blue. "},
                                                 {"user", "Another one?  "}};
  auto parts = CutChatMessages(*tmpl, conversation, /*has_documents=*/true);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->system_prefix,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nBlue.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n");
  EXPECT_EQ(parts->question,
            "Another one?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  auto whole = tmpl->Apply(conversation);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(parts->system_prefix + parts->question, *whole);
}

// The single-turn cut is the one-message conversation's cut.
TEST(ChatPromptTest, SingleTurnIsTheOneMessageConversation) {
  auto tmpl = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto single = CutChatPrompt(*tmpl, "S", "Q", /*has_documents=*/true);
  auto multi = CutChatMessages(*tmpl, {{"system", "S"}, {"user", "Q"}}, /*has_documents=*/true);
  ASSERT_TRUE(single.ok() && multi.ok());
  EXPECT_EQ(single->system_prefix, multi->system_prefix);
  EXPECT_EQ(single->question, multi->question);
}

TEST(ChatPromptTest, ConversationMustEndWithAUserTurn) {
  auto tmpl = ChatTemplate::FromName("chatml");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto empty = CutChatMessages(*tmpl, {}, true);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("messages"), std::string::npos);
  auto last = CutChatMessages(*tmpl, {{"user", "a"}, {"assistant", "b"}}, true);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(last.status().message().find("messages[1].role"), std::string::npos);
}

}  // namespace
}  // namespace lazyattn
