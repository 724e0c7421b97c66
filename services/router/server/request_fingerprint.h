// The content fingerprint of a Generate/Complete request, the key of the query-of-death
// quarantine (services/router/policy/query_quarantine.h): the first 128 bits of SHA-256 over a
// version tag, the fingerprints of the model the request was routed for, and the request's
// deterministic protobuf serialization without its `model` field, so it covers every field that
// shapes what a worker computes (system, documents with their ids, question, chat and messages,
// sampling parameters, cache mode, the model's weights and tokenizer) and nothing else (the
// deadline and the caller's metadata are not in the message; the spelling of the model's name
// is not: `name` and `name@<fingerprint>` naming one model are one content). A request that
// crashes one model's workers is thus quarantined for that model only. The same on every
// router, so their logs name one poison request by one value. Logged as hex; never the prompt
// text.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_FINGERPRINT_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_FINGERPRINT_H_

#include "lazyattn/v1/inference.pb.h"
#include "services/router/policy/query_quarantine.h"
#include "services/router/server/model_groups.h"

namespace lazyattn::router {

// `model`: the request's chosen model (model_choice.h); null when none is known.
RequestFingerprint FingerprintOf(const lazyattn::v1::GenerateRequest& request,
                                 const ModelKey* model = nullptr);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_FINGERPRINT_H_
