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
  if (first_token_timeout > absl::ZeroDuration()) {
    std::weak_ptr<WorkerAttempt> weak = self;
    first_token_alarm_.Set(absl::ToChronoTime(absl::Now() + first_token_timeout),
                           [weak](bool fired) {
                             if (!fired) return;  // cancelled: a token came, or the attempt ended
                             if (auto attempt = weak.lock()) attempt->OnFirstTokenTimeout();
                           });
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

void WorkerAttempt::OnFirstTokenTimeout() {
  {
    absl::MutexLock lock(&mu_);
    if (got_token_ || cancelled_) return;
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
  bool first_token = false;
  {
    absl::MutexLock lock(&mu_);
    read_outstanding_ = false;
    if (!ok || cancelled_) {
      remove_hold = hold_;
      hold_ = false;
    } else {
      deliver = true;
      if (!got_token_ && message_.has_token()) first_token = got_token_ = true;
    }
  }
  if (first_token) first_token_alarm_.Cancel();
  if (remove_hold) RemoveHold();
  if (deliver) call_->OnWorkerMessage(this, message_);
}

void WorkerAttempt::OnDone(const grpc::Status& status) {
  std::shared_ptr<WorkerAttempt> keep = std::move(self_);
  call_->OnAttemptDone(this, status);  // may end the call: nothing here touches it afterwards
}

}  // namespace lazyattn::router
