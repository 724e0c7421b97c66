// One Generate or Complete call at the router: route, forward to a worker's Worker.Generate with
// the callback client API, relay its tokens, fail over.
//
// Flow: Begin() -> PlanAsync (kvdir lookup, <= lookup_timeout) -> attempt on the best worker ->
// each token is handed to the sink (DeliverToken); the next read from the worker starts only when
// the sink is done with it (ClientWriteDone), so a slow client slows its own worker stream through
// gRPC flow control and the router buffers at most one message per call.
//
// Failover: a worker that fails before its first token (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED;
// connection failures are UNAVAILABLE) is replaced by the next worker of the plan, up to
// routing.max_attempts, while the router's retry budget allows (retry_budget.h). After tokens
// reached the client, a failure ends the call with UNAVAILABLE saying so (a unary Complete has sent
// nothing yet, so it may still fail over). Final.worker and Final.attempts are filled in by the
// router.
//
// First-token timeout: an attempt that has sent no token within routing.first_token_timeout (a
// frozen or wedged worker) is cancelled; it counts against the worker's breaker and the request
// fails over like an UNAVAILABLE attempt.
//
// Cancellation and deadlines: each worker call's ClientContext is made from the server context, so
// the client's deadline propagates; its cancellation reaches the worker call through OnCancel
// (ClientCancelled), which marks the call cancelled first, so that the attempt's CANCELLED is
// never taken for the worker's failure.
// A call that ends unsuccessfully once the client's deadline has passed (give or take the skew of
// the worker's clock) ends, and is counted, as DEADLINE_EXCEEDED, however the expiry reached us
// (our own cancellation, the worker's DEADLINE_EXCEEDED, a failover cut short).
//
// Query-of-death quarantine (query_quarantine.h): an attempt whose worker connection was lost
// mid-call (the worker's initial metadata came, then it ended UNAVAILABLE without the trailer a
// worker adds to every call it ends itself: common/worker_call_trailer.h) is reported under the
// request's content fingerprint. When that quarantines it, the call is not retried and ends
// FAILED_PRECONDITION; a request whose fingerprint is quarantined is refused before routing.
//
// Lifetime: the reactor (subclass) deletes itself in OnDone, which gRPC runs only after Finish;
// DeliverEnd (which calls Finish) runs only after the lookup callback and the current attempt's
// OnDone, so no callback outlives the call. Attempts are shared_ptr-owned (they keep themselves
// until their OnDone) so a concurrent Cancel never touches a freed attempt.
//
// Lock order: ForwardingCall::mu_, then the components' own locks (registry, breakers, metrics).
// gRPC operations (StartRead/StartWrite/Finish/TryCancel) are never started under mu_.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_FORWARDING_CALL_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_FORWARDING_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/policy/query_quarantine.h"
#include "services/router/server/plan_cursor.h"
#include "services/router/server/router_context.h"
#include "services/router/server/worker_attempt.h"

namespace lazyattn::router {

class ForwardingCall {
 public:
  virtual ~ForwardingCall() = default;

 protected:
  ForwardingCall(RouterContext* router, grpc::CallbackServerContext* server_context,
                 const lazyattn::v1::GenerateRequest* request);
  // A call from outside gRPC (the HTTP API): no server context to propagate; every worker call
  // gets `deadline`, and the caller cancels through ClientCancelled. `cache_namespace`: the API
  // key's (empty without keys), which a gRPC call's server context carries. `request_id`: what
  // the caller logs and answers the request under (AdoptRequestId), sent to the worker.
  // `request` may be a member of the derived call, not yet built here: the constructor only keeps
  // the pointer. It is forwarded as it is (no unknown fields: it was built, not parsed).
  ForwardingCall(RouterContext* router, std::chrono::system_clock::time_point deadline,
                 const lazyattn::v1::GenerateRequest* request, std::string cache_namespace,
                 std::string request_id);

  // Validation and admission passed: route and forward. Called once.
  void Begin();
  // The sink finished with the last token (ok: it reached the client's stream).
  void ClientWriteDone(bool ok);
  void ClientCancelled();
  // How a cancellation by the caller (ClientCancelled, a failed client write) ends the call, in
  // the access log and the request metrics: CANCELLED "cancelled by the client" unless set. The
  // HTTP API sets the router's shutdown or its own request deadline when those are the cause.
  // The first reason set stands: later ones come from cleanups of the same cancellation.
  void SetCancelStatus(grpc::Status why);
  // For ClientWriteWatch::Watch: a cut for a client that stopped reading is logged as the
  // router's (CANCELLED, naming the limit), not as "cancelled by the client".
  std::function<void(const char* limit)> CutByTheRouter() {
    return [this](const char* limit) {
      SetCancelStatus(grpc::Status(
          grpc::StatusCode::CANCELLED,
          absl::StrCat("cut by the router: the client did not read its answer within ", limit)));
    };
  }

  // Sink: hand one token message to the client, then call ClientWriteDone.
  virtual void DeliverToken(const lazyattn::v1::GenerateResponse& token) = 0;
  // Sink: end the call; `final` is set exactly when status is OK. Must be the sink's last act.
  virtual void DeliverEnd(const grpc::Status& status, const lazyattn::v1::Final* final) = 0;
  // Whether delivered tokens are visible to the client (stream) or buffered (unary).
  virtual bool StreamsToClient() const = 0;
  // A buffering sink drops what it collected from a failed attempt.
  virtual void DiscardPartial() {}

