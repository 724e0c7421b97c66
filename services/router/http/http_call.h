// One HTTP completion request on the router's own routing path: a ForwardingCall (the same code
// that serves Inference.Generate/Complete: validation, kvdir lookup, worker choice, failover,
// metrics) whose sink hands tokens to the HTTP handler's thread instead of a gRPC stream.
//
//   AdmissionTicket ticket;  // AdmitRequest(...) filled it
//   auto call = HttpCall::Start(std::move(ticket), router, std::move(request), deadline, stream);
//   HttpCall::Event e;
//   while (call->Next(&e) == HttpCall::Event::kToken) { write e.token ...; call->Consumed(ok); }
//   // e.status, e.final: the end
//
// Flow control as in gRPC: the worker's next message is read only after Consumed(), so a slow
// HTTP client slows its own worker stream and the call buffers at most one token.
// Streaming (`stream`): tokens are delivered as they come and a failure after the first token
// ends the call (no failover: output was sent). Not streaming: tokens are collected here and the
// call may still fail over after partial output (as Complete does); Next() returns only the end,
// with the whole text in Event::final.
// Lifetime: shared_ptr; the call also keeps itself alive until the ForwardingCall ends, so the
// handler may drop it at any time (Cancel() first, or the worker stream runs to its end).
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_CALL_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_CALL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/router/http/openai_logprobs.h"
#include "services/router/server/admission.h"
#include "services/router/server/forwarding_call.h"
#include "services/router/server/key_limits.h"
#include "services/router/server/router_context.h"

namespace lazyattn::router {

// Counts the HTTP calls alive (from Start until the call, its ForwardingCall included, has been
// destroyed), so the server's shutdown can wait until none touches the RouterContext any more.
class LiveCalls {
 public:
  void Add();
  void Remove();
  // True when the count reached zero within `timeout`.
  bool WaitForZero(absl::Duration timeout);
  int count();

 private:
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Wakes a handler that waits on several calls at once (the choices of one request with n > 1,
// choice_calls.h): every call sharing the signal bumps its generation when it has a token or its
// end ready, so a waiter that read the generation before polling the calls misses no event.
class ReadySignal {
 public:
  void Notify();
  uint64_t generation();
  // Waits until the generation differs from `seen`, at most `timeout`.
  void WaitForChange(uint64_t seen, absl::Duration timeout);

 private:
  absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

class HttpCall final : public ForwardingCall {
 public:
  struct Event {
    enum Kind { kToken, kEnd, kTimeout };
    lazyattn::v1::TokenChunk token;            // kToken
    grpc::Status status;                       // kEnd
    std::optional<lazyattn::v1::Final> final;  // kEnd with OK status
    // kEnd, not streaming: the tokens' log probabilities (with their alternatives) when the
    // request asked for them.
    std::vector<TokenLogprob> logprobs;
  };

  // Starts a request that AdmitRequest (admission.h: validation, the served model's document
  // limit, the API key's in-flight cap, the router's in-flight limit) admitted: `admitted` holds
  // its places, given back when the call ends. `live` (may be null) counts the call until it is
  // destroyed; `ready` (may be null) is notified whenever an event becomes ready.
  // `cache_namespace`: the API key's (ApiCaller), sent to the workers (forwarding_call.h).
  // `request_id`: the HTTP request's (its X-Request-Id or a fresh one), logged and sent to the
  // workers.
  static std::shared_ptr<HttpCall> Start(AdmissionTicket admitted, RouterContext* router,
                                         lazyattn::v1::GenerateRequest request,
                                         std::chrono::system_clock::time_point deadline,
                                         bool stream, std::string cache_namespace,
                                         std::string request_id,
                                         std::shared_ptr<LiveCalls> live = nullptr,
                                         std::shared_ptr<ReadySignal> ready = nullptr);
  ~HttpCall() override;

  // Waits for the next event, at most `timeout` (zero: a poll); the event's kind. After kEnd,
  // returns kEnd again, without the logprobs (the first kEnd took them).
  Event::Kind Next(Event* event, absl::Duration timeout = absl::InfiniteDuration());
  // The last token was written to the client (ok) or could not be (the client is gone).
  void Consumed(bool ok) { ClientWriteDone(ok); }
  // The handler gives up on the call (the client went away, the deadline passed, the router shuts
  // down): the worker call is cancelled and any token not consumed is dropped; `why` is how the
  // call ends in the access log and the metrics. The handler may then drop the call.
  void Cancel(grpc::Status why = grpc::Status(grpc::StatusCode::CANCELLED,
                                              "cancelled by the client"));
  // Sets how a cancellation ends the call before anything cancels it (ChoiceCalls releases a
  // held token, which cancels the worker call, before it calls Cancel).
  using ForwardingCall::SetCancelStatus;

 private:
  HttpCall(RouterContext* router, lazyattn::v1::GenerateRequest request,
           std::chrono::system_clock::time_point deadline, bool stream, std::string cache_namespace,
           std::string request_id);

  void DeliverToken(const lazyattn::v1::GenerateResponse& token) override;
  void DeliverEnd(const grpc::Status& status, const lazyattn::v1::Final* final) override;
  bool StreamsToClient() const override { return stream_; }
  void DiscardPartial() override;
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_.has_value() || ended_; }

  const lazyattn::v1::GenerateRequest request_;  // ForwardingCall points at it
  const bool stream_;
  // The call's places under its key's in-flight cap and the router's limit, given back with it.
  AdmissionTicket admission_;
  std::shared_ptr<ReadySignal> ready_;  // may be null
  std::shared_ptr<HttpCall> self_;      // set by Start, dropped by DeliverEnd

  absl::Mutex mu_;
  std::optional<lazyattn::v1::TokenChunk> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenLogprob> logprobs_ ABSL_GUARDED_BY(mu_);  // not streaming: collected
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;  // Cancel() was called
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::optional<lazyattn::v1::Final> final_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_HTTP_CALL_H_
