// ForwardingCall's access log: one line per request, with its latency metrics.
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "services/router/server/forwarding_call.h"

namespace lazyattn::router {

using lazyattn::v1::Final;

// One access-log line per request, and the request's latency metrics. The prompt is logged only
// at log.level debug (it may hold anything a client sends).
void ForwardingCall::LogAccess(const grpc::Status& status, const Final* final) {
  const absl::Time now = MonotonicNow();
  const bool ok = status.ok();
  const bool got_token = first_token_at_ != absl::InfinitePast();
  if (ok) model_metrics_->ObserveDuration(now - started_);
  // Every request is in one of the two TTFT histograms, so the TTFT objective also sees the users
  // who gave up waiting (only successes were observed: a cluster where every client timed out
  // before its first token showed no slow request at all). A success without a token (an empty
  // answer) got its answer at its end.
  if (got_token) {
    model_metrics_->ObserveTtft(first_token_at_ - started_);
  } else if (ok) {
    model_metrics_->ObserveTtft(now - started_);
  } else {
    model_metrics_->ObserveNoFirstToken(now - started_);
  }
  if (!LogEnabled(LogLevel::kInfo)) return;
  LogLine line(ok ? LogLevel::kInfo : LogLevel::kWarning, "router");
  line.Str("request_id", request_id_)
      .Str("status", StatusCodeLabel(status.error_code()))
      .Str("worker", final != nullptr ? final->worker() : last_worker_)
      .Int("attempts", attempts_);
  // Left out when no token was sent (as in the worker's line), rather than a -1 that a log
  // query averaging the key would take for a time.
  if (got_token) line.Num("ttft_s", absl::ToDoubleSeconds(first_token_at_ - started_));
  line.Num("duration_s", absl::ToDoubleSeconds(now - started_))
      .Int("tokens", final != nullptr ? final->usage().completion_tokens() : tokens_);
  if (final != nullptr) {
    line.Int("prompt_tokens", final->usage().prompt_tokens())
        .Int("cached_tokens", final->usage().cached_tokens())
        .Int("predicted_hit_tokens", final->predicted_hit_tokens())
        .Int("document_hit_tokens", final->usage().document_hit_tokens())
        .Str("finish_reason", final->finish_reason());
  }
  if (!ok) line.Str("error", status.error_message());
  if (LogEnabled(LogLevel::kDebug)) {
    line.Str("question", request_->question()).Int("documents", request_->documents_size());
  }
  line.Msg("request");
}

}  // namespace lazyattn::router
