// A request the worker ends before doing any work for it: refused while draining, or handed back
// by a drain while it still waited for tokenization or admission (no token computed, none sent).
// Its call ends with the status given here plus the trailing metadata kWorkerHandedBackKey
// (common/worker_call_trailer.h), from which a router knows that running it elsewhere moves work
// rather than repeats it, so that failover does not draw on its retry budget.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_HANDED_BACK_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_HANDED_BACK_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace lazyattn {

// The status payload that marks it on its way through the engine.
inline constexpr char kHandedBackPayload[] = "lazyattn.worker/handed-back";

inline absl::Status HandedBack(absl::Status status) {
  status.SetPayload(kHandedBackPayload, absl::Cord("1"));
  return status;
}

inline bool IsHandedBack(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kHandedBackPayload).has_value();
}

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_HANDED_BACK_H_
