// The log-probability objects of the HTTP responses (openai_logprobs.h): OpenAI's chat and
// completions forms, token strings of partial characters, and text offsets in characters.
#include "services/router/http/openai_logprobs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>
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

TEST(OpenAiLogprobsTest, AnEntryKeepsItsAlternativesInTheirOrder) {
  lazyattn::v1::TokenChunk chunk;
  chunk.set_token_id(7);
  chunk.set_text("Hi");
  chunk.set_token_bytes("Hi");
  chunk.set_logprob(-0.25f);
  EXPECT_TRUE(LogprobOf(chunk)->top_logprobs.empty());  // none asked for
  for (const auto& [id, logprob, bytes] : {std::tuple<int, float, const char*>{7, -0.25f, "Hi"},
                                           {3, -2.0f, "Ho"},
                                           {9, -9999.0f, "\xff"}}) {
    lazyattn::v1::TopLogprob* t = chunk.add_top_logprobs();
    t->set_token_id(id);
    t->set_logprob(logprob);
    t->set_token_bytes(bytes);
  }
  const auto entry = LogprobOf(chunk);
  ASSERT_TRUE(entry.has_value());
  ASSERT_EQ(entry->top_logprobs.size(), 3u);
  EXPECT_EQ(entry->top_logprobs[0].bytes, "Hi");
  EXPECT_EQ(entry->top_logprobs[0].logprob, -0.25f);
  EXPECT_EQ(entry->top_logprobs[1].bytes, "Ho");
  EXPECT_EQ(entry->top_logprobs[1].logprob, -2.0f);
  EXPECT_EQ(entry->top_logprobs[2].bytes, "\xff");
  EXPECT_EQ(entry->top_logprobs[2].logprob, -9999.0f);
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

// Each entry's top_logprobs lists its alternatives as OpenAI's do: token, logprob and bytes, in
// the order the worker sent (most likely first), a partial character escaped as in "token".
TEST(OpenAiLogprobsTest, ChatFormListsTheAlternatives) {
  const std::vector<TokenLogprob> tokens = {
      {"Hi", -0.1f, {{"Hi", -0.1f}, {"\xE2\x82", -2.5f}, {"", -9999.0f}}},
      {"!", -0.3f, {{"?", -0.2f}, {"!", -0.3f}}}};
  const json j = ChatLogprobs(tokens);
  const json expected = json::parse(R"({
    "content": [
      {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": [
        {"token": "Hi", "logprob": -0.1, "bytes": [72, 105]},
        {"token": "\\xe2\\x82", "logprob": -2.5, "bytes": [226, 130]},
        {"token": "", "logprob": -9999.0, "bytes": []}]},
      {"token": "!", "logprob": -0.3, "bytes": [33], "top_logprobs": [
        {"token": "?", "logprob": -0.2, "bytes": [63]},
        {"token": "!", "logprob": -0.3, "bytes": [33]}]}
    ],
    "refusal": null})");
  EXPECT_EQ(j, expected) << j.dump();
}

// Completions: one object per token of the alternatives and the chosen token, by string. Two
// tokens of one string keep the first (the more likely); the chosen token, when not among the
// alternatives, is added after them.
TEST(OpenAiLogprobsTest, CompletionFormMapsAlternativesByStringKeepingTheMoreLikely) {
  const std::vector<TokenLogprob> tokens = {
      // chosen among the alternatives: n entries
      {"a", -0.5f, {{"a", -0.5f}, {"b", -1.0f}}},
      // chosen outside them: n + 1 entries
      {"c", -4.0f, {{"d", -0.1f}, {"e", -0.2f}}},
      // two ids of the same bytes, and a byte 0xFF beside the four characters that escape it
      {"x", -0.25f, {{"x", -0.25f}, {"x", -0.75f}, {"\xFF", -1.0f}, {"\\xff", -1.5f}}},
      // no alternatives came (a worker that does not send them): the chosen token alone
      {"z", -0.125f, {}}};
  TextOffset offset;
  const json j = CompletionLogprobs(tokens, &offset, /*alternatives=*/true);
  EXPECT_EQ(j["top_logprobs"], json::parse(R"([
      {"a": -0.5, "b": -1.0},
      {"d": -0.1, "e": -0.2, "c": -4.0},
      {"x": -0.25, "\\xff": -1.0},
      {"z": -0.125}])"))
      << j.dump();
  EXPECT_EQ(j["tokens"], json::parse(R"(["a", "c", "x", "z"])"));
  EXPECT_EQ(j["token_logprobs"], json::parse("[-0.5, -4.0, -0.25, -0.125]"));
  // Not asked for: null, whatever came.
  TextOffset other;
  EXPECT_TRUE(CompletionLogprobs(tokens, &other)["top_logprobs"].is_null());
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

// A token after a character cut short starts after that character's U+FFFDs: "\xAB", "\xE9",
// " there" shows as "\uFFFD\uFFFD there" (the worker writes one U+FFFD a byte of a broken
// character), so " there" is at 2. It was given 1: its offset was taken before its first byte had
// ended the broken "\xE9" (a lead byte whose continuation never came).
TEST(OpenAiLogprobsTest, ATokenAfterABrokenCharacterStartsAfterItsReplacements) {
  const std::vector<TokenLogprob> tokens = {{"\xAB", -0.1f},
                                            {"\xE9", -0.2f},
                                            {" there", -0.3f},
                                            {"\xE2\x82", -0.4f},
                                            {"\xAC!", -0.5f},
                                            {"\xF0\x9F", -0.6f},
                                            {"", -0.7f},
                                            {"\x98\x80", -0.8f}};
  TextOffset offset;
  const json j = CompletionLogprobs(tokens, &offset);
  // \uFFFD \uFFFD " there" (6) "\u20AC" "!" "\U0001F600": the token that finishes a character
  // starts where the character does; an empty token stands where the text is.
  EXPECT_EQ(j["text_offset"], json::parse("[0, 1, 2, 8, 8, 10, 10, 10]")) << j.dump();
  EXPECT_EQ(offset.characters(), 11);
}

}  // namespace
}  // namespace lazyattn::router
