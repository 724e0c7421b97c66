#include "services/router/server/prefetch_call.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/document_key.h"
#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "common/worker_call_trailer.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/policy/worker_selector.h"
#include "services/router/server/key_limits.h"
#include "services/router/server/model_choice.h"

namespace lazyattn::router {

using lazyattn::v1::PrefetchRequest;
using lazyattn::v1::PrefetchResponse;

struct PrefetchReactor::WorkerCall {
  WorkerInfo worker;
  CircuitBreakers::Permit permit;  // the worker's breaker permit the call was sent under
  absl::Time timeout_at = absl::InfiniteFuture();  // routing.prefetch_timeout_ms from its start
  std::shared_ptr<lazyattn::v1::Worker::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  PrefetchResponse response;
};

PrefetchDeadline WhichPrefetchDeadline(absl::Time timeout_at, absl::Time client_deadline) {
  return timeout_at < client_deadline ? PrefetchDeadline::kRouters : PrefetchDeadline::kClients;
}

PrefetchReactor::PrefetchReactor(RouterContext* router, grpc::CallbackServerContext* context,
                                 const PrefetchRequest* request, PrefetchResponse* response)
    : router_(router),
      context_(context),
      request_(request),
      response_(response),
      cache_namespace_(CacheNamespaceOf(*context)),
      model_metrics_(&router->metrics().NoModel()) {
  const auto model = router->registry().Model();
  absl::Status valid = ValidatePrefetchRequest(*request, router->options().limits,
                                               model.has_value() ? model->vocab_size() : 0);
  if (!valid.ok()) {
    router->metrics().CountValidationFailure(valid);
    Finish(ToGrpcStatus(valid));
    return;
  }
  // Only the chosen model's workers are warmed, with that model's document keys.
  absl::StatusOr<std::optional<ModelGroup>> chosen =
      ChooseModel(router->registry(), router->options().limits, *request);
  if (!chosen.ok()) {
    Finish(ToGrpcStatus(chosen.status()));
    return;
  }
  std::optional<ModelKey> key;
  if (chosen->has_value()) {
    key = (*chosen)->key;
    model_metrics_ = &router->metrics().ForModel((*chosen)->id);
    expected_model_ = ExpectedModelValue(key->model_fingerprint, key->tokenizer_fingerprint);
  }
  if (!router->TryAdmit()) {
    Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("router busy: ", router->options().max_inflight_requests,
                                     " requests in flight (limits.max_inflight_requests); "
                                     "retry later")));
    return;
  }
  admitted_ = true;
  worker_request_ = *request;
  worker_request_.DiscardUnknownFields();  // unchecked here, never forwarded (unknown_fields.h)
  worker_request_.set_replicas(0);
  const auto mode = request->cache_mode() == lazyattn::v1::CACHE_MODE_BLOCK
                        ? lazyattn::v1::CACHE_MODE_BLOCK
                        : lazyattn::v1::CACHE_MODE_LAZY;
  std::vector<DocumentRef> docs =
      router->DocumentRefs(request->documents(), mode, key.has_value() ? &*key : nullptr,
                           CacheScope{cache_namespace_, request->cache_salt()});
  // Mode block: where the worker places the documents (after its BOS, one after the other) is
  // not known here, so none is predicted as a hit (docs/router.md, "Predictions").
  if (mode == lazyattn::v1::CACHE_MODE_BLOCK) PlaceBlockDocuments(docs, 0, std::nullopt, {});
  router->PlanAsync(std::move(docs), [this](RoutePlan plan) { OnPlan(std::move(plan)); }, key);
}

