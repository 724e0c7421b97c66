// Validation of public requests at the router, before any routing: a bad request costs no worker
// time and gets INVALID_ARGUMENT naming the field ("documents[3].text: empty document"). The
// worker validates again against its model (context length, vocabulary); the router checks what it
// can without a tokenizer: counts, sizes, ranges and enum values.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_VALIDATOR_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_VALIDATOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "lazyattn/v1/inference.pb.h"

namespace lazyattn::router {

struct RequestLimits {
  int max_documents = 64;
  int64_t max_document_bytes = 1 << 20;  // text documents
  int64_t max_document_tokens = 131072;  // token documents
  int64_t max_document_id_bytes = 256;
  int64_t max_system_bytes = 64 << 10;
  int64_t max_question_bytes = 64 << 10;
  int max_tokens = 4096;  // sampling.max_tokens in [0, max_tokens]
  int max_stop_strings = 16;
  int64_t max_stop_bytes = 256;
  int max_stop_token_ids = 64;
  int max_prefetch_replicas = 64;
};

// vocab_size: the served model's vocabulary when known (token ids are checked against it), or 0.
absl::Status ValidateGenerateRequest(const lazyattn::v1::GenerateRequest& request,
                                     const RequestLimits& limits, int64_t vocab_size);
absl::Status ValidatePrefetchRequest(const lazyattn::v1::PrefetchRequest& request,
                                     const RequestLimits& limits, int64_t vocab_size);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_VALIDATOR_H_
