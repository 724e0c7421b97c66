// Metadata between the router and a worker. The trailing metadata a worker adds to every
// Worker.Generate call it ends itself, whatever the status. The router tells a worker's own UNAVAILABLE (draining, not serving) from a connection
// lost mid-call (the worker process died while it held the request: no trailers arrive) by it,
// which is what its query-of-death quarantine counts (docs/router.md, Failures).
#ifndef LAZYATTN_COMMON_WORKER_CALL_TRAILER_H_
#define LAZYATTN_COMMON_WORKER_CALL_TRAILER_H_

#include <string>
#include <string_view>

namespace lazyattn {

inline constexpr char kWorkerEndedCallKey[] = "lazyattn-worker-ended";
inline constexpr char kWorkerEndedCallValue[] = "1";

// Added beside it when the worker did no work for the request (refused while draining, or handed
// back by a drain before it started: no token computed, none sent). The router fails such a call
// over without drawing on its retry budget: the request moves, nothing is computed twice.
inline constexpr char kWorkerHandedBackKey[] = "lazyattn-handed-back";
inline constexpr char kWorkerHandedBackValue[] = "1";

// Request metadata the router adds to Worker.Generate and Worker.Prefetch: the model it routed
// the call for, as ExpectedModelValue(model_fingerprint, tokenizer_fingerprint). A worker holding
// other weights (restarted with a new model at the same address since the router's last listing)
// refuses the call with UNAVAILABLE, which the router fails over, so a request never runs on a
// model it was not routed for. Absent (a client calling the worker directly): no check.
inline constexpr char kExpectedModelKey[] = "lazyattn-expected-model";

// Request metadata the router adds to Worker.Generate: send PrefillProgress events
// (inference.proto) while the prompt is computed, at most one per kPrefillProgressInterval, so the
// router's first-token timeout (routing.first_token_timeout_ms) cuts only attempts that show no
// sign of life, not a long prompt on a slow backend. Absent (a client calling the worker
// directly): none are sent.
inline constexpr char kPrefillProgressKey[] = "lazyattn-prefill-progress";
inline constexpr char kPrefillProgressValue[] = "1";
inline constexpr int kPrefillProgressIntervalMs = 250;

inline std::string ExpectedModelValue(std::string_view model_fingerprint,
                                      std::string_view tokenizer_fingerprint) {
  std::string v(model_fingerprint);
  v += '/';
  v += tokenizer_fingerprint;
  return v;
}

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_WORKER_CALL_TRAILER_H_
