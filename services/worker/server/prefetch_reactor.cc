#include "services/worker/server/prefetch_reactor.h"

#include <utility>

#include "common/grpc_util.h"
#include "common/monotonic_time.h"
#include "common/request_validator.h"

namespace lazyattn {

PrefetchReactor::PrefetchReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                                 const v1::PrefetchRequest& request,
                                 v1::PrefetchResponse* response)
    : ctx_(ctx), response_(response), deadline_(DeadlineOf(call->deadline())), prep_(ctx.prep) {
  auto reject = [&](const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_done_ = true;
    }
    Finish(status);
  };
  if (ctx_.tracker->draining()) {
    reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down"));
    return;
  }
  if (auto other = RefuseOtherModel(*call, ctx_.model_key)) {
    reject(*other);
    return;
  }
  const absl::Status valid =
      ValidatePrefetchRequest(request, ctx_.limits, ctx_.engine->config().vocab_size);
  if (!valid.ok()) {
    ctx_.metrics->CountValidationFailure(valid);
    reject(ToGrpcStatus(valid));
    return;
  }
  if (absl::Status model = CheckCallsModel(*call, ctx_, request.model()); !model.ok()) {
    reject(ToGrpcStatus(model));
    return;
  }
  auto converted = PrefetchEngineRequest(request);
  if (!converted.ok()) {
    reject(ToGrpcStatus(converted.status()));
    return;
  }
  converted->deadline = deadline_;
  converted->cache_scope.cache_namespace = CacheNamespaceOf(*call);
  request_ = std::move(*converted);
  refs_.fetch_add(1);  // preparation's, handed on to the engine
  if (absl::Status queued = prep_.Submit([this](const absl::Status& s) { Prepare(s); },
                                         static_cast<int64_t>(request.ByteSizeLong()));
      !queued.ok()) {
    refs_.fetch_sub(1);  // the task is not called when Submit fails
    reject(ToGrpcStatus(queued));
  }
}

void PrefetchReactor::Prepare(const absl::Status& pool_status) {
  // A reference of its own throughout (GenerateReactor::Prepare says why).
  refs_.fetch_add(1);
  PrepareAndSubmit(pool_status);
  Unref();
}

void PrefetchReactor::PrepareAndSubmit(const absl::Status& pool_status) {
  absl::Status status = prep_.Start(pool_status);
  {
    // A cancel after Start (until the engine id is known) is this reactor's to apply.
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok() && cancel_engine_) {
      status = absl::CancelledError("cancelled while waiting for tokenization");
    }
  }
  if (status.ok() && ctx_.tracker->draining()) status = absl::UnavailableError("worker shutting down");
  if (status.ok() && MonotonicNow() >= deadline_) {
    status = absl::DeadlineExceededError(
        "deadline exceeded while the request waited for tokenization (engine.prep_threads busy)");
  }
  if (status.ok()) {
    auto prepared = ctx_.engine->Prepare(request_);
    request_ = EngineRequest();
    if (!prepared.ok()) {
      status = prepared.status();
    } else {
      prepared->callbacks = RequestCallbacks{
          .on_done = [this](const absl::Status& s, const RequestResult& r) { OnEngineDone(s, r); }};
      auto id = ctx_.engine->SubmitPrepared(std::move(*prepared));
      if (id.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        submitted_ = true;
        engine_id_ = *id;
        if (engine_done_) return;
        if (!ctx_.tracker->Track(*id)) cancel_engine_ = true;
        if (cancel_engine_) ctx_.engine->Cancel(*id);
        return;
      }
      status = id.status();
    }
  }
  OnEngineDone(status, RequestResult{});  // never reached the engine
}

void PrefetchReactor::OnEngineDone(const absl::Status& status, const RequestResult& result) {
  grpc::Status final_status = ToGrpcStatus(status);
  {
    std::lock_guard<std::mutex> lock(mu_);
    engine_done_ = true;
    if (submitted_) ctx_.tracker->Untrack(engine_id_);
    if (absl::IsCancelled(status) && !client_cancelled_ && ctx_.tracker->draining()) {
      final_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker shutting down");
    }
  }
  if (status.ok()) {
    const RequestUsage& u = result.usage;
    response_->add_workers(ctx_.worker_id);
    response_->set_computed_tokens(u.document_tokens - u.document_cached_tokens);
    response_->set_cached_tokens(u.document_cached_tokens);
  }
  Finish(final_status);
  Unref();
}

void PrefetchReactor::OnCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    client_cancelled_ = true;
    if (engine_done_) return;
    if (submitted_) {
      ctx_.engine->Cancel(engine_id_);
      return;
    }
    cancel_engine_ = true;  // Prepare cancels once SubmitPrepared has returned the id
  }
  prep_.Cancel();  // runs Prepare(Cancelled) here if still queued
}

void PrefetchReactor::OnDone() { Unref(); }

void PrefetchReactor::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace lazyattn
