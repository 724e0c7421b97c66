// One attempt of a routed Generate or Complete call: the Worker.Generate call to one worker, with
// the callback client API, and its first-token timeout: the attempt is cancelled when neither a
// token nor a PrefillProgress event (the worker's sign of life while it computes a long prompt)
// came for that long. ForwardingCall (forwarding_call.h) owns
// the flow (routing, relaying tokens, failover); an attempt reads one message at a time, hands it
// to its ForwardingCall, and reports its end there.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_ATTEMPT_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_ATTEMPT_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/server/worker_registry.h"

namespace lazyattn::router {

class ForwardingCall;

// One Worker.Generate call. Holds itself alive from Start to OnDone.
class WorkerAttempt : public grpc::ClientReadReactor<lazyattn::v1::GenerateResponse> {
 public:
  WorkerAttempt(ForwardingCall* call, WorkerInfo worker,
                std::shared_ptr<lazyattn::v1::Worker::Stub> stub,
                std::unique_ptr<grpc::ClientContext> context);

  // `first_token_timeout` zero: none. Otherwise it runs from the start and again from each
  // PrefillProgress event, until the first token.
  void Start(std::shared_ptr<WorkerAttempt> self, const lazyattn::v1::GenerateRequest* request,
             absl::Duration first_token_timeout);
  // The previous message was consumed: read the next one.
  void ReadNext();
  // Cancels the worker call; idempotent, safe at any time.
  void Cancel();
  const WorkerInfo& worker() const { return worker_; }
  // The attempt was cancelled because no token came within the first-token timeout.
  bool timed_out() {
    absl::MutexLock lock(&mu_);
    return timed_out_;
  }

  // Whether the call, ended with `status`, lost its worker's connection mid-call
  // (CountsAsLostMidCall): the worker's initial metadata came (a READY channel alone does not
  // count: a half-dead connection fails calls that never reached the worker) and it ended
  // UNAVAILABLE without the worker's own trailer, and the router did not cancel it. Only from
  // OnDone (it reads the trailing metadata).
  bool LostMidCall(const grpc::Status& status);

  void OnReadInitialMetadataDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void OnFirstTokenAlarm();
  // A new alarm at first_token_due_ (an alarm is not set again once it fired).
  void ArmFirstTokenAlarmLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ForwardingCall* const call_;
  const WorkerInfo worker_;
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
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;  // the worker's initial metadata arrived
  std::weak_ptr<WorkerAttempt> weak_self_;     // for the alarms' callbacks
  absl::Duration first_token_timeout_;
  absl::Time first_token_due_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // One alarm per arming: the first, then one more each time progress had moved the due time
  // past a firing. Kept until the attempt ends; their callbacks hold only a weak reference, as
  // they may fire after the attempt is gone.
  std::vector<std::unique_ptr<grpc::Alarm>> first_token_alarms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_ATTEMPT_H_
