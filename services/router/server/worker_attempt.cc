#include "services/router/server/worker_attempt.h"

#include <utility>

#include "common/worker_call_trailer.h"
#include "services/router/policy/query_quarantine.h"
#include "services/router/server/forwarding_call.h"

namespace lazyattn::router {

using lazyattn::v1::GenerateRequest;

WorkerAttempt::WorkerAttempt(ForwardingCall* call, WorkerInfo worker,
                             std::shared_ptr<lazyattn::v1::Worker::Stub> stub,
                             std::unique_ptr<grpc::ClientContext> context)
    : call_(call),
      worker_(std::move(worker)),
      stub_(std::move(stub)),
      context_(std::move(context)) {}

void WorkerAttempt::Start(std::shared_ptr<WorkerAttempt> self, const GenerateRequest* request,
                          absl::Duration first_token_timeout) {
  weak_self_ = self;
  first_token_timeout_ = first_token_timeout;
  if (first_token_timeout > absl::ZeroDuration()) {
    absl::MutexLock lock(&mu_);
    first_token_due_ = absl::Now() + first_token_timeout;
    ArmFirstTokenAlarmLocked();
  }
  self_ = std::move(self);
  stub_->async()->Generate(context_.get(), request, this);
  AddHold();
  StartRead(&message_);
  StartCall();
}

void WorkerAttempt::ReadNext() {
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || !hold_ || read_outstanding_) return;
    read_outstanding_ = true;
  }
  StartRead(&message_);
}

void WorkerAttempt::Cancel() {
  bool remove_hold = false;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (hold_ && !read_outstanding_) {
      hold_ = false;
      remove_hold = true;
    }
  }
  context_->TryCancel();
  if (remove_hold) RemoveHold();
}

void WorkerAttempt::ArmFirstTokenAlarmLocked() {
  std::weak_ptr<WorkerAttempt> weak = weak_self_;
  first_token_alarms_.push_back(std::make_unique<grpc::Alarm>());
  first_token_alarms_.back()->Set(absl::ToChronoTime(first_token_due_), [weak](bool fired) {
    if (!fired) return;  // cancelled: a token came, or the attempt ended
    if (auto attempt = weak.lock()) attempt->OnFirstTokenAlarm();
  });
}

void WorkerAttempt::OnFirstTokenAlarm() {
  {
    absl::MutexLock lock(&mu_);
    if (got_token_ || cancelled_) return;
    if (absl::Now() < first_token_due_) {  // progress came since this alarm was set
      ArmFirstTokenAlarmLocked();
      return;
    }
    timed_out_ = true;
  }
  Cancel();
}

void WorkerAttempt::OnReadInitialMetadataDone(bool ok) {
  if (!ok) return;
  absl::MutexLock lock(&mu_);
  reached_ = true;
}

bool WorkerAttempt::LostMidCall(const grpc::Status& status) {
  AttemptEnd end{.unavailable = status.error_code() == grpc::StatusCode::UNAVAILABLE};
  {
    absl::MutexLock lock(&mu_);
    end.worker_headers = reached_;
    end.cancelled_by_router = cancelled_ || timed_out_;
  }
  // A worker that ends a call itself says so in a trailer; without it, the transport ended the
  // call under the worker: its process (or its host) went away while holding the request.
  end.worker_trailer = context_->GetServerTrailingMetadata().count(kWorkerEndedCallKey) != 0;
  return CountsAsLostMidCall(end);
}

void WorkerAttempt::OnReadDone(bool ok) {
  bool remove_hold = false;
  bool deliver = false;
  bool read_next = false;
  grpc::Alarm* first_token_alarm = nullptr;  // to cancel: the first token came
  {
    absl::MutexLock lock(&mu_);
    read_outstanding_ = false;
    if (!ok || cancelled_) {
      remove_hold = hold_;
      hold_ = false;
    } else if (message_.has_prefill_progress()) {
      // The worker's sign of life, for this attempt alone: the timeout runs again from now, and
      // the next message is read here (nothing goes to the call).
      if (!got_token_ && first_token_timeout_ > absl::ZeroDuration()) {
        first_token_due_ = absl::Now() + first_token_timeout_;
      }
      read_outstanding_ = read_next = true;
    } else {
      deliver = true;
      if (!got_token_ && message_.has_token()) {
        got_token_ = true;
        if (!first_token_alarms_.empty()) first_token_alarm = first_token_alarms_.back().get();
      }
    }
  }
  if (first_token_alarm != nullptr) first_token_alarm->Cancel();
  if (remove_hold) RemoveHold();
  if (read_next) StartRead(&message_);
  if (deliver) call_->OnWorkerMessage(this, message_);
}

void WorkerAttempt::OnDone(const grpc::Status& status) {
  std::shared_ptr<WorkerAttempt> keep = std::move(self_);
  call_->OnAttemptDone(this, status);  // may end the call: nothing here touches it afterwards
}

}  // namespace lazyattn::router
