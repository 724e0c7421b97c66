// The trailing metadata a worker adds to every Worker.Generate call it ends itself, whatever the
// status. The router tells a worker's own UNAVAILABLE (draining, not serving) from a connection
// lost mid-call (the worker process died while it held the request: no trailers arrive) by it,
// which is what its query-of-death quarantine counts (docs/router.md, Failures).
#ifndef LAZYATTN_COMMON_WORKER_CALL_TRAILER_H_
#define LAZYATTN_COMMON_WORKER_CALL_TRAILER_H_

namespace lazyattn {

inline constexpr char kWorkerEndedCallKey[] = "lazyattn-worker-ended";
inline constexpr char kWorkerEndedCallValue[] = "1";

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_WORKER_CALL_TRAILER_H_
