#include "services/worker/server/generate_reactor.h"

#include <cstdlib>
#include <iostream>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/document_key.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/monotonic_time.h"
#include "common/request_validator.h"
#include "common/worker_call_trailer.h"
#include "services/worker/engine/fault_injection.h"
#include "services/worker/server/handed_back.h"
#include "services/worker/server/request_end_log.h"

namespace lazyattn {
namespace {

const grpc::Status& ShuttingDown() {
  static const grpc::Status s(grpc::StatusCode::UNAVAILABLE, "worker shutting down");
  return s;
}

// The router's x-request-id for this call (the worker's own when absent or invalid).
std::string ReceivedRequestId(const grpc::CallbackServerContext& call) {
  const auto& metadata = call.client_metadata();
  const auto it = metadata.find(kRequestIdKey);
  return AdoptRequestId(it == metadata.end()
                            ? std::string_view()
                            : std::string_view(it->second.data(), it->second.size()));
}

bool WantsPrefillProgress(const grpc::CallbackServerContext& call) {
  const auto& metadata = call.client_metadata();
  const auto it = metadata.find(kPrefillProgressKey);
  return it != metadata.end() &&
         std::string_view(it->second.data(), it->second.size()) == kPrefillProgressValue;
}

// A log-probability as the API reports it (inference.proto, TopLogprob.logprob): a token of
// probability 0 (-inf, or NaN from a NaN logit) as -9999, OpenAI's value, since JSON has no
// infinity; a rounding above 0 as 0.
float ReportedLogprob(float logprob) {
  if (!(logprob >= -9999.0f)) return -9999.0f;
  return logprob > 0.0f ? 0.0f : logprob;
}

}  // namespace

std::optional<grpc::Status> RefuseOtherModel(const grpc::CallbackServerContext& call,
                                             const std::string& model_key) {
  const auto& metadata = call.client_metadata();
  const auto it = metadata.find(kExpectedModelKey);
  if (it == metadata.end()) return std::nullopt;
  const std::string_view expected(it->second.data(), it->second.size());
  if (expected == model_key) return std::nullopt;
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("routed for model ", std::string(expected.substr(0, 160)),
                                   "; this worker serves ", model_key));
}

absl::Status CheckCallsModel(const grpc::CallbackServerContext& call, const ServiceContext& ctx,
                             std::string_view requested) {
  const bool routed = call.client_metadata().count(kExpectedModelKey) > 0;
  return CheckRequestedModel(requested, ctx.served_model, routed);
}

std::string CacheNamespaceOf(const grpc::CallbackServerContext& call) {
  const auto& metadata = call.client_metadata();
  const auto it = metadata.find(kCacheNamespaceMetadata);
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

GenerateReactor::GenerateReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                                 const v1::GenerateRequest& request)
    : ctx_(ctx),
      call_(call),
      arrival_(MonotonicNow()),
      deadline_(DeadlineOf(call->deadline())),
      request_id_(ReceivedRequestId(*call)),
      prep_(ctx.prep),
      progress_wanted_(WantsPrefillProgress(*call)) {
  // Sent with whatever status this reactor ends the call with; absent only when the call is cut
  // under the worker (its process died): the router's query-of-death quarantine counts those.
  call->AddTrailingMetadata(kWorkerEndedCallKey, kWorkerEndedCallValue);
  auto reject = [&](const grpc::Status& status, bool handed_back = false) {
    if (handed_back) call->AddTrailingMetadata(kWorkerHandedBackKey, kWorkerHandedBackValue);
    ctx_.metrics->CountRequest(status.error_code());
    LogWarning("worker")
        .Str("request_id", request_id_)
        .Str("status", StatusCodeName(status.error_code()))
        .Str("error", status.error_message())
        .Msg("request refused");
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_done_ = true;  // never submitted
      finish_wanted_ = finished_ = true;
    }
    Finish(status);
  };
  if (ctx_.tracker->draining()) {
    reject(ShuttingDown(), /*handed_back=*/true);
    return;
  }
  if (auto other = RefuseOtherModel(*call, ctx_.model_key)) {
    reject(*other);
    return;
  }
  // Linear in the request's size but far cheaper than tokenizing: done here, so that a bad
  // request is refused at once whatever the pool's queue holds.
  const absl::Status valid =
      ValidateGenerateRequest(request, ctx_.limits, ctx_.engine->config().vocab_size);
  if (!valid.ok()) {
    ctx_.metrics->CountValidationFailure(valid);
    reject(ToGrpcStatus(valid));
    return;
  }
  if (absl::Status model = CheckCallsModel(*call, ctx_, request.model()); !model.ok()) {
    reject(ToGrpcStatus(model));
    return;
  }
  auto converted = EngineRequestFromProto(request, *ctx_.tokenizer, ctx_.engine->config(),
                                          ctx_.convert);
  if (!converted.ok()) {
    reject(ToGrpcStatus(converted.status()));
    return;
  }
  converted->deadline = deadline_;
  converted->cache_scope.cache_namespace = CacheNamespaceOf(*call);
  request_ = std::move(*converted);

  // Headers now, before tokenization: the router then knows the call reached this process even
  // if the process dies while preparing it.
  StartSendInitialMetadata();
  refs_.fetch_add(1);  // preparation's, handed on to the engine: Prepare may run before Submit returns
  if (absl::Status queued = prep_.Submit([this](const absl::Status& s) { Prepare(s); },
                                         static_cast<int64_t>(request.ByteSizeLong()));
      !queued.ok()) {
    refs_.fetch_sub(1);  // the task is not called when Submit fails
    reject(ToGrpcStatus(queued), IsHandedBack(queued));
  }
}