std::vector<std::shared_ptr<PrefetchReactor::WorkerCall>> PrefetchReactor::NextCallsLocked() {
  std::vector<std::shared_ptr<WorkerCall>> out;
  const absl::Time now = MonotonicNow();
  auto& breakers = router_->selector().breakers();
  while (!cancelled_ && succeeded_ + outstanding_ < wanted_) {
    const std::optional<PlanCursor::Next> next =
        cursor_.Advance(plan_.workers.size(), /*nothing_sent=*/calls_started_ == 0);
    if (!next.has_value()) break;
    const WorkerInfo& w = plan_.workers[next->index];
    const CircuitBreakers::Permit permit = plan_.breaker_panic || next->bypass_breaker
                                               ? breakers.Bypass(w.id)
                                               : breakers.TryAcquire(w.id, now);
    if (!permit) {
      // Opened (or its probe taken) since the plan was made.
      failures_.push_back(absl::StrCat(w.id, " (", w.address, "): circuit breaker open"));
      cursor_.SetAside(next->index);
      continue;
    }
    auto stub = router_->registry().Stub(w.address, w.id);
    if (!stub.ok()) {
      breakers.Release(w.id, permit);
      failures_.push_back(absl::StrCat(w.id, " (", w.address, "): ", stub.status().message()));
      continue;
    }
    auto call = std::make_shared<WorkerCall>();
    call->worker = w;
    call->permit = permit;
    call->stub = *stub;
    call->context = grpc::ClientContext::FromCallbackServerContext(*context_);
    // The client's deadline still applies (a propagated deadline is the earlier of the two).
    const absl::Duration timeout = router_->options().routing.prefetch_timeout;
    if (timeout > absl::ZeroDuration()) {
      call->timeout_at = absl::Now() + timeout;  // a gRPC deadline: the wall clock's
      call->context->set_deadline(absl::ToChronoTime(call->timeout_at));
    }
    if (!expected_model_.empty()) call->context->AddMetadata(kExpectedModelKey, expected_model_);
    if (!cache_namespace_.empty()) {
      call->context->AddMetadata(kCacheNamespaceMetadata, cache_namespace_);
    }
    ++outstanding_;
    ++calls_started_;
    active_.push_back(call);
    out.push_back(std::move(call));
  }
  return out;
}

void PrefetchReactor::Launch(const std::vector<std::shared_ptr<WorkerCall>>& calls) {
  // Once the last call is started the reactor may finish on another thread: only locals below.
  RouterContext* const router = router_;
  const ModelMetrics& model = *model_metrics_;
  const PrefetchRequest* const request = &worker_request_;
  std::vector<DocumentRef> docs;
  {
    absl::MutexLock lock(&mu_);
    docs = plan_.docs;
  }
  for (const auto& call : calls) {
    router->metrics().CountSelection(call->worker.id, model);
    router->registry().AddInflight(call->worker, 1);
    router->selector().RecordChoice(docs, call->worker.id, MonotonicNow());
  }
  for (const auto& call : calls) {
    call->stub->async()->Prefetch(call->context.get(), request, &call->response,
                                  [this, call](grpc::Status s) { OnWorkerDone(call, s); });
  }
}

void PrefetchReactor::OnPlan(RoutePlan plan) {
  std::vector<std::shared_ptr<WorkerCall>> calls;
  std::optional<grpc::Status> nothing_started;
  {
    absl::MutexLock lock(&mu_);
    plan_ = std::move(plan);
    wanted_ = request_->replicas() == 0 ? 1 : static_cast<size_t>(request_->replicas());
    calls = NextCallsLocked();
    if (calls.empty()) nothing_started = NothingStartedStatusLocked();
  }
  if (nothing_started.has_value()) {
    Finish(*nothing_started);
    return;
  }
  Launch(calls);
}

grpc::Status PrefetchReactor::NothingStartedStatusLocked() const {
  // The client went away during the directory lookup: no worker is bothered.
  if (cancelled_) return CancelledStatus();
  // The plan named workers but none could be called (breaker opened since, no channel).
  if (!failures_.empty()) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no worker could prefetch the documents: ", absl::StrJoin(failures_, "; ")));
  }
  if (!expected_model_.empty()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "no live workers of the request's model (it was served a moment ago)");
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "no live workers: the directory lists none and no static worker is "
                      "configured");
}

