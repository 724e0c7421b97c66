#include "services/router/server/key_limits.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/router/server/api_key_auth.h"

namespace lazyattn::router {

struct KeySlot::State {
  std::atomic<int> in_flight{0};
};

KeySlot::KeySlot(KeySlot&& other) noexcept : state_(std::move(other.state_)) {}

KeySlot& KeySlot::operator=(KeySlot&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) state_->in_flight.fetch_sub(1);
    state_ = std::move(other.state_);
  }
  return *this;
}

KeySlot::~KeySlot() {
  if (state_ != nullptr) state_->in_flight.fetch_sub(1);
}

// A key's limits and bucket, kept by name across reloads (guarded by KeyLimiter::mu_). The
// in-flight count lives in a State the slots share, so a slot outliving a reload still releases
// into the same count.
struct KeyLimiter::Key {
  KeyLimits limits;
  double tokens = 0;
  absl::Time refilled = absl::InfinitePast();
  std::shared_ptr<KeySlot::State> slots = std::make_shared<KeySlot::State>();
  prometheus::Counter* rate_limited = nullptr;
  prometheus::Counter* in_flight_limited = nullptr;
};

KeyLimiter::KeyLimiter(prometheus::Registry& registry)
    : limited_family_(prometheus::BuildCounter()
                          .Name("lazyattn_router_api_key_limited_total")
                          .Help("Calls refused RESOURCE_EXHAUSTED by a per-key limit of the API key "
                                "file, by key name and limit (rate, in_flight)")
                          .Register(registry)) {}

void KeyLimiter::Configure(const absl::flat_hash_map<std::string, KeyLimits>& limits_by_name) {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Key>> next;
  for (const auto& [name, limits] : limits_by_name) {
    std::shared_ptr<Key> key;
    if (auto it = keys_.find(name); it != keys_.end()) {
      key = it->second;
    } else {
      key = std::make_shared<Key>();
      key->tokens = limits.burst;  // a new key starts with a full bucket
      key->rate_limited = &limited_family_.Add({{"key", name}, {"limit", "rate"}});
      key->in_flight_limited = &limited_family_.Add({{"key", name}, {"limit", "in_flight"}});
    }
    if (key->limits.requests_per_second <= 0 && limits.requests_per_second > 0) {
      key->tokens = limits.burst;  // a rate newly set starts full, as for a new key
      key->refilled = absl::InfinitePast();
    }
    key->limits = limits;
    key->tokens = std::min(key->tokens, limits.burst);
    next.emplace(name, std::move(key));
  }
  keys_ = std::move(next);
}

grpc::Status KeyLimiter::TakeToken(const std::string& key_name, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key_name);
  if (it == keys_.end()) return grpc::Status::OK;
  Key& key = *it->second;
  const double rate = key.limits.requests_per_second;
  if (rate <= 0) return grpc::Status::OK;
  if (key.refilled != absl::InfinitePast() && now > key.refilled) {
    key.tokens =
        std::min(key.limits.burst, key.tokens + absl::ToDoubleSeconds(now - key.refilled) * rate);
  }
  key.refilled = std::max(key.refilled, now);
  if (key.tokens >= 1) {
    key.tokens -= 1;
    return grpc::Status::OK;
  }
  key.rate_limited->Increment();
  return grpc::Status(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      absl::StrFormat("API key \"%s\": over its request rate (limits.requests_per_second %g, "
                      "burst %g); retry later",
                      key_name, rate, key.limits.burst));
}

grpc::Status KeyLimiter::Acquire(const std::string& key_name, KeySlot* slot) {
  return Acquire(key_name, std::span<KeySlot>(slot, 1), [] { return grpc::Status::OK; });
}

grpc::Status KeyLimiter::Acquire(const std::string& key_name, std::span<KeySlot> slots,
                                 absl::FunctionRef<grpc::Status()> and_then) {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key_name);
  if (it == keys_.end()) return and_then();
  Key& key = *it->second;
  const int cap = key.limits.max_in_flight;
  if (cap <= 0) return and_then();
  const int want = static_cast<int>(slots.size());
  // Slots only ever decrement without the lock, so a count read here can only be high, never low.
  const int held = key.slots->in_flight.load();
  if (held + want > cap) {
    key.in_flight_limited->Increment();
    const int over = held + want - cap;
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        want == 1 ? absl::StrCat("API key \"", key_name, "\": ", cap,
                                 " requests in flight, its limits.max_in_flight; retry when one "
                                 "has ended")
                  : absl::StrCat("API key \"", key_name, "\": ", held,
                                 held == 1 ? " request" : " requests", " in flight, ", want,
                                 " more would pass its limits.max_in_flight of ", cap,
                                 "; retry when ", over, over == 1 ? " has" : " have", " ended"));
  }
  // Reserved while the other limit decides: nothing else of this key can pass meanwhile.
  if (grpc::Status s = and_then(); !s.ok()) return s;
  key.slots->in_flight.fetch_add(want);
  for (KeySlot& slot : slots) slot = KeySlot(key.slots);
  return grpc::Status::OK;
}

int KeyLimiter::InFlight(const std::string& key_name) {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key_name);
  return it == keys_.end() ? 0 : it->second->slots->in_flight.load();
}

int KeyLimiter::MaxInFlight(const std::string& key_name) {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(key_name);
  return it == keys_.end() ? 0 : std::max(it->second->limits.max_in_flight, 0);
}

namespace {

std::string AuthProperty(const grpc::ServerContextBase& context, const char* name) {
  const auto auth = context.auth_context();
  if (auth == nullptr) return "";
  for (const grpc::string_ref& v : auth->FindPropertyValues(name)) {
    return std::string(v.data(), v.size());
  }
  return "";
}

}  // namespace

std::string ApiKeyNameOf(const grpc::ServerContextBase& context) {
  return AuthProperty(context, kApiKeyNameProperty);
}

std::string CacheNamespaceOf(const grpc::ServerContextBase& context) {
  return AuthProperty(context, kCacheNamespaceProperty);
}

}  // namespace lazyattn::router