void GenerateReactor::Prepare(const absl::Status& pool_status) {
  refs_.fetch_add(1);  // alive under the task's reference, which it holds until SubmitPrepared
  PrepareAndSubmit(pool_status);
  Unref();
}

void GenerateReactor::PrepareAndSubmit(const absl::Status& pool_status) {
  absl::Status status = prep_.Start(pool_status);
  {
    // A cancel after Start (until the engine id is known) is this reactor's to apply.
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok() && cancel_engine_) {
      status = absl::CancelledError("cancelled while waiting for tokenization");
    }
  }
  if (status.ok() && RequestContainsMarker(request_, ctx_.abort_on_prompt_marker)) {
    // A query of death in the router's sense kills a worker the call reached: wait (bounded)
    // until the headers went out, as they do well before any real work, so the test hook does
    // not race them.
    for (int i = 0; i < 200 && !headers_sent_.load(); ++i) absl::SleepFor(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(50));
    std::cerr << "lazyattn-worker: FAULT INJECTION: request contains "
                 "testing.abort_on_prompt_marker; aborting the process"
              << std::endl;
    std::abort();
  }
  if (status.ok() && ctx_.tracker->draining()) {
    status = HandedBack(absl::UnavailableError("worker shutting down"));
  }
  if (status.ok() && MonotonicNow() >= deadline_) {
    status = absl::DeadlineExceededError(
        "deadline exceeded while the request waited for tokenization (engine.prep_threads busy)");
  }
  if (status.ok()) {
    auto prepared = ctx_.engine->Prepare(request_);
    request_ = EngineRequest();  // copied into `prepared`; free it now
    if (!prepared.ok()) {
      status = prepared.status();
    } else {
      prepared->submitted = arrival_;  // the engine's TTFT includes the wait for this pool
      prepared->callbacks = RequestCallbacks{
          .on_token = [this](int32_t id, std::string_view text) { OnToken(id, text); },
          // Called just before the matching on_token, on the same thread.
          .on_logprob =
              [this](float logprob, std::span<const TopLogprob> top) {
                pending_logprob_ = logprob;
                pending_top_.assign(top.begin(), top.end());
              },
          .on_prefill_progress = progress_wanted_
                                     ? std::function<void(int64_t)>([this](int64_t ready) {
                                         OnPrefillProgress(ready, /*queued=*/false);
                                       })
                                     : nullptr,
          .on_queued = progress_wanted_ ? std::function<void()>(
                                              [this] { OnPrefillProgress(0, /*queued=*/true); })
                                        : nullptr,
          .on_done = [this](const absl::Status& s, const RequestResult& r) { OnEngineDone(s, r); }};
      auto id = ctx_.engine->SubmitPrepared(std::move(*prepared));
      if (id.ok() && ctx_.after_submit_for_test) ctx_.after_submit_for_test();
      if (id.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          submitted_ = true;
          engine_id_ = *id;
          if (!engine_done_) {
            if (!ctx_.tracker->Track(*id)) {  // shutdown began after the check above
              AbortLocked(ShuttingDown());
              cancel_engine_ = true;
            }
            if (cancel_engine_) ctx_.engine->Cancel(*id);
          }
        }
        Pump();
        return;
      }
      status = id.status();  // the callbacks are not called when SubmitPrepared fails
    }
  }
  // Never reached the engine: end the call as the engine would have (this drops the reference
  // taken for preparation).
  OnEngineDone(status, RequestResult{});
}

