#include "services/router/server/inference_service.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_util.h"
#include "services/router/server/admission.h"
#include "services/router/server/forwarding_call.h"
#include "services/router/server/model_groups.h"
#include "services/router/server/prefetch_call.h"
#include "common/request_validator.h"

namespace lazyattn::router {
namespace {

using lazyattn::v1::CompleteResponse;
using lazyattn::v1::Final;
using lazyattn::v1::GenerateRequest;
using lazyattn::v1::GenerateResponse;

// The slowest a client may take a message (a Generate token, a Complete answer) before its write
// counts as waiting on it (64 KiB/s: the HTTP front's default http.min_send_bytes_per_s): a
// token with many alternatives or a Complete answer of megabytes gets its bytes' time first.
constexpr double kMinAnswerBytesPerSecond = 64 << 10;

absl::Duration AtMinimumRate(const google::protobuf::Message& message) {
  return absl::Seconds(static_cast<double>(message.ByteSizeLong()) / kMinAnswerBytesPerSecond);
}

class GenerateReactor final : public grpc::ServerWriteReactor<GenerateResponse>,
                              public ForwardingCall {
 public:
  GenerateReactor(RouterContext* router, KeyLimiter* key_limiter,
                  grpc::CallbackServerContext* context, const GenerateRequest* request)
      : ForwardingCall(router, context, request) {
    // Admission is shared with the HTTP API (admission.h); its refusals are already counted.
    grpc::Status s =
        AdmitRequest(router, key_limiter, ApiKeyNameOf(*context), *request, &admission_);
    if (!s.ok()) {
      Finish(s);
      return;
    }
    if (ClientWriteWatch* watch = router->write_watch()) {
      watch_ = watch->Watch(context, request_id(), CutByTheRouter());
    }
    Begin();
  }

  void OnWriteDone(bool ok) override {
    if (watch_ != nullptr) watch_->WriteDone();
    ClientWriteDone(ok);
  }
  void OnCancel() override { ClientCancelled(); }
  void OnDone() override {
    if (watch_ != nullptr) watch_->Close();
    delete this;
  }

 private:
  void DeliverToken(const GenerateResponse& token) override {
    out_ = token;
    if (watch_ != nullptr) watch_->WriteStarted(AtMinimumRate(out_));
    StartWrite(&out_);
  }
  void DeliverEnd(const grpc::Status& status, const Final* final) override {
    if (status.ok() && final != nullptr) {
      out_.Clear();
      *out_.mutable_final() = *final;
      if (watch_ != nullptr) watch_->WriteStarted(AtMinimumRate(out_));  // done with OnDone
      StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(status);
    }
  }
  bool StreamsToClient() const override { return true; }

  // Cuts the call when its client stops reading, or reads too slowly
  // (routing.client_write_timeout_ms and routing.client_write_wait_budget_ms); closed in OnDone,
  // before the context goes away.
  std::shared_ptr<ClientWriteWatch::Stream> watch_;
  GenerateResponse out_;
  AdmissionTicket admission_;  // given back with the reactor
};

class CompleteReactor final : public grpc::ServerUnaryReactor, public ForwardingCall {
 public:
  CompleteReactor(RouterContext* router, KeyLimiter* key_limiter,
                  grpc::CallbackServerContext* context, const GenerateRequest* request,
                  CompleteResponse* response)
      : ForwardingCall(router, context, request), response_(response) {
    // Admission is shared with the HTTP API (admission.h); its refusals are already counted.
    grpc::Status s =
        AdmitRequest(router, key_limiter, ApiKeyNameOf(*context), *request, &admission_);
    if (!s.ok()) {
      Finish(s);
      return;
    }
    if (ClientWriteWatch* watch = router->write_watch()) {
      watch_ = watch->Watch(context, request_id(), CutByTheRouter());
    }
    Begin();
  }

  void OnCancel() override { ClientCancelled(); }
  void OnDone() override {
    if (watch_ != nullptr) watch_->Close();
    delete this;
  }

