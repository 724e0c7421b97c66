#include "services/worker/server/prefetch_reactor.h"

#include <utility>

#include "common/grpc_util.h"

namespace lazyattn {

PrefetchReactor::PrefetchReactor(const ServiceContext& ctx, grpc::CallbackServerContext* call,
                                 const v1::PrefetchRequest& request,
                                 v1::PrefetchResponse* response)
    : ctx_(ctx), response_(response) {
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
  auto converted = PrefetchEngineRequest(request);
  if (!converted.ok()) {
    reject(ToGrpcStatus(converted.status()));
    return;
  }
  converted->deadline = DeadlineOf(call->deadline());
  refs_.fetch_add(1);
  RequestCallbacks callbacks{
      .on_done = [this](const absl::Status& s, const RequestResult& r) { OnEngineDone(s, r); }};
  auto id = ctx_.engine->Submit(*converted, std::move(callbacks));
  if (!id.ok()) {
    refs_.fetch_sub(1);
    reject(ToGrpcStatus(id.status()));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  submitted_ = true;
  engine_id_ = *id;
  if (engine_done_) return;
  if (!ctx_.tracker->Track(*id)) cancel_engine_ = true;
  if (cancel_engine_) ctx_.engine->Cancel(*id);
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
  std::lock_guard<std::mutex> lock(mu_);
  client_cancelled_ = true;
  if (engine_done_) return;
  if (submitted_) {
    ctx_.engine->Cancel(engine_id_);
  } else {
    cancel_engine_ = true;
  }
}

void PrefetchReactor::OnDone() { Unref(); }

void PrefetchReactor::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace lazyattn
