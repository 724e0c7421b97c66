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

// Tokenization by mode:
// - block, lazy: each part alone -- the system prefix (special tokens parsed, BOS when the model
//   wants it), each text document (special-token text literal), the question (special tokens
//   parsed) -- because each document's KV is computed and cached on its own; a word never spans a
//   document boundary.
// - full, prefix: the model reads one sequence, so it is the tokenization of the whole rendered
//   prompt (system prefix + documents + question as one text, Tokenizer::EncodeParts), exactly as
//   HF and llama.cpp tokenize the chat template's output. Each token is stored in the part that
//   holds its last byte, so concatenating system_prefix, the documents' tokens and question gives
//   that sequence; a document whose bytes all merged into a later token has no tokens there
//   (usage.document_tokens counts by the same rule). Token-id documents and question_token_ids
//   cannot be re-tokenized: they stay as given and the text on each side of them is tokenized as
//   its own whole.
// Validation is the same in every mode and looks at each part tokenized alone.
//
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
