// Test doubles for the router's tests: a fake worker (Worker service) and a fake KV directory
// (KvDirectory service), each a real gRPC server on 127.0.0.1 with an OS-chosen port. Their
// behaviour is scripted by the test; they record what they received.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_FAKE_CLUSTER_FOR_TEST_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_FAKE_CLUSTER_FOR_TEST_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/document_key.h"
#include "common/grpc_util.h"
#include "lazyattn/v1/kvdir.grpc.pb.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/router/server/router_options.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router::testing {

inline constexpr char kModelFp[] = "fake-model-fp";
inline constexpr char kTokenizerFp[] = "fake-tokenizer-fp";

DocumentKey TextKey(const std::string& text);

// A router's options in front of a FakeKvdir at `kvdir_address`: an OS-chosen port, directory
// timeouts a loaded test machine does not reach (it must not fall back), and no periodic refresh
// (the first listing, lookups and the tests' own refreshes keep the worker list).
RouterOptions RouterOptionsForFakeKvdir(const std::string& kvdir_address);

// Polls `cond` every 20 ms until it holds or `limit` has passed; its last value.
bool WaitFor(const std::function<bool()>& cond, absl::Duration limit = absl::Seconds(10));

class FakeWorker final : public lazyattn::v1::Worker::Service {
 public:
  struct Script {
    std::vector<std::string> tokens = {"Hello", ",", " world"};
    // Non-OK: returned before any token.
    grpc::StatusCode fail_before_first_token = grpc::StatusCode::OK;
    // With that failure, the trailer of a worker that did no work for the request (draining).
    bool handed_back = false;
    // >= 0: after this many tokens, fail with UNAVAILABLE.
    int fail_after_tokens = -1;
    // Wait for Unblock() (or the call's cancellation) before the first token (a Prefetch: before
    // its answer).
    bool block = false;
    // >= 0: after this many tokens, wait for Unblock() (or the call's cancellation), as a worker
    // that froze mid-generation (SIGSTOP) does.
    int block_after_tokens = -1;
    // After the tokens, sends them again and again (ids as the first time) until a write fails:
    // a stream no flow-control window holds, whatever the windows have grown to. No final.
    bool endless = false;
    // A pause before every token after the first (decode steps of a slow worker).
    absl::Duration token_interval = absl::ZeroDuration();
    // Non-empty: sent after the tokens as a text-only chunk with token_id -1, as a real worker
    // releases text it held back (a possible stop string, an incomplete UTF-8 sequence).
    std::string held_back_tail;
    // > 0: a prefill this long before the first token, sending a PrefillProgress event every
    // prefill_progress_every when the call asks for them (the router's metadata), none otherwise.
    absl::Duration prefill = absl::ZeroDuration();
    absl::Duration prefill_progress_every = absl::Milliseconds(50);
    // Events stop after this much of the prefill (a worker that froze mid-prefill).
    absl::Duration prefill_progress_for = absl::InfiniteDuration();
    // A PrefillProgress event after every token too, when asked for (out of place: they belong
    // before the first token; the router tolerates and drops them).
    bool progress_between_tokens = false;
    // Every PrefillProgress event reports the same count (a worker whose engine is wedged while
    // something still sends its events).
    bool progress_stuck = false;
    // Every PrefillProgress event says the request is queued (ready 0): a busy worker whose
    // engine works through the requests ahead of it.
    bool progress_queued = false;
    // A broken or hostile worker (worker_stream_check.h): token i gets id first_token_id + i, and
    // these messages follow the final one.
    int first_token_id = 100;
    std::vector<lazyattn::v1::GenerateResponse> after_final;
    // After the final message (and after_final), hold the call open until Unblock() or its
    // cancellation, as a wedged worker that answered but never ends its call.
    bool block_after_final = false;
    // >= 0: after this many tokens, one whose text is not UTF-8 (the router cannot parse it),
    // then the call is held open until Unblock() or its cancellation.
    int unparsable_after_tokens = -1;
    // Set: the two failures above apply only to the request with this seed (one choice of an
    // HTTP request with OpenAI's `n` failing while the others run).
    std::optional<uint64_t> fail_only_seed;
    // Every token's text gets "#<the request's seed>" appended (the choices of one request told
    // apart; "#-" for an unseeded request).
    bool tokens_name_the_seed = false;
    // Set: the final message's text instead of the tokens' (a worker whose answer and tokens
    // disagree).
    std::optional<std::string> final_text;
    // Set: applied to token i's chunk (i counts from 0) before it is sent, as a broken or hostile
    // worker would change it.
    std::function<void(int i, lazyattn::v1::TokenChunk* chunk)> edit_token;
    // What the final message's usage says the worker reused of the request's documents.
    int64_t document_hit_tokens = 0;
    std::optional<int64_t> document_copied_tokens = 0;  // unset: a worker that predates it
    // Set: a Prefetch answer's computed_tokens (a hostile worker's count) instead of the
    // documents' bytes.
    std::optional<int64_t> prefetch_computed_tokens;
  };
  // With sampling.logprobs, token i carries logprob -0.5 * (i + 1) and its text as token_bytes.
  // With sampling.top_logprobs k > 0 as well, its k alternatives are the token itself, then
  // made-up ones j = 1 .. k-1 of id kAlternativeIds + j, logprob the token's minus j and bytes
  // "alt<j>" (most likely first, as a worker sends them).
  static constexpr int32_t kAlternativeIds = 900;

  explicit FakeWorker(std::string id);
  ~FakeWorker() override;

