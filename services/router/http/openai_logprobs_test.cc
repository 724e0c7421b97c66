// The log-probability objects of the HTTP responses (openai_logprobs.h): OpenAI's chat and
// completions forms, token strings of partial characters, and text offsets in characters.
#include "services/router/http/openai_logprobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace lazyattn::router {
namespace {

using nlohmann::json;

TEST(OpenAiLogprobsTest, AnEntryIsARealTokenWithItsLogprob) {
  lazyattn::v1::TokenChunk chunk;
  chunk.set_token_id(7);
  chunk.set_text("Hi");
  EXPECT_FALSE(LogprobOf(chunk).has_value());  // sent without one
  chunk.set_logprob(-0.25f);
  chunk.set_token_bytes("Hi");
  auto entry = LogprobOf(chunk);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->bytes, "Hi");
  EXPECT_EQ(entry->logprob, -0.25f);
  chunk.clear_token_bytes();  // a worker that does not send them: the text stands in
  EXPECT_EQ(LogprobOf(chunk)->bytes, "Hi");
  chunk.set_token_id(-1);  // the held-back text chunk is text, not a token
  EXPECT_FALSE(LogprobOf(chunk).has_value());
}

TEST(OpenAiLogprobsTest, TokenStringsEscapeOnlyBytesOutsideWholeCharacters) {
  EXPECT_EQ(TokenString(" world"), " world");
  EXPECT_EQ(TokenString("\xC3\xA9t\xC3\xA9"), "\xC3\xA9t\xC3\xA9");  // "été"
  EXPECT_EQ(TokenString("\xE2\x82"), "\\xe2\\x82");                  // two thirds of "€"
  EXPECT_EQ(TokenString("\xAC!"), "\\xac!");                         // its last third, then "!"
  EXPECT_EQ(TokenString("a\xFF"
                        "b"),
            "a\\xffb");
  EXPECT_EQ(TokenString(""), "");
}

TEST(OpenAiLogprobsTest, ChatFormIsOpenAis) {
  const std::vector<TokenLogprob> tokens = {{"Hello", -0.5f}, {"\xE2\x82", -1.0f}};
  const json j = ChatLogprobs(tokens);
  const json expected = json::parse(R"({
    "content": [
      {"token": "Hello", "logprob": -0.5, "bytes": [72, 101, 108, 108, 111], "top_logprobs": []},
      {"token": "\\xe2\\x82", "logprob": -1.0, "bytes": [226, 130], "top_logprobs": []}
    ],
    "refusal": null})");
  EXPECT_EQ(j, expected) << j.dump();
  EXPECT_EQ(ChatLogprobs({}), json::parse(R"({"content": [], "refusal": null})"));
}

// text_offset counts characters of the generated text: "€" split over two tokens is one
// character, and the token that finishes it starts where it started.
TEST(OpenAiLogprobsTest, CompletionFormCountsOffsetsInCharactersAcrossChunks) {
  const std::vector<TokenLogprob> first = {{"ab", -0.1f}, {"\xE2\x82", -0.2f}};
  const std::vector<TokenLogprob> second = {{"\xAC"
                                             "c",
                                             -0.3f},
                                            {"d", -0.4f}};
  TextOffset offset;
  const json j1 = CompletionLogprobs(first, &offset);
  EXPECT_EQ(j1, json::parse(R"({"tokens": ["ab", "\\xe2\\x82"], "token_logprobs": [-0.1, -0.2],
                               "top_logprobs": null, "text_offset": [0, 2]})"))
      << j1.dump();
  // A stream's next chunk goes on where the last ended.
  const json j2 = CompletionLogprobs(second, &offset);
  EXPECT_EQ(j2["text_offset"], json::parse("[2, 4]"));
  EXPECT_EQ(offset.characters(), 5);  // a, b, €, c, d
}

TEST(OpenAiLogprobsTest, TextOffsetCountsBrokenBytesAsTheTextShowsThem) {
  TextOffset o;
  o.Add("\xF0\x9F\x98\x80");  // one four-byte character
  EXPECT_EQ(o.characters(), 1);
  o.Add("\xFF");  // starts no character: one U+FFFD
  EXPECT_EQ(o.characters(), 2);
  o.Add(
      "\xE2\x82"
      "x");  // a character cut short (two U+FFFD), then "x"
  EXPECT_EQ(o.characters(), 5);
  o.Add("\x80");  // a stray continuation byte
  EXPECT_EQ(o.characters(), 6);
}

}  // namespace
}  // namespace lazyattn::router
