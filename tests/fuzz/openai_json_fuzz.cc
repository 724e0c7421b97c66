// An HTTP request body through the router's OpenAI JSON mapping (both endpoints), then what the
// server does with the outcome: the shared validator on a parsed request, the error body and SSE
// framing of any message. Nothing may crash, throw or recurse without bound (nesting is capped).
// The same bytes, as tokens a worker sent (cut at every newline), go through the log-probability
// forms, whose JSON must dump with nlohmann's strict UTF-8 check: a token's string is UTF-8
// whatever its bytes. Inputs are capped at 1 MiB.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/request_validator.h"
#include "services/router/http/error_mapping.h"
#include "services/router/http/openai_json.h"
#include "services/router/http/openai_logprobs.h"
#include "services/router/http/sse_writer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto kind : {lazyattn::router::ApiKind::kChat, lazyattn::router::ApiKind::kCompletion}) {
    auto parsed = lazyattn::router::ParseOpenAiRequest(kind, body);
    std::string message;
    if (parsed.ok()) {
      message = std::string(
          lazyattn::ValidateGenerateRequest(parsed->request, lazyattn::ApiLimits{}, 1000).message());
    } else {
      message = std::string(parsed.status().message());
    }
    message = lazyattn::router::ToHttpFieldNames(kind, message);
    const std::string error = lazyattn::router::ErrorBody(400, message, "invalid_argument");
    if (lazyattn::router::SseEvent(error).empty()) __builtin_trap();
  }
  std::vector<lazyattn::router::TokenLogprob> tokens;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    if (i == body.size() || body[i] == '\n') {
      tokens.push_back({std::string(body.substr(start, i - start)), -1.0f});
      start = i + 1;
    }
  }
  lazyattn::router::TextOffset offset;
  (void)lazyattn::router::ChatLogprobs(tokens).dump();  // throws on invalid UTF-8
  (void)lazyattn::router::CompletionLogprobs(tokens, &offset).dump();
  if (offset.characters() > static_cast<int64_t>(size)) __builtin_trap();
  return 0;
}