  // Starts serving on 127.0.0.1:0.
  void Start();
  void Stop();
  const std::string& id() const { return id_; }
  const std::string& address() const { return address_; }
  lazyattn::v1::WorkerStatus Status() const;

  void SetScript(const Script& script);
  // What its status advertises as ModelInfo.max_top_logprobs (20 unless set; 0 plays a worker
  // older than alternatives). Set before the directory learns the status.
  void SetMaxTopLogprobs(int n);
  // ... and as ModelInfo.max_logit_bias (300 unless set; 0 plays a worker older than logit_bias).
  void SetMaxLogitBias(int n);
  void Unblock();
  int generate_calls() const;
  int prefetch_calls() const;
  lazyattn::v1::GenerateRequest last_request() const;
  lazyattn::v1::PrefetchRequest last_prefetch_request() const;
  // Every Generate request received, in arrival order.
  std::vector<lazyattn::v1::GenerateRequest> requests() const;
  // The cache namespace metadata (kCacheNamespaceMetadata) of every Generate and Prefetch call,
  // in arrival order; "(none)" for a call without it.
  std::vector<std::string> cache_namespaces() const;
  // The request id metadata (kRequestIdKey) of every Generate call, in arrival order; "(none)"
  // for a call without it.
  std::vector<std::string> request_ids() const;
  // PrefillProgress events sent, over all calls.
  int progress_events() const;
  // Waits (up to `timeout`) until `n` Generate calls have arrived / `n` calls saw their
  // cancellation (while blocked, or as a write that failed).
  bool WaitForCalls(int n, absl::Duration timeout) const;
  bool WaitForCancellation(absl::Duration timeout, int n = 1) const;  // n calls saw theirs
  int cancellations() const;  // calls that saw their cancellation so far

  grpc::Status Generate(grpc::ServerContext* context, const lazyattn::v1::GenerateRequest* request,
                        grpc::ServerWriter<lazyattn::v1::GenerateResponse>* writer) override;
  grpc::Status Prefetch(grpc::ServerContext* context, const lazyattn::v1::PrefetchRequest* request,
                        lazyattn::v1::PrefetchResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const lazyattn::v1::WorkerStatusRequest* request,
                      lazyattn::v1::WorkerStatus* response) override;

 private:
  // Waits for Unblock() or the call's cancellation; false (and counted) when cancelled.
  bool WaitUntilUnblocked(grpc::ServerContext* context);
  // A write the router no longer reads (it cancelled the call): counted as a cancellation.
  grpc::Status ClientGone();

  const std::string id_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  int max_top_logprobs_ ABSL_GUARDED_BY(mu_) = 20;
  int max_logit_bias_ ABSL_GUARDED_BY(mu_) = 300;
  bool unblocked_ ABSL_GUARDED_BY(mu_) = false;
  int generate_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int prefetch_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int cancellations_ ABSL_GUARDED_BY(mu_) = 0;
  int progress_events_ ABSL_GUARDED_BY(mu_) = 0;
  lazyattn::v1::GenerateRequest last_request_ ABSL_GUARDED_BY(mu_);
  lazyattn::v1::PrefetchRequest last_prefetch_request_ ABSL_GUARDED_BY(mu_);
  std::vector<lazyattn::v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cache_namespaces_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> request_ids_ ABSL_GUARDED_BY(mu_);
};

class FakeKvdir final : public lazyattn::v1::KvDirectory::Service {
 public:
  FakeKvdir() = default;
  ~FakeKvdir() override;

  void Start();
  // Over TLS with `tls` (server side; client certificates not required), on 127.0.0.1.
  absl::Status StartTls(const TlsOptions& tls);
  void Stop();
  const std::string& address() const { return address_; }

  void SetWorkers(const std::vector<lazyattn::v1::WorkerStatus>& workers);
  // `worker_id` holds the document with `text`, of `tokens` tokens.
  void Hold(const std::string& worker_id, const std::string& text, int64_t tokens);
  // Lookups wait until their deadline passes (a directory that hangs).
  void SetHang(bool hang);
  // Lookups of more keys are refused INVALID_ARGUMENT, as kvdir's limits.max_keys_per_lookup
  // does (0: no limit).
  void SetMaxKeysPerLookup(int max_keys);
  int lookups() const;
  int listings() const;  // ListWorkers calls answered

  grpc::Status Lookup(grpc::ServerContext* context, const lazyattn::v1::LookupRequest* request,
                      lazyattn::v1::LookupResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const lazyattn::v1::ListWorkersRequest* request,
                           lazyattn::v1::ListWorkersResponse* response) override;

 private:
  std::string address_;
  std::unique_ptr<grpc::Server> server_;

  mutable absl::Mutex mu_;
  std::vector<lazyattn::v1::WorkerStatus> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<DocumentKey, int64_t>> held_ ABSL_GUARDED_BY(mu_);
  bool hang_ ABSL_GUARDED_BY(mu_) = false;
  int max_keys_ ABSL_GUARDED_BY(mu_) = 0;
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int listings_ ABSL_GUARDED_BY(mu_) = 0;
};

// The smallest cluster the HTTP front's tests need: starts `worker` and `kvdir`, lists the worker
// there, and creates a router in front of them (RouterOptionsForFakeKvdir, its own registry).
absl::StatusOr<std::unique_ptr<RouterServer>> StartOneWorkerRouter(FakeWorker& worker,
                                                                   FakeKvdir& kvdir);

}  // namespace lazyattn::router::testing

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_FAKE_CLUSTER_FOR_TEST_H_
