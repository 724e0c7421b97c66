// How a worker attempt's end is judged: what the worker's status means for the call once the
// attempt's own observations (a broken stream protocol, a timeout, an answer whose call never
// ended) are taken into account. OnAttemptDone acts on the result (breakers, retries, the end).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "services/router/server/forwarding_call.h"

namespace lazyattn::router {

grpc::Status ForwardingCall::JudgeAttemptEnd(WorkerAttempt* attempt,
                                             const grpc::Status& worker_status) {
  const WorkerInfo& w = attempt->worker();
  grpc::Status status = worker_status;
  // Cancelled by a timeout: the worker is frozen or wedged, not the request bad.
  const WorkerAttempt::Timeout timeout =
      status.ok() ? WorkerAttempt::Timeout::kNone : attempt->timed_out();
  // A break of the stream's grammar overrides any status: the worker may have ended its call OK
  // before the router's cancellation reached it (a message after the final one).
  std::string violation = attempt->protocol_violation();
  if (violation.empty() && !status.ok() && attempt->stuck_after_failed_read()) {
    violation = absl::StrCat(
        "a message that does not parse as a GenerateResponse (a string "
        "field that is not UTF-8?), after which the call stayed open for ",
        absl::ToInt64Seconds(WorkerAttempt::kEndGrace), " s");
  }
  if (!violation.empty()) {
    model_metrics_->CountWorkerProtocolError();
    LogError("router")
        .Str("request_id", request_id_)
        .Str("worker", w.id)
        .Str("address", w.address)
        .Str("violation", violation)
        .Msg("worker broke the Generate stream's protocol; attempt cancelled");
    status =
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     absl::StrCat("the worker broke the Generate stream's protocol: ", violation,
                                  "; attempt cancelled"));
  } else if (timeout == WorkerAttempt::Timeout::kFirstToken) {
    model_metrics_->CountFirstTokenTimeout();
    status = grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no first token within ",
                     absl::ToInt64Milliseconds(router_->options().routing.first_token_timeout),
                     " ms (routing.first_token_timeout_ms); attempt cancelled"));
  } else if (timeout == WorkerAttempt::Timeout::kFirstTokenMaxWait) {
    model_metrics_->CountFirstTokenTimeout();
    status = grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no first token within ",
                     absl::ToInt64Milliseconds(router_->options().routing.first_token_max_wait),
                     " ms of the attempt's start (routing.first_token_max_wait_ms), although the "
                     "worker kept reporting its request queued or its prefill moving; attempt "
                     "cancelled"));
  } else if (timeout == WorkerAttempt::Timeout::kBetweenTokens) {
    model_metrics_->CountTokenIdleTimeout();
    status = grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("no token for ",
                     absl::ToInt64Milliseconds(router_->options().routing.token_idle_timeout),
                     " ms after the previous token (routing.token_idle_timeout_ms); attempt "
                     "cancelled"));
  }
  if (violation.empty() && !status.ok() && attempt->stuck_after_final()) {
    // The answer came whole; only the call's end did not. The client gets the answer (no retry
    // recomputes it), and the worker's lapse is counted as the protocol error it is.
    bool have_final = false;
    {
      absl::MutexLock lock(&mu_);
      have_final = final_.has_value();
    }
    if (have_final) {
      model_metrics_->CountWorkerProtocolError();
      LogError("router")
          .Str("request_id", request_id_)
          .Str("worker", w.id)
          .Str("address", w.address)
          .Int("grace_s", absl::ToInt64Seconds(WorkerAttempt::kEndGrace))
          .Msg(
              "worker sent its final message but did not end the call; attempt cancelled, the "
              "final kept");
      status = grpc::Status::OK;
    }
  }
  return status;
}

}  // namespace lazyattn::router
