// One attempt of a routed Generate or Complete call: the Worker.Generate call to one worker, with
// the callback client API, and its watchdog: before the first token the attempt is cancelled when
// neither a token nor a PrefillProgress event (the worker's sign of life while it computes a long
// prompt) came for the first-token timeout; after it, when the worker sends nothing for the
// between-tokens timeout while the router waits on it. Every message is checked against the
// stream's grammar (worker_stream_check.h): one outside it (a token past max_tokens or after the
// final message, an id outside the vocabulary) cancels the attempt before it reaches the call.
// A PrefillProgress event re-arms the first-token timeout only when it reports more prompt tokens
// than any before, so a worker whose engine is wedged but whose events keep coming is still cut.
// Messages with no event this router knows are dropped and re-arm nothing. A message that does
// not parse fails the read as the stream's end does; a call still open kEndGrace after a failed
// read is cancelled (a worker that ends its stream ends its call with it), and so is a call still
// open kEndGrace after its final message (the answer is complete: the call ends with it, and the
// worker's lapse is a protocol error, not a failure of the request). ForwardingCall
// (forwarding_call.h) owns the flow (routing, relaying tokens, failover); an attempt reads one
// message at a time, hands tokens and the final message to its ForwardingCall, and reports its
// end there.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_ATTEMPT_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_ATTEMPT_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/policy/circuit_breaker.h"
#include "services/router/server/worker_registry.h"
#include "services/router/server/worker_stream_check.h"

namespace lazyattn::router {

class ForwardingCall;

// One Worker.Generate call. Holds itself alive from Start to OnDone.
class WorkerAttempt : public grpc::ClientReadReactor<lazyattn::v1::GenerateResponse> {
 public:
  // `permit`: the worker's circuit-breaker permit the attempt was sent under; its outcome is
  // reported with it.
  WorkerAttempt(ForwardingCall* call, WorkerInfo worker, CircuitBreakers::Permit permit,
                std::shared_ptr<lazyattn::v1::Worker::Stub> stub,
                std::unique_ptr<grpc::ClientContext> context);

  struct Timeouts {
    // Zero: none. Otherwise it runs from the start and again from each PrefillProgress event,
    // until the first token.
    absl::Duration first_token = absl::ZeroDuration();
    // Zero: none. Otherwise the first token is due this long after the start at the latest,
    // whatever PrefillProgress events came.
    absl::Duration first_token_max_wait = absl::ZeroDuration();
    // Zero: none. Otherwise, after the first token, it runs from each read of the next message
    // (ReadNext), so the time the router spends delivering to a slow client never counts.
    absl::Duration between_tokens = absl::ZeroDuration();
  };
  // kFirstTokenMaxWait: the bound on all the waiting for the first token (Timeouts), which no
  // progress event restarts.
  enum class Timeout { kNone, kFirstToken, kFirstTokenMaxWait, kBetweenTokens };

  void Start(std::shared_ptr<WorkerAttempt> self, const lazyattn::v1::GenerateRequest* request,
             Timeouts timeouts);
  // The previous message was consumed: read the next one.
  void ReadNext();
  // Cancels the worker call; idempotent, safe at any time.
  void Cancel();
  const WorkerInfo& worker() const { return worker_; }
  const CircuitBreakers::Permit& permit() const { return permit_; }
  // Which timeout, if any, cancelled the attempt.
  Timeout timed_out() {
    absl::MutexLock lock(&mu_);
    return timed_out_;
  }
  // What the worker sent outside the stream's grammar, which cancelled the attempt; empty if
  // nothing did.
  std::string protocol_violation() {
    absl::MutexLock lock(&mu_);
    return protocol_violation_;
  }
  // A read failed (the stream's end, or a message that did not parse) and the call had not
  // ended kEndGrace later, so the attempt was cancelled. Meaningful only for a call that did not
  // end OK: an OK end that raced the cut is the stream's end.
  bool stuck_after_failed_read() {
    absl::MutexLock lock(&mu_);
    return stuck_after_failed_read_;
  }
  // The final message came and the call had not ended kEndGrace after it was read, so the
  // attempt was cancelled: the request's answer is the final's, whatever status the cut gives.
  bool stuck_after_final() {
    absl::MutexLock lock(&mu_);
    return stuck_after_final_;
  }
  static constexpr absl::Duration kEndGrace = absl::Seconds(2);

  // Whether the call, ended with `status`, lost its worker's connection mid-call
  // (CountsAsLostMidCall): the worker's initial metadata came (a READY channel alone does not
  // count: a half-dead connection fails calls that never reached the worker) and it ended
  // UNAVAILABLE without the worker's own trailer, and the router did not cancel it. Only from
  // OnDone (it reads the trailing metadata).
  bool LostMidCall(const grpc::Status& status);
  // Whether the worker, ending the call with `status` before any token, said it did no work for
  // it (kWorkerHandedBackKey: refused while draining, or handed back by its drain): the request
  // moves to another worker without drawing on the retry budget. Only from OnDone.
  bool HandedBack(const grpc::Status& status);

  void OnReadInitialMetadataDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void OnWatchdogAlarm();
  // A new alarm at next_message_due_ (an alarm is not set again once it fired).
  void ArmWatchdogLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ForwardingCall* const call_;
  const WorkerInfo worker_;
  const CircuitBreakers::Permit permit_;
  std::shared_ptr<lazyattn::v1::Worker::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  lazyattn::v1::GenerateResponse message_;
  std::shared_ptr<WorkerAttempt> self_;

  absl::Mutex mu_;
  // One hold covers the read flow (reads are started from the server side's OnWriteDone, outside
  // this reactor's reactions); it is removed once no more reads will be started.
  bool hold_ ABSL_GUARDED_BY(mu_) = true;
  bool read_outstanding_ ABSL_GUARDED_BY(mu_) = true;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool got_token_ ABSL_GUARDED_BY(mu_) = false;
  Timeout timed_out_ ABSL_GUARDED_BY(mu_) = Timeout::kNone;
  std::optional<WorkerStreamCheck> stream_check_ ABSL_GUARDED_BY(mu_);  // made in Start
  std::string protocol_violation_ ABSL_GUARDED_BY(mu_);
  bool read_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stuck_after_failed_read_ ABSL_GUARDED_BY(mu_) = false;
  bool got_final_ ABSL_GUARDED_BY(mu_) = false;
  bool stuck_after_final_ ABSL_GUARDED_BY(mu_) = false;
  // The most prompt tokens a PrefillProgress event reported; -1 before the first event.
  int64_t progress_high_ ABSL_GUARDED_BY(mu_) = -1;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;  // the worker's initial metadata arrived
  std::weak_ptr<WorkerAttempt> weak_self_;     // for the alarms' callbacks
  Timeouts timeouts_;
  // When the worker's next message is due; InfiniteFuture while nothing is awaited from it (the
  // router is delivering a token to its client) or no timeout applies.
  absl::Time next_message_due_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The latest the first token may come (Timeouts::first_token_max_wait from the start);
  // InfiniteFuture without that bound.
  absl::Time first_token_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // An alarm is set and will look at next_message_due_ (the chain's last; the first-token alarm
  // is cancelled at the first token and the between-tokens chain starts at the next ReadNext).
  bool alarm_pending_ ABSL_GUARDED_BY(mu_) = false;
  // One alarm per arming: the first, then one more each time the due time had moved past a
  // firing (at most one a timeout's length). Kept until the attempt ends; their callbacks hold
  // only a weak reference, as they may fire after the attempt is gone.
  std::vector<std::unique_ptr<grpc::Alarm>> watchdog_alarms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_ATTEMPT_H_
