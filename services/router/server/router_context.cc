#include "services/router/server/router_context.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/document_key.h"
#include "common/grpc_util.h"
#include "common/log.h"
#include "common/monotonic_time.h"

namespace lazyattn::router {
namespace {

// Tokens a text document may have beyond one per byte (DocumentRef::max_tokens).
constexpr int64_t kTextTokenSlack = 16;

}  // namespace

using lazyattn::v1::CacheMode;
using lazyattn::v1::Document;
using lazyattn::v1::LookupResponse;

bool IsRetryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         code == grpc::StatusCode::ABORTED;
}

bool IsWorkerFault(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::DATA_LOSS || code == grpc::StatusCode::INTERNAL ||
         code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

namespace {

bool DialsLoopbackWorkers(const KvdirOptions& kvdir) {
  switch (kvdir.loopback_workers) {
    case KvdirOptions::LoopbackWorkers::kDial:
      return true;
    case KvdirOptions::LoopbackWorkers::kSkip:
      return false;
    case KvdirOptions::LoopbackWorkers::kAuto:
      break;
  }
  return DialsThisHost(kvdir.address);
}

}  // namespace

RouterContext::RouterContext(const RouterOptions& options, prometheus::Registry& registry)
    : options_(options),
      registry_(options.workers, options.client_tls, options.server.max_message_bytes,
                options.kvdir.forget_after, DialsLoopbackWorkers(options.kvdir)),
      selector_(options.routing.policy, options.routing.speculative, options.routing.breaker,
                options.health.outliers),
      metrics_(registry, std::string(PolicyKindName(options.routing.policy.kind))),
      quarantine_(options.routing.quarantine),
      retry_budget_(options.routing.retry_budget),
      lookup_gate_(options.kvdir.lookup_gate) {
  if (!options.kvdir.address.empty()) {
    auto channel = MakeChannel(options.kvdir.address, KvdirClientTls(options.client_tls),
                               options.server.max_message_bytes);
    if (channel.ok()) {
      kvdir_ = lazyattn::v1::KvDirectory::NewStub(*channel);
    } else {
      LogWarning("router")
          .Str("error", std::string(channel.status().message()))
          .Msg("no kvdir channel; routing by load only");
    }
  }
  if (options.routing.client_write_timeout > absl::ZeroDuration() ||
      options.routing.client_write_wait_budget > absl::ZeroDuration()) {
    write_watch_ = std::make_unique<ClientWriteWatch>(
        ClientWriteWatch::Limits{.timeout = options.routing.client_write_timeout,
                                 .wait_budget = options.routing.client_write_wait_budget},
        [this] { metrics_.CountClientWriteTimeout(); });
  }
  if (options.health.interval > absl::ZeroDuration()) {
    prober_ = std::thread([this] { ProbeLoop(); });
  }
}

RouterContext::~RouterContext() {
  {
    absl::MutexLock lock(&probe_mu_);
    stopping_ = true;
  }
  if (prober_.joinable()) prober_.join();
}

void RouterContext::ProbeLoop() {
  absl::MutexLock lock(&probe_mu_);
  while (!stopping_) {
    probe_mu_.Unlock();
    const absl::Time start = MonotonicNow();
    ProbeWorkersOnce();
    // A round takes at most health.timeout; the next starts one interval after this one did.
    const absl::Duration wait =
        std::max(options_.health.interval - (MonotonicNow() - start), absl::Milliseconds(1));
    probe_mu_.Lock();
    if (probe_mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait)) break;
  }
}

