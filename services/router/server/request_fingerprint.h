// The content fingerprint of a Generate/Complete request, the key of the query-of-death
// quarantine (services/router/policy/query_quarantine.h): the first 128 bits of SHA-256 over a
// version tag and the request's deterministic protobuf serialization, so it covers every field
// that shapes what a worker computes (system, documents with their ids, question, chat and
// messages, sampling parameters, cache mode) and nothing else (the deadline and the caller's
// metadata are not in the message). The same on every router, so their logs name one poison
// request by one value. Logged as hex; never the prompt text.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_FINGERPRINT_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_FINGERPRINT_H_

#include "lazyattn/v1/inference.pb.h"
#include "services/router/policy/query_quarantine.h"

namespace lazyattn::router {

RequestFingerprint FingerprintOf(const lazyattn::v1::GenerateRequest& request);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_REQUEST_FINGERPRINT_H_