void PrefetchReactor::OnWorkerDone(const std::shared_ptr<WorkerCall>& call,
                                   const grpc::Status& worker_status) {
  router_->registry().AddInflight(call->worker, -1);
  grpc::Status status = worker_status;
  // Which deadline ended the call: the earlier of ours and the client's (the worker call carries
  // the earlier one), decided by the deadlines themselves, not by the time now. Ours means the
  // worker is frozen or wedged (or the documents are more than it computes in that time): it
  // counts against the breaker, and the documents do not go to another worker, since a Prefetch
  // too large for the timeout would cost every worker the same time in turn.
  const auto client_deadline = context_->deadline();
  const bool ours_first =
      WhichPrefetchDeadline(call->timeout_at,
                            client_deadline == std::chrono::system_clock::time_point::max()
                                ? absl::InfiniteFuture()
                                : absl::FromChrono(client_deadline)) == PrefetchDeadline::kRouters;
  const bool deadline_exceeded = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (deadline_exceeded && ours_first) {
    model_metrics_->CountPrefetchTimeout();
    status = grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("no answer within ",
                     absl::ToInt64Milliseconds(router_->options().routing.prefetch_timeout),
                     " ms (routing.prefetch_timeout_ms); call cancelled"));
  }
  // The client's own deadline expiring says nothing about the worker.
  const bool client_expiry = deadline_exceeded && !ours_first;
  auto& breakers = router_->selector().breakers();
  std::vector<std::shared_ptr<WorkerCall>> more;
  std::optional<grpc::Status> final_status;
  {
    absl::MutexLock lock(&mu_);
    --outstanding_;
    active_.erase(std::find(active_.begin(), active_.end(), call));
    if (status.ok()) {
      breakers.RecordSuccess(call->worker.id, call->permit, MonotonicNow());
      ++succeeded_;
      response_->add_workers(call->worker.id);
      // Each replica's count within [0, kMaxObservedTokens] (a worker's own word): the sum over
      // the replicas must not overflow.
      const auto count = [](int64_t n) { return std::clamp<int64_t>(n, 0, kMaxObservedTokens); };
      response_->set_computed_tokens(response_->computed_tokens() +
                                     count(call->response.computed_tokens()));
      response_->set_cached_tokens(response_->cached_tokens() +
                                   count(call->response.cached_tokens()));
    } else {
      if (IsWorkerFault(status.error_code()) && !cancelled_ && !client_expiry) {
        breakers.RecordFailure(call->worker.id, call->permit, MonotonicNow());
      } else {
        breakers.Release(call->worker.id, call->permit);
      }
      last_code_ = status.error_code();
      failures_.push_back(
          absl::StrCat(call->worker.id, " (", call->worker.address, "): ", status.error_message()));
      if (IsRetryable(status.error_code())) {
        more = NextCallsLocked();
        for (size_t i = 0; i < more.size(); ++i) model_metrics_->CountRetry();
      }
    }
    if (outstanding_ == 0) {
      if (succeeded_ > 0) {
        final_status = grpc::Status::OK;
      } else if (cancelled_) {
        final_status = CancelledStatus();
      } else if (last_code_ == grpc::StatusCode::INVALID_ARGUMENT) {
        final_status = grpc::Status(last_code_, status.error_message());
      } else {
        final_status =
            grpc::Status(last_code_, absl::StrCat("no worker could prefetch the documents: ",
                                                  absl::StrJoin(failures_, "; ")));
      }
    }
  }
  if (final_status.has_value()) {
    Finish(*final_status);
  } else if (!more.empty()) {
    // Only with calls to start: with none, another worker's call may end the reactor as soon
    // as the lock above is released, and Launch reads the reactor's members.
    Launch(more);
  }
}

grpc::Status PrefetchReactor::CancelledStatus() const {
  // As ForwardingCall::ClientCancelled: a cancellation during the router's shutdown is its own.
  if (cancelled_by_shutdown_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the router is shutting down; cancelled at the end of its drain");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

void PrefetchReactor::OnCancel() {
  std::vector<std::shared_ptr<WorkerCall>> active;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    cancelled_by_shutdown_ = router_->shutting_down();
    active = active_;
  }
  for (const auto& call : active) call->context->TryCancel();
}

void PrefetchReactor::OnDone() {
  if (admitted_) router_->Release();
  delete this;
}

}  // namespace lazyattn::router
