// Validation and tokenization of an EngineRequest, on the submitting thread (so bad input fails
// fast with a message naming the field, and large documents do not stall the engine loop).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_REQUEST_PREP_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_REQUEST_PREP_H_

#include <string>

#include "absl/status/statusor.h"
#include "services/worker/engine/document_key_memo.h"
#include "services/worker/engine/document_token_cache.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/request.h"
#include "services/worker/model/model_config.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

struct RequestLimits {
  int max_documents = 64;
};

struct ModelIdentity {
  std::string model_fingerprint;
  std::string tokenizer_fingerprint;
};

// What preparation remembers between requests (each optional). The key memo does not know the
// ModelIdentity its keys were made with: share one only between calls with the same identity
// (an Engine has one of each).
struct PrepMemory {
  DocumentTokenCache* token_ids = nullptr;  // text documents' ids: not tokenized again
  DocumentKeyMemo* keys = nullptr;          // token-id documents' keys: not hashed again
};

// InvalidArgument naming the field: more documents than the limit, an empty document or question,
// token ids outside the vocabulary, a document or prompt longer than the model's context, bad
// sampling values.
absl::StatusOr<PreparedRequest> PrepareRequest(const EngineRequest& request,
                                               const Tokenizer& tokenizer,
                                               const ModelConfig& config,
                                               const ModelIdentity& identity,
                                               const RequestLimits& limits,
                                               const PrepMemory& memory = {});

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_REQUEST_PREP_H_
