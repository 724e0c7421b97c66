// An HTTP request body through the router's OpenAI JSON mapping (both endpoints), then what the
// server does with the outcome: the shared validator on a parsed request, the error body and SSE
// framing of any message. Nothing may crash, throw or recurse without bound (nesting is capped).
// Inputs are capped at 1 MiB.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/request_validator.h"
#include "services/router/http/error_mapping.h"
#include "services/router/http/openai_json.h"
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
  return 0;
}
