// lazyattn.v1 results -> OpenAI's response objects, for the router's HTTP API (docs/http-api.md):
// chat.completion, chat.completion.chunk and text_completion, with usage {prompt_tokens,
// completion_tokens, total_tokens, prompt_tokens_details.cached_tokens} and the extension object
// "lazyattn" {documents, documents_hit, computed_tokens, worker, attempts, ttft_ms}. All JSON is
// one line (SSE frames it as one data field). Requests: openai_json.h.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_RESPONSE_JSON_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_RESPONSE_JSON_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "lazyattn/v1/inference.pb.h"
#include "nlohmann/json.hpp"
#include "services/router/http/openai_fields.h"

namespace lazyattn::router {

// What every response object of one request carries.
struct ResponseMeta {
  ApiKind kind = ApiKind::kChat;
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  // Put before each completion choice's text (`echo`): the whole response's "text", and a
  // stream's first chunk of each choice. Empty: nothing.
  std::string echo;
};

// OpenAI's finish_reason for the worker's ("stop", "length"; anything else is "stop").
const char* OpenAiFinishReason(std::string_view worker_reason);

// One choice of a whole response: its worker's end (text, finish reason, usage) and its
// "logprobs" (openai_logprobs.h), null when not asked for: given (`logprobs`, copied), or built
// by `make_logprobs` when CompletionJson reaches the choice and moved into the response, so that
// a response with large ones holds each choice's tree once, not twice.
struct ChoiceResult {
  const lazyattn::v1::Final* final = nullptr;
  const nlohmann::json* logprobs = nullptr;
  std::function<nlohmann::json()> make_logprobs;  // used when logprobs is null; may be empty
};

// The usage of a response with these choices' ends: the prompt (and its cached tokens) counted
// once, from the first choice, as OpenAI bills `n`; the completion tokens of all of them.
lazyattn::v1::Usage CombinedUsage(std::span<const lazyattn::v1::Final> finals);

// The whole response (stream: false), choice i with index i. The top-level "lazyattn" extension
// is the first choice's; with several choices each also carries its own.
std::string CompletionJson(const ResponseMeta& meta, std::span<const ChoiceResult> choices);
// Stream chunks, each for the choice with index `choice`. The first chunk of a chat choice
// carries the assistant role; every chunk carries "usage": null when the client asked for usage
// (as OpenAI streams do); the last chunk of a choice has its finish_reason and its "lazyattn"
// extension; with include_usage, a chunk with no choices and the usage (CombinedUsage) ends the
// stream.
std::string RoleChunkJson(const ResponseMeta& meta, int choice, bool include_usage);
std::string TextChunkJson(const ResponseMeta& meta, int choice, const std::string& text,
                          bool include_usage, const nlohmann::json* logprobs = nullptr);
std::string FinishChunkJson(const ResponseMeta& meta, int choice, const lazyattn::v1::Final& final,
                            bool include_usage);
std::string UsageChunkJson(const ResponseMeta& meta, std::span<const lazyattn::v1::Final> finals);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_RESPONSE_JSON_H_