void GenerateReactor::OnToken(int32_t id, std::string_view text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id >= 0) {
      const absl::Time now = MonotonicNow();
      if (ttft_ms_ < 0) {
        ttft_ms_ = absl::ToDoubleMilliseconds(now - arrival_);
        ctx_.metrics->ObserveTtft(ttft_ms_ / 1000);
      } else {
        ctx_.metrics->ObserveInterToken(absl::ToDoubleSeconds(now - last_token_));
      }
      last_token_ = now;
    }
    if (finish_wanted_) return;  // the call is ending; nothing more goes out
    if (static_cast<int>(queue_.size()) >= ctx_.max_buffered_tokens) {
      overflowed_ = true;
      AbortLocked(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("client too slow: more than ", ctx_.max_buffered_tokens,
                       " generated tokens waiting to be sent; the request was cancelled")));
      (void)CancelEngineLocked();  // tokens flow: the request left the pool long ago
    } else {
      v1::TokenChunk* chunk = queue_.emplace_back().mutable_token();
      chunk->set_token_id(id);
      chunk->set_text(ToValidUtf8(text));
      if (id >= 0 && pending_logprob_) {
        chunk->set_logprob(ReportedLogprob(*pending_logprob_));
        chunk->set_token_bytes(std::string(ctx_.tokenizer->TokenPiece(id)));
        for (const TopLogprob& t : pending_top_) {
          v1::TopLogprob* entry = chunk->add_top_logprobs();
          entry->set_token_id(t.token_id);
          entry->set_logprob(ReportedLogprob(t.logprob));
          entry->set_token_bytes(std::string(ctx_.tokenizer->TokenPiece(t.token_id)));
        }
      }
    }
  }
  Pump();
}

void GenerateReactor::OnPrefillProgress(int64_t prompt_tokens_ready, bool queued) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = MonotonicNow();
    // Throttled, and only while nothing else waits to go out (a queued message says as much).
    if (finish_wanted_ || !queue_.empty() ||
        now - last_progress_ < absl::Milliseconds(kPrefillProgressIntervalMs)) {
      return;
    }
    last_progress_ = now;
    lazyattn::v1::PrefillProgress* progress = queue_.emplace_back().mutable_prefill_progress();
    progress->set_prompt_tokens_ready(prompt_tokens_ready);
    progress->set_queued(queued);
  }
  Pump();
}

void GenerateReactor::OnEngineDone(const absl::Status& status, const RequestResult& result) {
  grpc::StatusCode counted;
  double ttft_ms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    engine_done_ = true;
    if (submitted_) ctx_.tracker->Untrack(engine_id_);
    grpc::Status final_status = ToGrpcStatus(status);
    if (status.ok()) {
      if (ttft_ms_ < 0) ttft_ms_ = absl::ToDoubleMilliseconds(MonotonicNow() - arrival_);
    } else if (absl::IsCancelled(status) && !client_cancelled_ && !overflowed_ &&
               ctx_.tracker->draining()) {
      final_status = ShuttingDown();  // the router may retry elsewhere
    }
    if (!finish_wanted_) {
      if (status.ok()) {
        v1::Final* f = queue_.emplace_back().mutable_final();
        f->set_finish_reason(result.finish_reason);
        UsageToProto(result.usage, f->mutable_usage());
        f->set_ttft_ms(ttft_ms_);
        f->set_worker(ctx_.worker_id);
        f->set_attempts(1);
        f->set_text(ToValidUtf8(result.text));
      }
      finish_wanted_ = true;
      final_status_ = final_status;
      handed_back_ = IsHandedBack(status);
    }
    if (overflowed_) {
      counted = grpc::StatusCode::RESOURCE_EXHAUSTED;
    } else if (client_cancelled_) {
      // The client's own deadline fires a little before ours (ours counts from arrival).
      counted = MonotonicNow() >= deadline_ - absl::Milliseconds(100)
                    ? grpc::StatusCode::DEADLINE_EXCEEDED
                    : grpc::StatusCode::CANCELLED;
    } else {
      counted = final_status_.error_code();
    }
    ttft_ms = ttft_ms_;
  }
  ctx_.metrics->CountRequest(counted);
  ctx_.metrics->ObserveFinished(status.ok(), result,
                                absl::ToDoubleSeconds(MonotonicNow() - arrival_));
  LogEnd(counted, status, result, ttft_ms);
  Pump();
  Unref();
}

