// Which top-level fields of an OpenAI request the router honours, which it may ignore, and which
// it must refuse (docs/http-api.md, "Requests").
//
//  - Read: the fields openai_json.h maps (logit_bias among them), the extensions, and the request
//    for log probabilities and their alternatives (ReadLogprobs).
//  - Ignored, harmless: user, metadata, store, service_tier, parallel_tool_calls (no tools are
//    ever accepted), prediction (a latency hint), and the unset or default value of any field
//    below.
//  - Refused when set to a value that asks for what the router does not do, because an answer
//    that ignored it would mean something else than the client asked for: echo true on a chat
//    request, or with logprobs (the prompt's log probabilities are not computed; a completion's
//    echo alone is read), best_of > 1, suffix non-empty, a completion's top_logprobs > 0 (a
//    completion counts its alternatives in `logprobs`), tools / functions non-empty, tool_choice /
//    function_call other than "none" or "auto", response_format other than {"type": "text"},
//    modalities other than
//    ["text"], audio, and vLLM's guided_json / guided_regex / guided_choice / guided_grammar.
//    InvalidArgument "<field>: not supported (...)", so the HTTP answer is 400 with `param` the
//    field.
//  - Anything else: accepted (SDKs add fields faster than servers learn them) and reported by
//    UnknownFields, for the handler to log.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_FIELDS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_FIELDS_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/include/sampling.h"
#include "nlohmann/json.hpp"

namespace lazyattn::router {

enum class ApiKind { kChat, kCompletion };

// What an error message quotes of a value the client sent: a string JSON-quoted and cut to
// kQuotedBytes (on a UTF-8 character boundary, "..." marking the cut), a number or boolean as
// written, an object or list only by its type (a hostile value may be megabytes, and the message
// goes back to the client and into logs).
inline constexpr size_t kQuotedBytes = 32;
std::string QuoteForMessage(const nlohmann::json& value);

// `s` cut to at most `max_bytes` without splitting a UTF-8 character; "..." appended when cut.
std::string TruncateUtf8(const std::string& s, size_t max_bytes);

// The largest `n`, as OpenAI's API bounds it (openai_json.h reads it; best_of is checked against
// it here). Each choice is its own call on the routing path and is admitted as one (the key's
// in-flight cap, the router's limit), so those bound the load.
inline constexpr int kMaxChoices = 128;

// OK, or InvalidArgument naming the first field (in the order above) set to a value the router
// does not implement, or of the wrong type. `body` is a JSON object.
absl::Status CheckUnsupportedFields(ApiKind kind, const nlohmann::json& body);

// What a request asks for of the sampled tokens' log probabilities (SamplingParams.logprobs and
// top_logprobs).
struct LogprobsRequest {
  bool logprobs = false;  // the chosen tokens' own
  // The most likely alternatives at each token, [0, kMaxTopLogprobs] (kernels/include/
  // sampling.h: OpenAI's chat bound; its legacy completions stop at 5, vLLM takes 20 for both).
  int top_logprobs = 0;
};

// Chat: `logprobs: true` asks for the chosen tokens', `top_logprobs: k` for k alternatives too
// (k > 0 needs logprobs true, as OpenAI's). Completions: `logprobs: n` asks for the chosen
// tokens' and n alternatives (0: the chosen tokens' only). InvalidArgument naming the field for a
// wrong type, a count outside [0, kMaxTopLogprobs], top_logprobs > 0 without logprobs, and a
// completion's top_logprobs > 0 (not a completions field; its count is `logprobs`).
absl::StatusOr<LogprobsRequest> ReadLogprobs(ApiKind kind, const nlohmann::json& body);

// The body's top-level fields that the router neither reads, ignores knowingly, nor refuses
// (for `kind`: a chat request's `prompt` is unknown, as a completion's `messages`), sorted by
// name, at most kMaxUnknownFields, each cut by TruncateUtf8 to kMaxFieldNameBytes.
inline constexpr size_t kMaxUnknownFields = 16;
inline constexpr size_t kMaxFieldNameBytes = 64;
std::vector<std::string> UnknownFields(ApiKind kind, const nlohmann::json& body);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_FIELDS_H_