void RouterContext::ProbeWorkersOnce() {
  const std::vector<WorkerInfo> workers = registry_.Snapshot();
  std::vector<ProbeResult> results(workers.size(), ProbeResult::kFailed);
  std::vector<std::string> errors(workers.size());
  {
    std::vector<std::thread> probes;
    probes.reserve(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) {
      probes.emplace_back([this, &workers, &results, &errors, i] {
        auto channel = registry_.Channel(workers[i].address);
        if (!channel.ok()) {
          errors[i] = std::string(channel.status().message());
          return;
        }
        absl::StatusOr<bool> serving = CheckGrpcHealth(*channel, "", options_.health.timeout);
        if (serving.ok()) {
          results[i] = *serving ? ProbeResult::kServing : ProbeResult::kNotServing;
        } else if (absl::IsUnimplemented(serving.status())) {
          results[i] = ProbeResult::kServing;  // no health service: requests tell its health
        } else {
          errors[i] = absl::StrCat(absl::StatusCodeToString(serving.status().code()), ": ",
                                   serving.status().message());
        }
      });
    }
    for (std::thread& t : probes) t.join();
  }
  const absl::Time now = MonotonicNow();
  OutlierDetector& outliers = selector_.outliers();
  std::vector<std::string> keys;
  keys.reserve(workers.size());
  int healthy = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerInfo& w = workers[i];
    const std::string key = OutlierKey(w.id, w.address);
    keys.push_back(key);
    const bool was_admitted = outliers.Admitted(key);
    std::string why;
    if (outliers.Record(key, results[i], now, &why)) {
      metrics_.CountEjection();
      LogWarning("router")
          .Str("worker", w.id)
          .Str("address", w.address)
          .Str("reason", why)
          .Str("last_probe", errors[i])
          .Msg("worker ejected");
    } else if (!was_admitted && outliers.Admitted(key)) {
      LogInfo("router")
          .Str("worker", w.id)
          .Str("address", w.address)
          .Msg("worker re-admitted: health probe SERVING");
    }
    if (outliers.Admitted(key)) ++healthy;
  }
  metrics_.SetWorkersHealthy(healthy);
  outliers.Retain(keys, now);
}

int RouterContext::AdmittedWorkers() {
  OutlierDetector& outliers = selector_.outliers();
  int n = 0;
  for (const WorkerInfo& w : registry_.Snapshot()) {
    if (w.reported && outliers.Admitted(OutlierKey(w.id, w.address))) ++n;
  }
  return n;
}

bool RouterContext::TryAdmit(int places, int* in_flight) {
  int n = inflight_.load(std::memory_order_relaxed);
  while (places >= 1 && n <= options_.max_inflight_requests - places) {
    if (inflight_.compare_exchange_weak(n, n + places, std::memory_order_acq_rel)) {
      metrics_.AddInFlight(places);
      return true;
    }
  }
  if (in_flight != nullptr) *in_flight = n;
  return false;
}

void RouterContext::Release() {
  inflight_.fetch_sub(1, std::memory_order_acq_rel);
  metrics_.AddInFlight(-1);
}

std::vector<DocumentRef> RouterContext::DocumentRefs(
    const google::protobuf::RepeatedPtrField<Document>& documents, CacheMode mode,
    const ModelKey* model, const CacheScope& scope) const {
  std::vector<DocumentRef> refs;
  if (mode == lazyattn::v1::CACHE_MODE_FULL || mode == lazyattn::v1::CACHE_MODE_PREFIX) {
    return refs;
  }
  std::optional<ModelKey> only;
  if (model == nullptr) {
    if (auto served = registry_.Model(); served.has_value()) only = ModelKeyOf(*served);
    model = only.has_value() ? &*only : nullptr;
  }
  if (model == nullptr) return refs;
  const std::string& mfp = model->model_fingerprint;
  const std::string& tfp = model->tokenizer_fingerprint;
  absl::flat_hash_set<DocumentKey> seen;
  const double bytes_per_token = std::max(options_.routing.bytes_per_token, 1e-3);
  int index = 0;
  for (const Document& doc : documents) {
    DocumentRef ref;
    ref.document_index = index++;
    if (doc.has_tokens()) {
      const auto& ids = doc.tokens().ids();
      ref.key = DocumentKeyFromTokens(mfp, tfp, std::vector<int32_t>(ids.begin(), ids.end()));
      ref.estimated_tokens = ids.size();
      ref.max_tokens = ids.size();
    } else {
      ref.key = DocumentKeyFromText(mfp, tfp, doc.text());
      ref.estimated_tokens =
          static_cast<int64_t>(std::ceil(static_cast<double>(doc.text().size()) / bytes_per_token));
      // A tokenizer makes at most one token per byte (byte-level BPE; SentencePiece's byte
      // fallback), plus the few some add around a text (a dummy-prefix space).
      ref.max_tokens = static_cast<int64_t>(doc.text().size()) + kTextTokenSlack;
    }
    ref.key = ScopedDocumentKey(ref.key, scope);
    if (seen.insert(ref.key).second) refs.push_back(ref);
  }
  return refs;
}