 private:
  void DeliverToken(const GenerateResponse& token) override {
    // A worker's last chunk may carry only text it held back (token_id -1: an incomplete UTF-8
    // sequence or a possible stop string released at the end): text, never an id.
    if (token.token().token_id() >= 0) {
      token_ids_.push_back(token.token().token_id());
      if (token.token().has_logprob()) {
        logprobs_.push_back(token.token().logprob());
        token_bytes_.push_back(token.token().token_bytes());
      }
      if (!token.token().top_logprobs().empty()) {
        lazyattn::v1::TopLogprobs& top = top_logprobs_.emplace_back();
        *top.mutable_entries() = token.token().top_logprobs();
      }
    }
    ClientWriteDone(true);
  }
  void DeliverEnd(const grpc::Status& status, const Final* final) override {
    if (status.ok() && final != nullptr) {
      response_->set_text(final->text());  // the tokens' text (ForwardingCall sets it)
      response_->mutable_token_ids()->Assign(token_ids_.begin(), token_ids_.end());
      // One per token id, or none (a worker sends a logprob with every token or with none).
      if (logprobs_.size() == token_ids_.size()) {
        response_->mutable_logprobs()->Assign(logprobs_.begin(), logprobs_.end());
        response_->mutable_token_bytes()->Assign(token_bytes_.begin(), token_bytes_.end());
      }
      // Likewise for the alternatives: one list per token id, or none.
      if (top_logprobs_.size() == token_ids_.size()) {
        response_->mutable_top_logprobs()->Reserve(static_cast<int>(top_logprobs_.size()));
        for (lazyattn::v1::TopLogprobs& top : top_logprobs_) {
          *response_->add_top_logprobs() = std::move(top);
        }
      }
      *response_->mutable_final() = *final;
    }
    // The answer is one write, done with the call (OnDone): a client that never reads an answer
    // larger than its flow-control window and gRPC's write buffer would otherwise hold its
    // admission slot until its deadline, which may be none. A large answer (top log-probabilities
    // of thousands of tokens: megabytes) first gets its time at kMinAnswerBytesPerSecond, as the
    // HTTP front gives one that is not streamed (http.min_send_bytes_per_s).
    if (watch_ != nullptr) watch_->WriteStarted(AtMinimumRate(*response_));
    Finish(status);
  }
  bool StreamsToClient() const override { return false; }
  void DiscardPartial() override {
    token_ids_.clear();
    logprobs_.clear();
    token_bytes_.clear();
    top_logprobs_.clear();
  }

  // Cuts the call when its client does not read the answer (routing.client_write_timeout_ms
  // and routing.client_write_wait_budget_ms); closed in OnDone, before the context goes away.
  std::shared_ptr<ClientWriteWatch::Stream> watch_;
  CompleteResponse* const response_;
  std::vector<int32_t> token_ids_;
  std::vector<float> logprobs_;
  std::vector<std::string> token_bytes_;                 // with each logprob
  std::vector<lazyattn::v1::TopLogprobs> top_logprobs_;  // of each token that carried some
  AdmissionTicket admission_;                            // given back with the reactor
};

}  // namespace

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const GenerateRequest* request) {
  return new GenerateReactor(router_, key_limiter_, context, request);
}

grpc::ServerUnaryReactor* InferenceService::Complete(grpc::CallbackServerContext* context,
                                                     const GenerateRequest* request,
                                                     CompleteResponse* response) {
  return new CompleteReactor(router_, key_limiter_, context, request, response);
}

grpc::ServerUnaryReactor* InferenceService::Prefetch(grpc::CallbackServerContext* context,
                                                     const lazyattn::v1::PrefetchRequest* request,
                                                     lazyattn::v1::PrefetchResponse* response) {
  return new PrefetchReactor(router_, context, request, response);
}

grpc::ServerUnaryReactor* InferenceService::GetModelInfo(
    grpc::CallbackServerContext* context, const lazyattn::v1::GetModelInfoRequest* /*request*/,
    lazyattn::v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::vector<ModelGroup> groups = router_->registry().Models();
  if (groups.empty()) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "no live worker has reported its model yet"));
    return reactor;
  }
  // A worker may take fewer documents than the router's limit; the client gets the smaller.
  const int limit = router_->options().limits.max_documents;
  auto max_documents = [limit](const lazyattn::v1::ModelInfo& m) {
    return m.max_documents() > 0 ? std::min(m.max_documents(), limit) : limit;
  };
  // The router sends a request with a logit bias only to workers that apply as many entries
  // (forwarding_call.cc): a client may send what the group's best worker applies, within the
  // router's own limit, whichever worker reported first.
  const std::vector<WorkerInfo> workers = router_->registry().Snapshot();
  auto max_logit_bias = [&](const ModelGroup& g) {
    int best = 0;
    for (const WorkerInfo& w : workers) {
      if (w.reported && ModelKeyOf(w.status.model()) == g.key) {
        best = std::max(best, w.status.model().max_logit_bias());
      }
    }
    return std::min(best, router_->options().limits.max_logit_bias);
  };
  for (const ModelGroup& g : groups) {
    lazyattn::v1::ModelInfo* m = response->add_models();
    *m = g.info;
    m->set_max_documents(max_documents(g.info));
    m->set_max_logit_bias(max_logit_bias(g));
  }
  if (groups.size() == 1) {
    // The fields a single-model client has always read, besides the list.
    google::protobuf::RepeatedPtrField<lazyattn::v1::ModelInfo> models;
    models.Swap(response->mutable_models());
    *response = models.Get(0);
    response->mutable_models()->Swap(&models);
  } else {
    response->set_max_documents(limit);
  }
  response->set_workers(router_->registry().LiveCount());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace lazyattn::router
