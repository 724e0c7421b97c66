#include "services/router/http/http_call.h"

#include <utility>

#include "common/grpc_util.h"

namespace lazyattn::router {

using lazyattn::v1::Final;
using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;

HttpCall::HttpCall(RouterContext* router, GenerateRequest request,
                   std::chrono::system_clock::time_point deadline, bool stream,
                   std::string cache_namespace, std::string request_id)
    : ForwardingCall(router, deadline, &request_, std::move(cache_namespace),
                     std::move(request_id)),
      request_(std::move(request)),
      stream_(stream) {}

void LiveCalls::Add() {
  absl::MutexLock lock(&mu_);
  ++count_;
}

void LiveCalls::Remove() {
  absl::MutexLock lock(&mu_);
  --count_;
}

bool LiveCalls::WaitForZero(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](int* n) { return *n == 0; }, &count_),
                              timeout);
}

void ReadySignal::Notify() {
  absl::MutexLock lock(&mu_);
  ++generation_;
}

uint64_t ReadySignal::generation() {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void ReadySignal::WaitForChange(uint64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ != seen; };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
}

int LiveCalls::count() {
  absl::MutexLock lock(&mu_);
  return count_;
}

HttpCall::~HttpCall() = default;

std::shared_ptr<HttpCall> HttpCall::Start(AdmissionTicket admitted, RouterContext* router,
                                          GenerateRequest request,
                                          std::chrono::system_clock::time_point deadline,
                                          bool stream, std::string cache_namespace,
                                          std::string request_id, std::shared_ptr<LiveCalls> live,
                                          std::shared_ptr<ReadySignal> ready) {
  // Counted until the whole object is gone: ~ForwardingCall, which runs after ~HttpCall, still
  // uses the router.
  if (live != nullptr) live->Add();
  std::shared_ptr<HttpCall> call(new HttpCall(router, std::move(request), deadline, stream,
                                              std::move(cache_namespace), std::move(request_id)),
                                 [live](HttpCall* c) {
                                   delete c;
                                   if (live != nullptr) live->Remove();
                                 });
  call->admission_ = std::move(admitted);
  call->ready_ = std::move(ready);
  call->self_ = call;
  call->Begin();
  return call;
}

HttpCall::Event::Kind HttpCall::Next(Event* event, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(this, &HttpCall::Ready), timeout)) {
    return Event::kTimeout;
  }
  if (pending_.has_value()) {
    event->token = std::move(*pending_);
    pending_.reset();
    return Event::kToken;
  }
  event->status = status_;
  event->final = final_;
  // Moved, not copied: a long non-streamed request's entries are its largest part.
  event->logprobs = std::move(logprobs_);
  logprobs_.clear();
  return Event::kEnd;
}

void HttpCall::DeliverToken(const GenerateResponse& token) {
  if (!stream_) {
    {
      absl::MutexLock lock(&mu_);
      if (auto entry = LogprobOf(token.token())) logprobs_.push_back(std::move(*entry));
    }
    ClientWriteDone(true);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!abandoned_) {
      pending_ = token.token();
      if (ready_ != nullptr) ready_->Notify();
      return;
    }
  }
  ClientWriteDone(false);  // nobody will write it: let the call end
}

void HttpCall::Cancel(grpc::Status why) {
  // Before abandoned_ is set: from then on a token arriving on a gRPC thread cancels the worker
  // call itself (DeliverToken), and the call may end with the cancellation's status at once. Set
  // after the call ended, it is never read.
  SetCancelStatus(std::move(why));
  bool drop_pending = false;
  {
    absl::MutexLock lock(&mu_);
    if (ended_ || abandoned_) return;  // nothing left to cancel
    abandoned_ = true;
    drop_pending = pending_.has_value();
    pending_.reset();
  }
  if (drop_pending) {
    ClientWriteDone(false);  // also cancels the worker call
  } else {
    ClientCancelled();
  }
}

void HttpCall::DiscardPartial() {
  absl::MutexLock lock(&mu_);
  logprobs_.clear();
}

void HttpCall::DeliverEnd(const grpc::Status& status, const Final* final) {
  // The ForwardingCall touches nothing after this returns: the call may be freed at our exit.
  std::shared_ptr<HttpCall> keep = std::move(self_);
  absl::MutexLock lock(&mu_);
  ended_ = true;
  status_ = status;
  if (status.ok() && final != nullptr) {
    final_ = *final;
  }
  if (ready_ != nullptr) ready_->Notify();
}

}  // namespace lazyattn::router
