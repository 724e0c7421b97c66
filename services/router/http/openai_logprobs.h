// The sampled tokens' log probabilities in OpenAI's two response forms (docs/http-api.md, "Log
// probabilities"). A request that asks for them (chat: `logprobs: true`; completions:
// `logprobs: n`, openai_fields.h) sets SamplingParams.logprobs, and each real token's chunk then
// carries its log-probability and its own bytes (TokenChunk.logprob, token_bytes). Alternatives
// (chat: `top_logprobs: k`; completions: n > 0) set SamplingParams.top_logprobs, and each such
// chunk also carries the k most likely tokens, most likely first (TokenChunk.top_logprobs).
//
// One entry per generated token, the tokens of a stop string included although the text leaves
// the stop string out (as each token was sampled, the entries say so).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_LOGPROBS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_LOGPROBS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lazyattn/v1/inference.pb.h"
#include "nlohmann/json.hpp"

namespace lazyattn::router {

// One of the most likely tokens at a position.
struct TokenAlternative {
  std::string bytes;  // the token's own bytes; may be part of a UTF-8 character
  float logprob = 0;
};

struct TokenLogprob {
  std::string bytes;  // the token's own bytes; may be part of a UTF-8 character
  float logprob = 0;
  // The most likely tokens at this position, most likely first, as the worker sent them (the
  // router's stream check bounds them, worker_stream_check.h); empty when not asked for.
  std::vector<TokenAlternative> top_logprobs;
};

// The entry of `chunk`: a real token (token_id >= 0) that carries its logprob; nullopt for the
// held-back text chunk (token_id -1) and for tokens sent without one. Its bytes are the chunk's
// token_bytes, or its text from a worker that does not send them; its alternatives are the
// chunk's top_logprobs.
std::optional<TokenLogprob> LogprobOf(const lazyattn::v1::TokenChunk& chunk);

// An entry's "token": its bytes when they are valid UTF-8; otherwise the valid characters as
// they are and every byte outside them as the four characters \xNN (its exact bytes are in
// "bytes", as OpenAI's are for tokens that hold part of a character).
std::string TokenString(std::string_view bytes);

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
// "bytes"}, ...]}, ...], "refusal": null}; each top_logprobs lists the token's alternatives in
// their order ([] when none were asked for).
nlohmann::json ChatLogprobs(std::span<const TokenLogprob> tokens);

// Where the generated text stands, in characters (code points, as Python counts a string), as
// its bytes arrive token by token: a character counts once its last byte came, so a token that
// starts inside a character is at that character's offset. Exact for well-formed text; a byte
// that starts no character, and each byte of a character cut short, count as one (the text shows
// each as U+FFFD).
class TextOffset {
 public:
  int64_t characters() const { return characters_; }
  // Where a token of these bytes starts in the text, before Add(bytes): characters(), plus the
  // bytes of a character under way when the token's first byte cuts it short (they show as
  // U+FFFD before the token); a token that continues that character starts at its offset.
  int64_t StartOf(std::string_view bytes) const;
  void Add(std::string_view bytes);

 private:
  int64_t characters_ = 0;
  int bytes_of_character_ = 0;      // of the character under way, so far
  int continuation_bytes_due_ = 0;  // of the character under way
};

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. text_offset is each
// token's start in the generated text (the prompt is not echoed), counted on from `*offset`,
// which ends past the tokens, so a stream's chunks continue where the last one ended.
// top_logprobs is null unless `alternatives` (the request asked for logprobs n > 0); then it is
// one object per token, {"<token string>": logprob, ...}: the token's alternatives and, as
// OpenAI's (up to n + 1 entries), the chosen token. An object holds a key once, and two tokens
// can show as the same string (two ids of the same bytes, such as special tokens that decode to
// nothing; a byte outside UTF-8 and the four characters \xNN that TokenString writes for it): the
// first keeps the key, which is the more likely one, the chosen token coming after the
// alternatives. The object's keys are written sorted (nlohmann::json's order), not by
// likelihood.
nlohmann::json CompletionLogprobs(std::span<const TokenLogprob> tokens, TextOffset* offset,
                                  bool alternatives = false);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_LOGPROBS_H_
