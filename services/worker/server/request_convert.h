// The worker's side of the RPC boundary: lazyattn.v1 requests to EngineRequests, engine results to
// lazyattn.v1 messages. The worker runs the shared validator (common/request_validator.h: limits,
// ranges, UTF-8) first; conversion checks what only the wire format can get wrong (an unknown
// cache mode, a document with no content, proto defaults such as max_tokens 0) and never trusts
// that the validator ran; the engine's Prepare validates against the model (document count, token
// id ranges, context length). Every error is InvalidArgument naming the request field.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_CONVERT_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_CONVERT_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/utf8.h"  // ToValidUtf8: every generated text crosses the wire through it
#include "lazyattn/v1/inference.pb.h"
#include "services/worker/engine/request.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

struct ConvertOptions {
  int default_max_tokens = 128;  // for SamplingParams.max_tokens == 0
};

// CACHE_MODE_UNSPECIFIED means lazy (the server's default).
absl::StatusOr<CacheMode> CacheModeFromProto(int mode);

// With `chat`, system and question are placed around the documents by the model's chat template
// (BuildPrompt); InvalidArgument naming `chat` when the model has no usable template. With
// `messages`, the conversation is rendered by the template and the documents open the last user
// turn (CutChatMessages); InvalidArgument naming `messages` (or the bad turn) otherwise.
absl::StatusOr<EngineRequest> EngineRequestFromProto(const v1::GenerateRequest& request,
                                                     const Tokenizer& tokenizer,
                                                     const ModelConfig& config,
                                                     const ConvertOptions& options);

// A request that computes and caches `request.documents` without generating: an empty system
// prefix, the documents, a one-token question and max_tokens 1. Mode lazy (default) or block;
// InvalidArgument naming `cache_mode` otherwise.
absl::StatusOr<EngineRequest> PrefetchEngineRequest(const v1::PrefetchRequest& request);

void UsageToProto(const RequestUsage& usage, v1::Usage* out);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_REQUEST_CONVERT_H_