// One line per request that reached preparation, under the router's request id, so the
// router's access line and this one are found together. A client's cancellation is routine (the
// router cancels the losers of a failover, clients go away): info, as success is.
void GenerateReactor::LogEnd(grpc::StatusCode counted, const absl::Status& status,
                             const RequestResult& result, double ttft_ms) const {
  const bool routine = counted == grpc::StatusCode::OK || counted == grpc::StatusCode::CANCELLED;
  if (!LogEnabled(routine ? LogLevel::kInfo : LogLevel::kWarning)) return;
  const RequestEndLogFields fields = RequestEndLogFieldsOf(status, result, ttft_ms);
  LogLine line(routine ? LogLevel::kInfo : LogLevel::kWarning, "worker");
  line.Str("request_id", request_id_)
      .Str("status", StatusCodeName(counted))
      .Int("prompt_tokens", result.usage.prompt_tokens)
      .Int("cached_tokens", result.usage.cached_tokens)
      .Int("tokens", static_cast<int64_t>(result.token_ids.size()));
  if (fields.ttft_s.has_value()) line.Num("ttft_s", *fields.ttft_s);
  line.Num("duration_s", absl::ToDoubleSeconds(MonotonicNow() - arrival_));
  if (fields.finish_reason.has_value()) line.Str("finish_reason", *fields.finish_reason);
  if (fields.error.has_value()) line.Str("error", *fields.error);
  line.Msg("request");
}

void GenerateReactor::OnWriteDone(bool ok) {
  bool preparing = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the stream is broken: the client went away
      client_cancelled_ = true;
      AbortLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed by the client"));
      preparing = CancelEngineLocked();
    }
  }
  if (preparing) prep_.Cancel();
  Pump();
}

void GenerateReactor::OnCancel() {
  bool preparing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    client_cancelled_ = true;
    AbortLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
    preparing = CancelEngineLocked();
  }
  // Still queued for tokenization: out of the queue now (its slot is free at once, and the call
  // ends without waiting for a pool thread; Prepare(Cancelled) runs here). Otherwise Prepare has
  // started and sees the cancellation.
  if (preparing) prep_.Cancel();
  Pump();
}

void GenerateReactor::OnSendInitialMetadataDone(bool ok) {
  if (ok) headers_sent_.store(true);
}

void GenerateReactor::OnDone() { Unref(); }

void GenerateReactor::Pump() {
  const v1::GenerateResponse* next = nullptr;
  bool finish = false;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      next = &in_flight_;
    } else if (finish_wanted_) {
      finished_ = true;
      finish = true;
      status = final_status_;
      if (handed_back_) call_->AddTrailingMetadata(kWorkerHandedBackKey, kWorkerHandedBackValue);
    }
  }
  if (next != nullptr) StartWrite(next);
  if (finish) Finish(status);
}

void GenerateReactor::AbortLocked(const grpc::Status& status) {
  queue_.clear();
  if (finish_wanted_) return;
  finish_wanted_ = true;
  final_status_ = status;
}

bool GenerateReactor::CancelEngineLocked() {
  if (engine_done_) return false;
  if (submitted_) {
    ctx_.engine->Cancel(engine_id_);
    return false;
  }
  cancel_engine_ = true;  // Prepare cancels once SubmitPrepared has returned the id
  return true;
}

void GenerateReactor::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace lazyattn