  RouterContext* router() const { return router_; }
  const std::string& request_id() const { return request_id_; }

 private:
  friend class WorkerAttempt;

  void OnPlan(RoutePlan plan);
  void StartNextAttempt();
  // Appends to the plan the workers it left out that are live now (ejected or behind an open
  // breaker when it was made, or listed since), so a request whose planned workers all failed
  // tries a worker that recovered meanwhile before it gives up; false when none. Each worker is
  // in the plan at most once, so a call extends it a bounded number of times.
  bool AddWorkersLeftOutOfThePlan(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWorkerMessage(WorkerAttempt* attempt, const lazyattn::v1::GenerateResponse& message);
  // The status an attempt's end stands for (forwarding_call_attempt_end.cc): the worker's,
  // or UNAVAILABLE naming a broken stream protocol or a timeout (counted and logged), or OK when
  // the worker sent its whole answer but did not end its call (counted as a protocol error).
  grpc::Status JudgeAttemptEnd(WorkerAttempt* attempt, const grpc::Status& worker_status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnAttemptDone(WorkerAttempt* attempt, const grpc::Status& status);
  void End(grpc::Status status, std::optional<lazyattn::v1::Final> final);
  void LogAccess(const grpc::Status& status, const lazyattn::v1::Final* final)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request's content fingerprint, computed once (SHA-256 of the request) on first use.
  const RequestFingerprint& Fingerprint();
  grpc::Status ExhaustedStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The context of a worker call: the server context's deadline and cancellation, or deadline_.
  std::unique_ptr<grpc::ClientContext> NewWorkerContext() const;

  RouterContext* const router_;
  grpc::CallbackServerContext* const server_context_;  // null for calls from outside gRPC
  // The client's x-request-id when valid, else a fresh one; sent to the worker and the client.
  const std::string request_id_;
  // The API key's cache namespace: sent to every worker call (kCacheNamespaceMetadata) and, with
  // the request's cache_salt, the scope its documents are looked up under.
  const std::string cache_namespace_;
  const std::chrono::system_clock::time_point deadline_;  // the client's
  // The client's request without fields this router does not know (unknown_fields.h): the
  // request itself, or a copy in known_fields_copy_ when a gRPC client's had any (the HTTP
  // front's requests, built from JSON, have none). Declared in this order.
  std::unique_ptr<lazyattn::v1::GenerateRequest> known_fields_copy_;
  const lazyattn::v1::GenerateRequest* const request_;
  const absl::Time started_;
  std::once_flag fingerprint_once_;
  RequestFingerprint fingerprint_;  // written once under fingerprint_once_
  // The request's model (model_choice.h), chosen in Begin before anything else reads it; unset
  // when no worker has reported a model. Plans hold only its workers.
  std::optional<ModelKey> model_;
  // The per-request metrics of model_ (its id as chosen), set with it; NoModel() until then and
  // when no model is chosen, so refusals before the choice count under "none".
  ModelMetrics* model_metrics_;

  absl::Mutex mu_;
  RoutePlan plan_ ABSL_GUARDED_BY(mu_);
  PlanCursor cursor_ ABSL_GUARDED_BY(mu_);
  // How many of plan_.workers the routing plan ranked; those after them were appended by
  // AddWorkersLeftOutOfThePlan (no directory lookup, and never under the plan's breaker panic).
  size_t ranked_workers_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether current_predicted_hits_ came from the ranked plan (else it is left out of the
  // prediction metrics).
  bool current_prediction_ranked_ ABSL_GUARDED_BY(mu_) = true;
  // What the plan predicted for the current attempt's worker.
  int64_t current_predicted_hits_ ABSL_GUARDED_BY(mu_) = 0;
  // ... and the directory's claims there when the prediction is those alone, else -1.
  int64_t current_claimed_tokens_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t current_claimed_copy_tokens_ ABSL_GUARDED_BY(mu_) = -1;  // ... of which copyable
  // The last attempt's worker ended it before any work (WorkerAttempt::HandedBack).
  bool last_attempt_handed_back_ ABSL_GUARDED_BY(mu_) = false;
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<WorkerAttempt> current_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;  // delivered from the current attempt
  // Their text: the Final's text (bounded by the stream's checks, worker_stream_check.h).
  std::string streamed_text_ ABSL_GUARDED_BY(mu_);
  std::optional<lazyattn::v1::Final> final_ ABSL_GUARDED_BY(mu_);
  grpc::StatusCode last_code_ ABSL_GUARDED_BY(mu_) = grpc::StatusCode::UNAVAILABLE;
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
  // This request in the retry budget's count until it ends, and its failover attempt when one
  // runs (one slot for all of its failovers: they run one at a time).
  RetryBudget::RequestSlot budget_request_ ABSL_GUARDED_BY(mu_);
  RetryBudget::RetrySlot budget_retry_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status cancel_status_ ABSL_GUARDED_BY(mu_) = grpc::Status(grpc::StatusCode::CANCELLED,
                                                                  "cancelled by the client");
  bool cancel_status_set_ ABSL_GUARDED_BY(mu_) = false;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time first_token_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // any attempt's
  std::string last_worker_ ABSL_GUARDED_BY(mu_);  // of the latest attempt (access log)
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // An end that arrived while a write was in flight; delivered from ClientWriteDone.
  std::optional<std::pair<grpc::Status, std::optional<lazyattn::v1::Final>>> deferred_end_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_FORWARDING_CALL_H_
