#include "services/worker/server/worker_service.h"

#include "common/log.h"
#include "common/worker_call_trailer.h"
#include "kernels/include/sampling.h"
#include "services/worker/model/tokenizer/chat_template.h"
#include "services/worker/server/generate_reactor.h"
#include "services/worker/server/prefetch_reactor.h"

namespace lazyattn {

WorkerService::WorkerService(Engine* engine, const Tokenizer* tokenizer, WorkerMetrics* metrics,
                             const WorkerServiceOptions& options)
    : prep_(options.prep) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_.engine = engine;
  ctx_.tokenizer = tokenizer;
  ctx_.metrics = metrics;
  ctx_.tracker = &tracker_;
  ctx_.prep = &prep_;
  ctx_.limits = options.limits;
  ctx_.limits.max_documents = options.max_documents;
  ctx_.convert.default_max_tokens = options.default_max_tokens;
  ctx_.max_buffered_tokens = options.max_buffered_tokens;
  ctx_.worker_id = options.worker_id;
  ctx_.model_key = ExpectedModelValue(engine->identity().model_fingerprint,
                                      engine->identity().tokenizer_fingerprint);
  ctx_.abort_on_prompt_marker = options.abort_on_prompt_marker;
  ctx_.after_submit_for_test = options.after_submit_for_test;

  const ModelConfig& config = engine->config();
  model_info_.set_name(options.model_name.empty() ? config.name : options.model_name);
  model_info_.set_model_fingerprint(engine->identity().model_fingerprint);
  model_info_.set_tokenizer_fingerprint(engine->identity().tokenizer_fingerprint);
  model_info_.set_vocab_size(config.vocab_size);
  model_info_.set_max_context_tokens(config.max_positions);
  model_info_.set_max_documents(options.max_documents);
  model_info_.set_max_top_logprobs(kMaxTopLogprobs);
  model_info_.set_max_logit_bias(options.limits.max_logit_bias);
  ctx_.served_model =
      ServedModelNames{.name = model_info_.name(),
                       .model_fingerprint = model_info_.model_fingerprint(),
                       .tokenizer_fingerprint = model_info_.tokenizer_fingerprint()};
  if (!tokenizer->chat_template().empty()) {
    auto tmpl = ChatTemplate::FromJinja(tokenizer->chat_template());
    if (tmpl.ok()) {
      model_info_.set_chat_template(tmpl->name());
    } else {
      // Every request that asks for the template (`messages`, or `chat`) will be refused
      // (request_convert.cc); say so once, where the operator looks, rather than only in each
      // client's error.
      LogWarning("worker")
          .Str("reason", std::string(tmpl.status().message()).substr(0, 300))
          .Msg(
              "the model's chat template is not one this worker renders: requests with "
              "messages or chat will be refused; plain prompts are served");
    }
  }
}

grpc::ServerWriteReactor<v1::GenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateReactor(this->context(), context, *request);
}

grpc::ServerUnaryReactor* WorkerService::Prefetch(grpc::CallbackServerContext* context,
                                                  const v1::PrefetchRequest* request,
                                                  v1::PrefetchResponse* response) {
  return new PrefetchReactor(this->context(), context, *request, response);
}

grpc::ServerUnaryReactor* WorkerService::Status(grpc::CallbackServerContext* context,
                                                const v1::WorkerStatusRequest* /*request*/,
                                                v1::WorkerStatus* response) {
  *response = CurrentStatus();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

ServiceContext WorkerService::context() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ctx_;
}

void WorkerService::set_identity(const std::string& worker_id, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_.worker_id = worker_id;
  address_ = address;
}

v1::WorkerLoad WorkerService::CurrentLoad() const {
  Engine* engine = context().engine;
  const EngineLoad load = engine->load();
  const KvBlockCounts blocks = engine->blocks();
  v1::WorkerLoad out;
  out.set_queued_prefill_tokens(load.queued_prefill_tokens);
  out.set_running_requests(load.running);
  out.set_waiting_requests(load.waiting);
  out.set_free_blocks(blocks.free + blocks.cached);  // cached blocks are evictable
  out.set_total_blocks(blocks.total);
  return out;
}

v1::WorkerStatus WorkerService::CurrentStatus() const {
  v1::WorkerStatus s;
  Engine* engine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.set_worker_id(ctx_.worker_id);
    s.set_address(address_);
    engine = ctx_.engine;
  }
  *s.mutable_model() = model_info_;
  *s.mutable_load() = CurrentLoad();
  const KvBlockCounts blocks = engine->blocks();
  s.set_referenced_blocks(blocks.referenced);
  s.set_cached_blocks(blocks.cached);
  s.set_cached_documents(
      static_cast<int64_t>(engine->CachedDocuments().documents.size()));
  return s;
}

void WorkerService::Drain() {
  Engine* engine = context().engine;
  for (uint64_t id : tracker_.Drain()) engine->Cancel(id);
}

}  // namespace lazyattn