void RouterContext::PlanAsync(std::vector<DocumentRef> docs, std::function<void(RoutePlan)> done,
                              std::optional<ModelKey> model) {
  if (kvdir_ == nullptr || docs.empty() ||
      options_.routing.policy.kind != PolicyKind::kCacheAware) {
    done(Plan(std::move(docs), nullptr, MonotonicNow(), model.has_value() ? &*model : nullptr));
    return;
  }
  const LookupGate::Decision decision = lookup_gate_.Decide(MonotonicNow());
  if (decision == LookupGate::Decision::kSkip) {
    metrics_.CountSkippedLookup();
    done(Plan(std::move(docs), nullptr, MonotonicNow(), model.has_value() ? &*model : nullptr));
    return;
  }
  const bool trial = decision == LookupGate::Decision::kTrial;
  struct Op {
    grpc::ClientContext ctx;
    lazyattn::v1::LookupRequest request;
    LookupResponse response;
  };
  auto op = std::make_shared<Op>();
  op->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.kvdir.lookup_timeout));
  // The request's mode decides what kvdir counts as resident (docs/router.md, "Predictions").
  op->request.set_mode(docs.front().positional ? lazyattn::v1::CACHE_MODE_BLOCK
                                               : lazyattn::v1::CACHE_MODE_LAZY);
  for (const DocumentRef& d : docs) {
    auto* key = op->request.add_keys();
    key->set_hi(d.key.hi);
    key->set_lo(d.key.lo);
    if (d.positional) op->request.add_offsets(d.offset);
  }
  Op* raw = op.get();
  const absl::Time sent_at = MonotonicNow();
  kvdir_->async()->Lookup(
      &raw->ctx, &raw->request, &raw->response,
      [this, op = std::move(op), docs = std::move(docs), done = std::move(done),
       model = std::move(model), sent_at, trial](grpc::Status status) mutable {
        // A lookup refused as invalid (more keys than kvdir's limits.max_keys_per_lookup) was
        // answered: the directory is up, and only this request routes without its residency.
        const bool answered =
            status.ok() || status.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
        if (!answered) registry_.ObserveDirectoryFailure(sent_at);
        if (!status.ok() && answered) RefusedLookup(status);
        if (lookup_gate_.Record(answered, trial, MonotonicNow())) {
          if (answered) {
            LogInfo("router").Msg("kvdir answered a lookup again: lookups resume");
          } else {
            LogWarning("router")
                .Str("last_error", absl::StrCat(StatusCodeLabel(status.error_code()), ": ",
                                                status.error_message()))
                .Int("skip_ms", absl::ToInt64Milliseconds(lookup_gate_.backoff()))
                .Msg(
                    "kvdir lookups keep failing: requests are routed by load without one "
                    "until a trial lookup answers");
          }
        }
        done(Plan(std::move(docs), status.ok() ? &op->response : nullptr, MonotonicNow(),
                  model.has_value() ? &*model : nullptr));
      });
}

