// OpenAI's JSON <-> lazyattn.v1 messages, for the router's HTTP API (docs/http-api.md).
//
// Requests: POST /v1/chat/completions bodies become a GenerateRequest with `messages` (rendered by
// the model's chat template; documents open the last user turn), /v1/completions bodies one with
// `question` = prompt and no template. Fields read: model, messages, prompt, max_tokens,
// max_completion_tokens (wins over max_tokens), temperature (default 1, as OpenAI's), top_p, seed,
// stop (string or list), n (1 to kMaxChoices), presence_penalty, frequency_penalty, user (ignored),
// stream, stream_options.include_usage, logit_bias ({"<token id>": bias} -> SamplingParams.
// logit_bias; a key is a token id in canonical decimal: digits, '-' before a negative one, no '+',
// spaces or leading zeros, within int32; a value any JSON number); the extensions documents
// [{"id", "text"}], cache_mode ("lazy", "block", "prefix", "full"), top_k, min_p and
// repetition_penalty. OpenAI fields the router does not implement are refused when set to a value
// that would change the answer, and other fields are accepted and listed in `unknown_fields`
// (openai_fields.h). Errors: InvalidArgument "<field>: <what was expected>, got <what came>" with
// the JSON field's name; what came is quoted by QuoteForMessage (a string cut short, a structure
// by its type; a number beyond a double's range, which the JSON parser refuses, as written: "n:
// 1e400 is out of range ..."); an
// error in one entry of logit_bias names the field and then the entry
// ("logit_bias: key \"7\": expected a number, got string").
// Ranges the gRPC API also checks (max_tokens limit, temperature range, ...) are left to the
// shared validator so both APIs refuse the same requests.
//
// Responses: openai_response_json.h.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_JSON_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/router/http/openai_fields.h"

namespace lazyattn::router {

struct OpenAiRequest {
  ApiKind kind = ApiKind::kChat;
  lazyattn::v1::GenerateRequest request;
  std::string model;  // as sent; empty when absent
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // OpenAI's `n`: how many completions of the prompt to return (choice_calls.h runs them).
  int choices = 1;
  std::vector<std::string> unknown_fields;  // accepted, not read (UnknownFields)
  // The field the request's max_tokens came from (max_completion_tokens wins over max_tokens),
  // and the value as sent when it is beyond int32 (the request holds int32's max, which the
  // validator refuses); empty otherwise. For messages about it (ToHttpFieldNames).
  std::string max_tokens_field = "max_tokens";
  std::string max_tokens_sent;
  // A completion's `echo: true`: each choice's text begins with the prompt (the question).
  bool echo = false;
  // `stop` came as one string (the request holds it as a list of one): messages about it name
  // `stop`, not `stop[0]` (ToHttpFieldNames).
  bool stop_string = false;
};

// Nesting deeper than this is refused before the body is parsed: a value may have at most this
// many containers (lists and objects) around it, so kMaxJsonDepth + 1 nested containers are
// refused unless the innermost is empty ("body: JSON nested deeper than 64 levels"). Brackets
// inside strings are not nesting.
inline constexpr int kMaxJsonDepth = 64;

// More lists, objects and entries than this (counted as '[', '{' and ',' outside strings) are
// refused before the body is parsed ("body: more than 65536 JSON values ..."): the parsed tree
// costs tens of bytes a value. The largest request the API takes (256 messages of text parts,
// 64 documents, 300 logit_bias entries, 16 stop strings) has a few thousand.
inline constexpr int64_t kMaxJsonElements = 65536;

// A body that is not JSON is InvalidArgument naming `body`; so is one with a raw NUL byte anywhere
// ("body: not valid JSON (a NUL byte at offset N)": JSON has no place for one, a NUL in a string
// must be escaped). Takes time linear in the body's size.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(ApiKind kind, std::string_view body);

// Rewrites a validator message that names a gRPC field ("sampling.max_tokens: ...") to the JSON
// field the HTTP client sent ("max_tokens: ..."); an entry of logit_bias is named by its key
// ("sampling.logit_bias[7]: ..." -> "logit_bias: key \"7\": ...", so `param` is logit_bias);
// other messages are returned unchanged.
std::string ToHttpFieldNames(ApiKind kind, std::string_view message);
// The same for a message about `request`: "sampling.max_tokens: ..." names the field the client
// used (max_completion_tokens or max_tokens) and quotes the value it sent, where the request
// holds a clamped one ("max_tokens: 10000000000 outside [1, 4096]", not 2147483647); a message
// about the first stop string of a `stop` sent as one string names `stop`.
std::string ToHttpFieldNames(const OpenAiRequest& request, std::string_view message);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_JSON_H_
