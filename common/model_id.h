// The `model` field of GenerateRequest and PrefetchRequest: its form, how error messages quote
// it, and the `name@P[.T]` form that selects a model by fingerprint prefixes. The router resolves
// the field among the models it serves (services/router/server/model_groups.h); a worker checks
// it against the one model it serves (services/worker/server/requested_model.h). Both read the
// field through these functions, so a worker never refuses a value a router accepts.
#ifndef LAZYATTN_COMMON_MODEL_ID_H_
#define LAZYATTN_COMMON_MODEL_ID_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace lazyattn {

// Longest `model` accepted (inference.proto states the same bound).
inline constexpr size_t kMaxModelBytes = 256;

// OK when `requested` is at most kMaxModelBytes of valid UTF-8; otherwise InvalidArgument whose
// message starts with "model: ".
absl::Status CheckModelField(std::string_view requested);

// The client's value as error messages quote it: in double quotes, at most 64 bytes, cut at a
// UTF-8 boundary (the message may end up in JSON) and marked "..." when cut.
std::string QuoteModelValue(std::string_view value);

// `name@P` or `name@P.T`, split at the last '@' (a name may hold one itself) and at the first '.'
// after it. The views point into the parsed string.
struct FingerprintSelector {
  std::string_view name;
  std::string_view model_prefix;      // P, never empty
  std::string_view tokenizer_prefix;  // T, empty when absent
};

// The selector `requested` spells, or nullopt when it holds no '@' or P is empty.
std::optional<FingerprintSelector> ParseFingerprintSelector(std::string_view requested);

// Whether the model with these fingerprints is selected by `selector` (its name is compared by
// the caller): P a prefix of `model_fingerprint` and T of `tokenizer_fingerprint`, case
// insensitive.
bool SelectsFingerprints(const FingerprintSelector& selector, std::string_view model_fingerprint,
                         std::string_view tokenizer_fingerprint);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_MODEL_ID_H_
