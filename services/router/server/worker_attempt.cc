#include "services/router/server/worker_attempt.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "common/worker_call_trailer.h"
#include "services/router/policy/query_quarantine.h"
#include "services/router/server/forwarding_call.h"

namespace lazyattn::router {

using lazyattn::v1::GenerateRequest;

WorkerAttempt::WorkerAttempt(ForwardingCall* call, WorkerInfo worker,
                             CircuitBreakers::Permit permit,
                             std::shared_ptr<lazyattn::v1::Worker::Stub> stub,
                             std::unique_ptr<grpc::ClientContext> context)
    : call_(call),
      worker_(std::move(worker)),
      permit_(permit),
      stub_(std::move(stub)),
      context_(std::move(context)) {}

void WorkerAttempt::Start(std::shared_ptr<WorkerAttempt> self, const GenerateRequest* request,
                          Timeouts timeouts) {
  weak_self_ = self;
  timeouts_ = timeouts;
  {
    absl::MutexLock lock(&mu_);
    stream_check_.emplace(WorkerStreamCheck::For(*request, worker_.status.model(),
                                                 call_->router()->options().limits.max_tokens));
    const absl::Time now = MonotonicNow();
    if (timeouts.first_token_max_wait > absl::ZeroDuration()) {
      first_token_deadline_ = now + timeouts.first_token_max_wait;
    }
    if (timeouts.first_token > absl::ZeroDuration()) {
      next_message_due_ = std::min(now + timeouts.first_token, first_token_deadline_);
    } else {
      next_message_due_ = first_token_deadline_;
    }
    if (next_message_due_ != absl::InfiniteFuture()) ArmWatchdogLocked();
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
    if (got_final_) {
      // Only the call's end is due now, whatever the between-tokens timeout (none, or longer).
      next_message_due_ = MonotonicNow() + kEndGrace;
      if (!alarm_pending_) ArmWatchdogLocked();
    } else if (got_token_ && timeouts_.between_tokens > absl::ZeroDuration()) {
      next_message_due_ = MonotonicNow() + timeouts_.between_tokens;
      if (!alarm_pending_) ArmWatchdogLocked();
    }
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

void WorkerAttempt::ArmWatchdogLocked() {
  std::weak_ptr<WorkerAttempt> weak = weak_self_;
  alarm_pending_ = true;
  watchdog_alarms_.push_back(std::make_unique<grpc::Alarm>());
  watchdog_alarms_.back()->Set(GrpcMonotonicDeadline(next_message_due_), [weak](bool fired) {
    if (!fired) return;  // cancelled: the attempt ended (or its only timeout no longer applies)
    if (auto attempt = weak.lock()) attempt->OnWatchdogAlarm();
  });
}

void WorkerAttempt::OnWatchdogAlarm() {
  {
    absl::MutexLock lock(&mu_);
    alarm_pending_ = false;
    if (cancelled_) return;
    if (MonotonicNow() < next_message_due_) {
      // A message came since this alarm was set; while one is awaited, watch the new due time
      // (InfiniteFuture: the router is delivering to its client; ReadNext arms again).
      if (next_message_due_ != absl::InfiniteFuture()) ArmWatchdogLocked();
      return;
    }
    if (read_failed_) {
      stuck_after_failed_read_ = true;
    } else if (got_final_) {
      stuck_after_final_ = true;
    } else if (got_token_) {
      timed_out_ = Timeout::kBetweenTokens;
    } else {
      timed_out_ = MonotonicNow() >= first_token_deadline_ ? Timeout::kFirstTokenMaxWait
                                                           : Timeout::kFirstToken;
    }
    // Decided with the timeout, under the same lock: a message whose read completes between here
    // and Cancel() below is not delivered (a first token that came a moment too late would
    // otherwise reach the client of an attempt then ended as "no first token").
    cancelled_ = true;
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
    end.cancelled_by_router =
        cancelled_ || timed_out_ != Timeout::kNone || !protocol_violation_.empty();
  }
  // A worker that ends a call itself says so in a trailer; without it, the transport ended the
  // call under the worker: its process (or its host) went away while holding the request.
  end.worker_trailer = context_->GetServerTrailingMetadata().count(kWorkerEndedCallKey) != 0;
  return CountsAsLostMidCall(end);
}

bool WorkerAttempt::HandedBack(const grpc::Status& status) {
  // A worker hands back with UNAVAILABLE only; the mark on another code (one that is no worker
  // fault) would let a broken or hostile worker bounce requests at no cost to itself.
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  {
    absl::MutexLock lock(&mu_);
    if (got_token_ || got_final_) return false;
  }
  const auto& trailers = context_->GetServerTrailingMetadata();
  return trailers.count(kWorkerEndedCallKey) != 0 && trailers.count(kWorkerHandedBackKey) != 0;
}

void WorkerAttempt::OnReadDone(bool ok) {
  bool remove_hold = false;
  bool deliver = false;
  bool read_next = false;
  bool violated = false;
  grpc::Alarm* watchdog = nullptr;  // the first-token alarm, to cancel: the first token came
  {
    absl::MutexLock lock(&mu_);
    read_outstanding_ = false;
    if (!ok || cancelled_) {
      remove_hold = hold_;
      hold_ = false;
      next_message_due_ = absl::InfiniteFuture();  // the stream ended: nothing more is due
      if (!ok && !cancelled_) {
        // gRPC fails a read both at the stream's end and on a message that does not parse (a
        // string field that is not UTF-8). A worker that ended its stream ends its call with it;
        // one whose message did not parse may hold the call open for ever: cut it if it has
        // not ended kEndGrace later.
        read_failed_ = true;
        next_message_due_ = MonotonicNow() + kEndGrace;
        ArmWatchdogLocked();
      }
    } else if (std::string violation = stream_check_->Next(message_); !violation.empty()) {
      protocol_violation_ = std::move(violation);
      violated = true;  // cancelled below: nothing of this message goes to the call
    } else if (message_.has_prefill_progress()) {
      // The worker's sign of life, for this attempt alone and only before its first token (after
      // it the events are tolerated and keep nothing alive), and only when the prefill moved or
      // the request waits in a queue the worker's engine is working through: the timeout runs
      // again from now, up to the bound on all the waiting (first_token_deadline_), which no
      // event moves. The next message is read here (nothing goes to the call).
      const int64_t ready = message_.prefill_progress().prompt_tokens_ready();
      const bool alive = ready > progress_high_ || message_.prefill_progress().queued();
      if (!got_token_ && timeouts_.first_token > absl::ZeroDuration() && alive) {
        next_message_due_ = std::min(MonotonicNow() + timeouts_.first_token, first_token_deadline_);
      }
      progress_high_ = std::max(progress_high_, ready);
      read_outstanding_ = read_next = true;
    } else if (!message_.has_token() && !message_.has_final()) {
      read_outstanding_ = read_next = true;  // an event this router does not know: dropped
    } else {
      deliver = true;
      if (message_.has_final()) {
        got_final_ = true;
        ClampUsage(*message_.mutable_final()->mutable_usage());
      }
      if (message_.has_token()) {
        // Nothing is awaited from the worker until the call has delivered this token (ReadNext).
        next_message_due_ = absl::InfiniteFuture();
        if (!got_token_) {
          got_token_ = true;
          // The first-token alarm is done with; ReadNext arms the between-tokens one.
          if (alarm_pending_) {
            watchdog = watchdog_alarms_.back().get();
            alarm_pending_ = false;
          }
        }
      }
    }
  }
  if (watchdog != nullptr) watchdog->Cancel();
  if (remove_hold) RemoveHold();
  if (read_next) StartRead(&message_);
  if (violated) Cancel();
  if (deliver) call_->OnWorkerMessage(this, message_);
}

void WorkerAttempt::OnDone(const grpc::Status& status) {
  std::shared_ptr<WorkerAttempt> keep = std::move(self_);
  // A code outside gRPC's 0-16 (grpc-status is the worker's text; a broken or hostile one may send
  // any number) is UNKNOWN, as gRPC's own clients read it: it goes on to the client, and into the
  // router's per-worker failure counts, which would otherwise keep an entry for each number sent.
  const int code = static_cast<int>(status.error_code());
  if (code < 0 || code > static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) {
    call_->OnAttemptDone(
        this, grpc::Status(grpc::StatusCode::UNKNOWN,
                           absl::StrCat("status code ", code,
                                        " (not a gRPC code): ", status.error_message())));
    return;  // the call may have ended
  }
  call_->OnAttemptDone(this, status);  // may end the call: nothing here touches it afterwards
}

}  // namespace lazyattn::router
