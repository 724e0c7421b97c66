#include "services/router/http/choice_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "services/router/server/admission.h"

namespace lazyattn::router {

absl::StatusOr<std::unique_ptr<ChoiceCalls>> ChoiceCalls::Start(
    RouterContext* router, KeyLimiter* key_limiter, const ApiCaller& caller,
    const lazyattn::v1::GenerateRequest& request, int choices, absl::Time deadline, bool stream,
    const std::string& request_id, std::shared_ptr<LiveCalls> live) {
  const std::string& key_name = caller.key_name;
  // More choices than a cap has places could never be admitted, however often retried: not a
  // 429.
  const int limit = router->options().max_inflight_requests;
  const int key_cap = key_limiter != nullptr ? key_limiter->MaxInFlight(key_name) : 0;
  if (choices > 1 && (choices > limit || (key_cap > 0 && choices > key_cap))) {
    router->metrics().CountRequest(grpc::StatusCode::INVALID_ARGUMENT);
    return absl::InvalidArgumentError(
        choices > limit
            ? absl::StrCat("n: ", choices,
                           " choices need as many places in flight; the router admits at most ",
                           limit, " (limits.max_inflight_requests)")
            : absl::StrCat("n: ", choices, " choices need as many places in flight; the API key \"",
                           key_name, "\" takes at most ", key_cap, " (its limits.max_in_flight)"));
  }
  // Every choice's places at once, so that a refusal starts nothing and holds nothing. The
  // request is validated once: the choices differ only in their seeds.
  std::vector<AdmissionTicket> tickets(choices);
  if (const grpc::Status s = AdmitRequest(router, key_limiter, key_name, request, tickets);
      !s.ok()) {
    if (choices > 1 && s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("n: ", choices, " choices refused together: ", s.error_message()));
    }
    return FromGrpcStatus(s);
  }
  std::unique_ptr<ChoiceCalls> calls(new ChoiceCalls());
  calls->choices_.reserve(choices);
  for (int i = 0; i < choices; ++i) {
    lazyattn::v1::GenerateRequest copy = request;
    if (copy.sampling().has_seed()) {
      copy.mutable_sampling()->set_seed(copy.sampling().seed() + static_cast<uint64_t>(i));
    }
    calls->choices_.push_back(Choice{HttpCall::Start(
        std::move(tickets[i]), router, std::move(copy), absl::ToChronoTime(WallTimeOf(deadline)),
        stream, caller.cache_namespace, request_id, live, calls->ready_)});
  }
  return calls;
}

ChoiceCalls::~ChoiceCalls() { CancelAll(); }

HttpCall::Event::Kind ChoiceCalls::Next(int* choice, HttpCall::Event* event,
                                        absl::Duration timeout) {
  const absl::Time until = MonotonicNow() + timeout;
  const int n = size();
  while (true) {
    // Read before polling: an event that becomes ready after its call was polled changes it.
    const uint64_t seen = ready_->generation();
    for (int k = 0; k < n; ++k) {
      const int i = (next_poll_ + k) % n;
      Choice& c = choices_[i];
      if (c.ended || c.holding) continue;
      const HttpCall::Event::Kind kind = c.call->Next(event, absl::ZeroDuration());
      if (kind == HttpCall::Event::kTimeout) continue;
      if (kind == HttpCall::Event::kToken) {
        c.holding = true;
      } else {
        c.ended = true;
        ++ended_;
      }
      next_poll_ = (i + 1) % n;
      *choice = i;
      return kind;
    }
    const absl::Duration left = until - MonotonicNow();
    if (left <= absl::ZeroDuration()) return HttpCall::Event::kTimeout;
    ready_->WaitForChange(seen, left);
  }
}

void ChoiceCalls::Consumed(int choice, bool ok) {
  Choice& c = choices_[choice];
  if (!c.holding) return;
  c.holding = false;
  c.call->Consumed(ok);
}

void ChoiceCalls::CancelAll(const grpc::Status& why) {
  for (Choice& c : choices_) {
    // Released before the cancel, as a single call's handler does: the call is waiting for it.
    // The release cancels the worker call: the reason is set first.
    c.call->SetCancelStatus(why);
    if (c.holding) {
      c.holding = false;
      c.call->Consumed(false);
    }
    c.call->Cancel(why);
  }
}

}  // namespace lazyattn::router