void RouterContext::RefusedLookup(const grpc::Status& status) {
  const int64_t now_ms = absl::ToUnixMillis(MonotonicNow());
  int64_t last = refused_lookup_logged_ms_.load(std::memory_order_relaxed);
  if (last != INT64_MIN && now_ms - last < 60'000) return;
  if (!refused_lookup_logged_ms_.compare_exchange_strong(last, now_ms)) return;
  LogWarning("router")
      .Str("error", status.error_message())
      .Msg(
          "kvdir refused a lookup as invalid; such requests route by load. A request of more "
          "documents than kvdir's limits.max_keys_per_lookup does this: keep the router's "
          "limits.max_documents at or below it (logged once a minute)");
}

RoutePlan RouterContext::Plan(std::vector<DocumentRef> docs, const LookupResponse* lookup,
                              absl::Time now, const ModelKey* model) {
  RoutePlan plan;
  plan.docs = std::move(docs);
  absl::flat_hash_map<std::string, const lazyattn::v1::WorkerResidency*> residency;
  if (lookup != nullptr) {
    plan.directory_answered = true;
    registry_.ObserveDirectory(lookup->workers(), now);
    for (const auto& w : lookup->workers()) residency[w.worker().address()] = &w;
  }
  std::vector<WorkerInfo> workers = registry_.Snapshot();
  if (model != nullptr) {
    // Another model's workers never see the request: not as first choice, failover or retry
    // (the plan is all of them), whatever the directory says they hold.
    std::erase_if(workers, [model](const WorkerInfo& w) {
      return !w.reported || ModelKeyOf(w.status.model()) != *model;
    });
  }
  std::vector<WorkerObservation> observations;
  observations.reserve(workers.size());
  for (const WorkerInfo& w : workers) {
    const auto& load = w.status.load();
    WorkerObservation obs{
        .id = w.id,
        .address = w.address,
        .queued_prefill_tokens = load.queued_prefill_tokens(),
        .requests = static_cast<int64_t>(load.running_requests()) + load.waiting_requests(),
        .router_inflight = registry_.Inflight(w),
    };
    auto it = residency.find(w.address);
    if (it != residency.end()) {
      obs.resident_tokens = it->second->resident_tokens();
      obs.copyable_tokens = it->second->copyable_tokens();
      if (static_cast<size_t>(it->second->resident_size()) == plan.docs.size()) {
        obs.resident.assign(it->second->resident().begin(), it->second->resident().end());
      }
    }
    observations.push_back(std::move(obs));
  }
  Selection selection = selector_.Select(observations, plan.docs, now);
  plan.breaker_panic = selection.breaker_panic;
  plan.workers.reserve(selection.order.size());
  for (size_t i : selection.order) {
    plan.workers.push_back(workers[i]);
    plan.predicted_hits.push_back(selection.predicted_hit_tokens[i]);
    plan.claimed_tokens.push_back(selection.claimed_tokens[i]);
    plan.claimed_copy_tokens.push_back(selection.claimed_copy_tokens[i]);
  }
  return plan;
}

void RouterContext::RefreshWorkers() {
  if (kvdir_ != nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.kvdir.list_timeout));
    // Ride out a connection that is still coming up (or failed once) until the deadline instead
    // of failing fast: a router whose first listing fails knows no workers until the next
    // refresh, and answers "no live workers" meanwhile (seen once in 765 loaded test runs).
    ctx.set_wait_for_ready(true);
    lazyattn::v1::ListWorkersResponse response;
    const absl::Time sent_at = MonotonicNow();
    grpc::Status s = kvdir_->ListWorkers(&ctx, lazyattn::v1::ListWorkersRequest(), &response);
    if (s.ok()) {
      registry_.ObserveDirectory(response.workers(), MonotonicNow());
      // The directory is back after failing to list: try a lookup now rather than after the
      // backoff. (One that lists but fails lookups keeps its backoff.)
      if (!last_listing_ok_.exchange(true)) lookup_gate_.TrialNow(MonotonicNow());
    } else {
      last_listing_ok_ = false;
      registry_.ObserveDirectoryFailure(sent_at);
    }
  }
  for (const std::string& address : registry_.static_addresses()) {
    auto stub = registry_.Stub(address);
    if (!stub.ok()) {
      registry_.ObserveStatic(address, nullptr);
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.kvdir.list_timeout));
    lazyattn::v1::WorkerStatus status;
    grpc::Status s = (*stub)->Status(&ctx, lazyattn::v1::WorkerStatusRequest(), &status);
    registry_.ObserveStatic(address, s.ok() ? &status : nullptr);
  }
  // Breakers of workers the registry has forgotten would otherwise be kept forever.
  std::vector<std::string> ids;
  for (const WorkerInfo& w : registry_.Snapshot()) ids.push_back(w.id);
  selector_.breakers().Retain(ids);
  selector_.claims().Retain(ids);
  metrics_.SetWorkersDistrusted(selector_.claims().Distrusted(ids));
}

void RouterContext::ObserveClaim(const std::string& worker, int64_t claimed, int64_t claimed_copies,
                                 const lazyattn::v1::Usage& usage) {
  if (claimed <= 0) return;
  // Each count at most kMaxObservedTokens: a worker's counts must not overflow the sum.
  int64_t reused = std::min(usage.document_hit_tokens(), kMaxObservedTokens);
  if (usage.has_document_copied_tokens()) {
    reused += std::min(usage.document_copied_tokens(), kMaxObservedTokens);
  } else {
    claimed -= claimed_copies;
  }
  const ClaimCreditChange change = selector_.claims().Observe(worker, claimed, reused);
  if (!change.lost && !change.regained) return;
  std::vector<std::string> ids;
  for (const WorkerInfo& w : registry_.Snapshot()) ids.push_back(w.id);
  metrics_.SetWorkersDistrusted(selector_.claims().Distrusted(ids));
  const int64_t percent = std::llround(100 * change.share);
  if (change.lost) {
    LogWarning("router")
        .Str("worker", worker)
        .Int("reused_percent", percent)
        .Int("credit_percent", std::llround(100 * change.credit))
        .Msg(
            "a worker reuses far less than the directory says it holds: its directory claims "
            "now count at its credit when ranking (claim_credit.h)");
  } else {
    LogInfo("router")
        .Str("worker", worker)
        .Int("reused_percent", percent)
        .Msg("a worker's directory claims come true again: they count in full");
  }
}

}  // namespace lazyattn::router
