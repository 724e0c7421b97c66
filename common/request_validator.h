// Validation of lazyattn.v1 requests, shared by the router (before any routing) and the worker
// (which is reachable directly and must not trust its caller): counts, sizes, ranges, enum values
// and UTF-8 of every text field. A bad request gets InvalidArgument whose message starts with the
// field ("documents[3].text: empty document"), so a caller can act on it. The worker validates
// again against its model afterwards (context length, chat template), which needs a tokenizer.
//
// Text fields are proto `bytes` (see inference.proto): their UTF-8 is checked here, not by the
// protobuf parser, so invalid text is an InvalidArgument naming the field rather than a message
// the parser refuses without saying why.
#ifndef LAZYATTN_COMMON_REQUEST_VALIDATOR_H_
#define LAZYATTN_COMMON_REQUEST_VALIDATOR_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/yaml_config.h"
#include "lazyattn/v1/inference.pb.h"

namespace lazyattn {

// Limits on one request; the router and the workers of a cluster should be given the same ones
// (YAML keys `limits.*`, see ApiLimitsFromYaml).
struct ApiLimits {
  int max_documents = 64;
  int64_t max_document_bytes = 1 << 20;  // text documents
  int64_t max_document_tokens = 131072;  // token documents
  int64_t max_document_id_bytes = 256;
  int64_t max_system_bytes = 64 << 10;
  int64_t max_question_bytes = 64 << 10;  // also each chat message's content
  int max_messages = 256;                   // turns of a multi-turn request
  int max_tokens = 4096;  // sampling.max_tokens in [0, max_tokens]
  int max_stop_strings = 16;
  int64_t max_stop_bytes = 256;
  int max_stop_token_ids = 64;
  int max_logit_bias = 300;  // sampling.logit_bias entries
  int max_prefetch_replicas = 64;
};

// GenerateRequest.cache_salt and PrefetchRequest.cache_salt: any bytes, at most this many.
inline constexpr int64_t kMaxCacheSaltBytes = 1024;

// vocab_size: the served model's vocabulary when known (token ids are checked against it), or 0.
// OK, or InvalidArgument "<field>: <what is wrong>". A multi-turn request (`messages`) has roles
// system (first only), user and assistant, ends with a user turn, and leaves system and question
// empty.
absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request, const ApiLimits& limits,
                                     int64_t vocab_size);
absl::Status ValidatePrefetchRequest(const v1::PrefetchRequest& request, const ApiLimits& limits,
                                     int64_t vocab_size);

// The text fields whose UTF-8 is checked, as metric labels (indices dropped: low cardinality).
inline constexpr std::array<const char*, 6> kTextFieldLabels = {
    "system", "question", "documents.id", "documents.text", "sampling.stop", "messages.content"};

// When `status` came from one of the validators above because a text field is not UTF-8: that
// field's label (one of kTextFieldLabels). nullopt for any other status.
std::optional<std::string> InvalidUtf8FieldLabel(const absl::Status& status);

// Reads the `limits.*` keys of ApiLimits (names as the fields: limits.max_documents, ...;
// defaults from `defaults`). InvalidArgument naming the key for a wrong type or a value out of
// range.
absl::StatusOr<ApiLimits> ApiLimitsFromYaml(const YamlConfig& config,
                                            const ApiLimits& defaults = {});

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_REQUEST_VALIDATOR_H_
