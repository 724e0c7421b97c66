// Per-API-key request limits at the router: a request rate (token bucket) and a cap on requests
// in flight, both optional and set per key in the API key file (api_key_auth.h):
//
//   keys:
//     - name: batch-jobs
//       sha256: ...
//       scopes: [generate]
//       limits:
//         requests_per_second: 5   # token bucket refill rate; > 0
//         burst: 10                # bucket size, >= 1; default max(1, requests_per_second)
//         max_in_flight: 4         # Generate/Complete calls running at once; >= 1
//
// A call over a limit is refused with RESOURCE_EXHAUSTED naming the key's name (never the key)
// and counted in lazyattn_router_api_key_limited_total{key, limit="rate"|"in_flight"}. The rate
// applies to every call the key makes (checked in the auth processor, before any handler); the
// in-flight cap to Generate and Complete, held from admission until the call ends (KeySlot).
//
// Limits follow a reload of the key file: a key keeps its bucket and its calls in flight across a
// reload (the bucket is clipped to a smaller burst); a key whose limits are removed is unlimited
// from then on; a key removed from the file keeps its running calls, which end normally.
// Thread-safe; the limiter must outlive every KeySlot it handed out.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_KEY_LIMITS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_KEY_LIMITS_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <memory>
#include <span>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lazyattn::router {

struct KeyLimits {
  double requests_per_second = 0;  // 0: no rate limit
  double burst = 0;                // bucket size when rate-limited (>= 1)
  int max_in_flight = 0;           // 0: no cap
};

class KeyLimiter;

// One admitted call's place under its key's in-flight cap, released when destroyed. Movable;
// a default-constructed slot holds nothing.
class KeySlot {
 public:
  KeySlot() = default;
  KeySlot(KeySlot&& other) noexcept;
  KeySlot& operator=(KeySlot&& other) noexcept;
  ~KeySlot();

 private:
  friend class KeyLimiter;
  struct State;
  explicit KeySlot(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

class KeyLimiter {
 public:
  explicit KeyLimiter(prometheus::Registry& registry);

  // The limits of every key now in the file, by key name (after each successful load).
  void Configure(const absl::flat_hash_map<std::string, KeyLimits>& limits_by_name);

  // Takes one request from the key's bucket at `now`; RESOURCE_EXHAUSTED when it is empty.
  grpc::Status TakeToken(const std::string& key_name, absl::Time now);

  // A place under the key's in-flight cap; RESOURCE_EXHAUSTED when the cap is reached. An empty
  // name (no API keys configured) or a key without a cap gets an empty slot.
  grpc::Status Acquire(const std::string& key_name, KeySlot* slot);
  // slots.size() >= 1 places at once, together with another limit's: `and_then` is called
  // while the key's places are reserved under the limiter's lock (it must not call back into
  // the limiter), and the places are kept only if it returns OK. Else its status (or the key's
  // RESOURCE_EXHAUSTED) with `slots` untouched: a request that needs several places (an HTTP
  // request with OpenAI's `n`) or is refused by the other limit never holds any of the key's,
  // even for a moment in which a concurrent request of the key could be refused.
  grpc::Status Acquire(const std::string& key_name, std::span<KeySlot> slots,
                       absl::FunctionRef<grpc::Status()> and_then);

  // Calls of `key_name` holding a slot now (tests, diagnostics).
  int InFlight(const std::string& key_name);
  // The key's limits.max_in_flight; 0 when it has none (or is unknown).
  int MaxInFlight(const std::string& key_name);

 private:
  struct Key;
  prometheus::Family<prometheus::Counter>& limited_family_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Key>> keys_ ABSL_GUARDED_BY(mu_);
};

// The name of the API key the auth processor admitted this call with; "" without API keys.
std::string ApiKeyNameOf(const grpc::ServerContextBase& context);
// That key's cache namespace (api_key_auth.h); "" without API keys.
std::string CacheNamespaceOf(const grpc::ServerContextBase& context);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_KEY_LIMITS_H_
