#include "services/router/server/fake_cluster_for_test.h"

#include <prometheus/registry.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/document_key.h"
#include "common/log.h"
#include "common/worker_call_trailer.h"

namespace lazyattn::router::testing {
namespace {

std::unique_ptr<grpc::Server> StartOnLocalhost(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  auto server = builder.BuildAndStart();
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

}  // namespace

DocumentKey TextKey(const std::string& text) {
  return DocumentKeyFromText(kModelFp, kTokenizerFp, text);
}

RouterOptions RouterOptionsForFakeKvdir(const std::string& kvdir_address) {
  RouterOptions o;
  o.server.listen_address = "127.0.0.1:0";
  o.kvdir.address = kvdir_address;
  o.kvdir.lookup_timeout = absl::Seconds(10);
  o.kvdir.list_timeout = absl::Seconds(10);
  o.kvdir.refresh_interval = absl::Hours(1);
  return o;
}

absl::StatusOr<std::unique_ptr<RouterServer>> StartOneWorkerRouter(FakeWorker& worker,
                                                                   FakeKvdir& kvdir) {
  worker.Start();
  kvdir.Start();
  kvdir.SetWorkers({worker.Status()});
  return RouterServer::Create(RouterOptionsForFakeKvdir(kvdir.address()),
                              std::make_shared<prometheus::Registry>());
}

bool WaitFor(const std::function<bool()>& cond, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cond();
}

// --- FakeWorker ------------------------------------------------------------------------------

FakeWorker::FakeWorker(std::string id) : id_(std::move(id)) {}
FakeWorker::~FakeWorker() { Stop(); }

void FakeWorker::Start() { server_ = StartOnLocalhost(this, &address_); }

void FakeWorker::Stop() {
  Unblock();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }
}

lazyattn::v1::WorkerStatus FakeWorker::Status() const {
  lazyattn::v1::WorkerStatus s;
  s.set_worker_id(id_);
  s.set_address(address_);
  auto* m = s.mutable_model();
  m->set_name("fake-model");
  m->set_model_fingerprint(kModelFp);
  m->set_tokenizer_fingerprint(kTokenizerFp);
  m->set_vocab_size(1000);
  m->set_max_context_tokens(8192);
  m->set_max_documents(32);
  m->set_chat_template("smollm2");
  absl::MutexLock lock(&mu_);
  m->set_max_top_logprobs(max_top_logprobs_);
  m->set_max_logit_bias(max_logit_bias_);
  return s;
}

void FakeWorker::SetMaxLogitBias(int n) {
  absl::MutexLock lock(&mu_);
  max_logit_bias_ = n;
}

void FakeWorker::SetMaxTopLogprobs(int n) {
  absl::MutexLock lock(&mu_);
  max_top_logprobs_ = n;
}

void FakeWorker::SetScript(const Script& script) {
  absl::MutexLock lock(&mu_);
  script_ = script;
}

void FakeWorker::Unblock() {
  absl::MutexLock lock(&mu_);
  unblocked_ = true;
}

int FakeWorker::generate_calls() const {
  absl::MutexLock lock(&mu_);
  return generate_calls_;
}

int FakeWorker::prefetch_calls() const {
  absl::MutexLock lock(&mu_);
  return prefetch_calls_;
}

std::vector<lazyattn::v1::GenerateRequest> FakeWorker::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

std::vector<std::string> FakeWorker::cache_namespaces() const {
  absl::MutexLock lock(&mu_);
  return cache_namespaces_;
}

std::vector<std::string> FakeWorker::request_ids() const {
  absl::MutexLock lock(&mu_);
  return request_ids_;
}

namespace {

std::string MetadataSent(const grpc::ServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(key);
  return it == metadata.end() ? "(none)" : std::string(it->second.data(), it->second.size());
}

std::string CacheNamespaceSent(const grpc::ServerContext& context) {
  return MetadataSent(context, kCacheNamespaceMetadata);
}

}  // namespace

lazyattn::v1::GenerateRequest FakeWorker::last_request() const {
  absl::MutexLock lock(&mu_);
  return last_request_;
}

lazyattn::v1::PrefetchRequest FakeWorker::last_prefetch_request() const {
  absl::MutexLock lock(&mu_);
  return last_prefetch_request_;
}

bool FakeWorker::WaitForCalls(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return generate_calls_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

bool FakeWorker::WaitForCancellation(absl::Duration timeout, int n) const {
  absl::MutexLock lock(&mu_);
  auto seen = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return cancellations_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
}

int FakeWorker::cancellations() const {
  absl::MutexLock lock(&mu_);
  return cancellations_;
}

int FakeWorker::progress_events() const {
  absl::MutexLock lock(&mu_);
  return progress_events_;
}

bool FakeWorker::WaitUntilUnblocked(grpc::ServerContext* context) {
  absl::MutexLock lock(&mu_);
  while (!unblocked_ && !context->IsCancelled()) {
    mu_.AwaitWithTimeout(absl::Condition(&unblocked_), absl::Milliseconds(5));
  }
  if (!context->IsCancelled()) return true;
  ++cancellations_;
  return false;
}

grpc::Status FakeWorker::ClientGone() {
  absl::MutexLock lock(&mu_);
  ++cancellations_;
  return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
}

grpc::Status FakeWorker::Generate(grpc::ServerContext* context,
                                  const lazyattn::v1::GenerateRequest* request,
                                  grpc::ServerWriter<lazyattn::v1::GenerateResponse>* writer) {
  // As a real worker does on every call it ends itself (common/worker_call_trailer.h).
  context->AddTrailingMetadata(kWorkerEndedCallKey, kWorkerEndedCallValue);
  Script script;
  {
    absl::MutexLock lock(&mu_);
    ++generate_calls_;
    last_request_ = *request;
    requests_.push_back(*request);
    cache_namespaces_.push_back(CacheNamespaceSent(*context));
    request_ids_.push_back(MetadataSent(*context, kRequestIdKey));
    script = script_;
  }
  if (script.fail_only_seed.has_value() &&
      (!request->sampling().has_seed() || request->sampling().seed() != *script.fail_only_seed)) {
    script.fail_before_first_token = grpc::StatusCode::OK;
    script.fail_after_tokens = -1;
  }
  if (script.fail_before_first_token != grpc::StatusCode::OK) {
    if (script.handed_back)
      context->AddTrailingMetadata(kWorkerHandedBackKey, kWorkerHandedBackValue);
    return grpc::Status(script.fail_before_first_token, "scripted failure before the first token");
  }
  if (script.block && !WaitUntilUnblocked(context)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  }
  if (script.prefill > absl::ZeroDuration()) {
    const auto& metadata = context->client_metadata();
    const bool progress = metadata.find(kPrefillProgressKey) != metadata.end();
    const absl::Time start = absl::Now();
    const absl::Time done = start + script.prefill;
    const absl::Time quiet_from = start + script.prefill_progress_for;
    absl::Time next_event = start + script.prefill_progress_every;
    int64_t ready = 0;
    while (absl::Now() < done && !context->IsCancelled()) {
      // Short sleeps, so a cancellation ends the call soon.
      absl::SleepFor(std::min({absl::Milliseconds(10), done - absl::Now()}));
      const absl::Time now = absl::Now();
      if (!progress || now >= done || now < next_event || now >= quiet_from) continue;
      next_event = now + script.prefill_progress_every;
      lazyattn::v1::GenerateResponse r;
      if (script.progress_queued) {
        r.mutable_prefill_progress()->set_queued(true);
      } else {
        if (!script.progress_stuck || ready == 0) ready += 100;
        r.mutable_prefill_progress()->set_prompt_tokens_ready(ready);
      }
      if (!writer->Write(r)) return ClientGone();
      absl::MutexLock lock(&mu_);
      ++progress_events_;
    }
    if (context->IsCancelled()) {
      absl::MutexLock lock(&mu_);
      ++cancellations_;
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled during the prefill");
    }
  }
  if (script.tokens_name_the_seed) {
    const std::string seed =
        request->sampling().has_seed() ? absl::StrCat(request->sampling().seed()) : "-";
    for (std::string& token : script.tokens) absl::StrAppend(&token, "#", seed);
  }
  std::string text;
  const size_t cycle = script.tokens.size();
  for (size_t n = 0; n < cycle || (script.endless && cycle > 0); ++n) {
    const size_t i = n % cycle;
    if (script.endless && i == 0 && n > 0) text.clear();  // bounded memory; no final comes
    if (script.fail_after_tokens >= 0 && static_cast<int>(i) == script.fail_after_tokens) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted crash mid-stream");
    }
    if (script.unparsable_after_tokens >= 0 &&
        static_cast<int>(i) == script.unparsable_after_tokens) {
      lazyattn::v1::GenerateResponse bad;
      bad.mutable_token()->set_token_id(script.first_token_id + static_cast<int32_t>(i));
      bad.mutable_token()->set_text("\xff\xfe");  // proto3 `string`: the reader refuses it
      writer->Write(bad);
      if (!WaitUntilUnblocked(context)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled after an unparsable message");
      }
      return grpc::Status::OK;
    }
    if (script.block_after_tokens >= 0 && static_cast<int>(i) == script.block_after_tokens &&
        !WaitUntilUnblocked(context)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled mid-stream");
    }
    if (i > 0 && script.token_interval > absl::ZeroDuration()) {
      absl::SleepFor(script.token_interval);
    }
    lazyattn::v1::GenerateResponse r;
    r.mutable_token()->set_token_id(script.first_token_id + static_cast<int32_t>(i));
    r.mutable_token()->set_text(script.tokens[i]);
    if (request->sampling().logprobs()) {
      const float logprob = -0.5f * static_cast<float>(i + 1);
      r.mutable_token()->set_logprob(logprob);
      r.mutable_token()->set_token_bytes(script.tokens[i]);
      for (int j = 0; j < request->sampling().top_logprobs(); ++j) {
        lazyattn::v1::TopLogprob* t = r.mutable_token()->add_top_logprobs();
        t->set_token_id(j == 0 ? r.token().token_id() : kAlternativeIds + j);
        t->set_logprob(logprob - static_cast<float>(j));
        t->set_token_bytes(j == 0 ? script.tokens[i] : absl::StrCat("alt", j));
      }
    }
    if (script.edit_token) script.edit_token(static_cast<int>(i), r.mutable_token());
    text += script.tokens[i];
    if (!writer->Write(r)) return ClientGone();
    if (script.progress_between_tokens &&
        context->client_metadata().count(kPrefillProgressKey) != 0) {
      lazyattn::v1::GenerateResponse progress;
      progress.mutable_prefill_progress()->set_prompt_tokens_ready(1);
      if (!writer->Write(progress)) return ClientGone();
      absl::MutexLock lock(&mu_);
      ++progress_events_;
    }
  }
  if (!script.held_back_tail.empty()) {
    lazyattn::v1::GenerateResponse r;
    r.mutable_token()->set_token_id(-1);
    r.mutable_token()->set_text(script.held_back_tail);
    text += script.held_back_tail;
    if (!writer->Write(r)) return ClientGone();
  }
  lazyattn::v1::GenerateResponse last;
  auto* final = last.mutable_final();
  final->set_finish_reason("stop");
  final->set_text(script.final_text.value_or(text));
  final->set_worker("worker-internal-name");
  final->set_ttft_ms(1.5);
  final->mutable_usage()->set_documents(request->documents_size());
  final->mutable_usage()->set_completion_tokens(static_cast<int64_t>(script.tokens.size()));
  final->mutable_usage()->set_document_hit_tokens(script.document_hit_tokens);
  if (script.document_copied_tokens) {
    final->mutable_usage()->set_document_copied_tokens(*script.document_copied_tokens);
  }
  if (!writer->Write(last)) return ClientGone();
  for (const lazyattn::v1::GenerateResponse& extra : script.after_final) {
    if (!writer->Write(extra)) return ClientGone();
  }
  if (script.block_after_final && !WaitUntilUnblocked(context)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled after the final message");
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Prefetch(grpc::ServerContext* context,
                                  const lazyattn::v1::PrefetchRequest* request,
                                  lazyattn::v1::PrefetchResponse* response) {
  Script script;
  {
    absl::MutexLock lock(&mu_);
    ++prefetch_calls_;
    last_prefetch_request_ = *request;
    cache_namespaces_.push_back(CacheNamespaceSent(*context));
    script = script_;
  }
  if (script.fail_before_first_token != grpc::StatusCode::OK) {
    return grpc::Status(script.fail_before_first_token, "scripted prefetch failure");
  }
  if (script.block && !WaitUntilUnblocked(context)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "prefetch cancelled while blocked");
  }
  response->add_workers(id_);
  for (const auto& d : request->documents())
    response->set_computed_tokens(response->computed_tokens() +
                                  static_cast<int64_t>(d.text().size()));
  if (script.prefetch_computed_tokens.has_value()) {
    response->set_computed_tokens(*script.prefetch_computed_tokens);
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Status(grpc::ServerContext*, const lazyattn::v1::WorkerStatusRequest*,
                                lazyattn::v1::WorkerStatus* response) {
  *response = Status();
  return grpc::Status::OK;
}

// --- FakeKvdir -------------------------------------------------------------------------------

FakeKvdir::~FakeKvdir() { Stop(); }

void FakeKvdir::Start() { server_ = StartOnLocalhost(this, &address_); }

absl::Status FakeKvdir::StartTls(const TlsOptions& tls) {
  auto built = StartGrpcServer({.listen_address = "127.0.0.1:0", .tls = tls}, {this});
  if (!built.ok()) return built.status();
  server_ = std::move(built->server);
  address_ = absl::StrCat("127.0.0.1:", built->port);
  return absl::OkStatus();
}

void FakeKvdir::Stop() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }
}

void FakeKvdir::SetWorkers(const std::vector<lazyattn::v1::WorkerStatus>& workers) {
  absl::MutexLock lock(&mu_);
  workers_ = workers;
}

void FakeKvdir::Hold(const std::string& worker_id, const std::string& text, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  held_[worker_id][TextKey(text)] = tokens;
}

void FakeKvdir::SetHang(bool hang) {
  absl::MutexLock lock(&mu_);
  hang_ = hang;
}

void FakeKvdir::SetMaxKeysPerLookup(int max_keys) {
  absl::MutexLock lock(&mu_);
  max_keys_ = max_keys;
}

int FakeKvdir::lookups() const {
  absl::MutexLock lock(&mu_);
  return lookups_;
}

int FakeKvdir::listings() const {
  absl::MutexLock lock(&mu_);
  return listings_;
}

grpc::Status FakeKvdir::Lookup(grpc::ServerContext* context,
                               const lazyattn::v1::LookupRequest* request,
                               lazyattn::v1::LookupResponse* response) {
  bool hang;
  {
    absl::MutexLock lock(&mu_);
    ++lookups_;
    hang = hang_;
    if (max_keys_ > 0 && request->keys_size() > max_keys_) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("keys: ", request->keys_size(), " keys, the limit is ",
                                       max_keys_, " (limits.max_keys_per_lookup)"));
    }
  }
  if (hang) {
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "hung until the deadline");
  }
  absl::MutexLock lock(&mu_);
  for (const auto& status : workers_) {
    auto* w = response->add_workers();
    *w->mutable_worker() = status;
    const auto& held = held_[status.worker_id()];
    for (const auto& key : request->keys()) {
      auto it = held.find(DocumentKey{key.hi(), key.lo()});
      w->add_resident(it != held.end());
      if (it != held.end()) w->set_resident_tokens(w->resident_tokens() + it->second);
    }
  }
  return grpc::Status::OK;
}

grpc::Status FakeKvdir::ListWorkers(grpc::ServerContext*, const lazyattn::v1::ListWorkersRequest*,
                                    lazyattn::v1::ListWorkersResponse* response) {
  absl::MutexLock lock(&mu_);
  ++listings_;
  for (const auto& status : workers_) *response->add_workers()->mutable_worker() = status;
  return grpc::Status::OK;
}

}  // namespace lazyattn::router::testing
