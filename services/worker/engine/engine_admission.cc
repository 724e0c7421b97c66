// EngineCore: admission, block allocation, preemption, and the release of what a request holds.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/monotonic_time.h"
#include "kernels/include/block_copy.h"
#include "services/worker/engine/engine_core_state.h"

namespace lazyattn {

int64_t PrefillTokensToCompute(const PreparedRequest& p,
                               const std::function<bool(const DocCacheKey&, int64_t)>& reused) {
  int64_t tokens = p.prompt_tokens();
  if (!EncodesDocumentsAlone(p.mode)) return tokens;
  int64_t offset = static_cast<int64_t>(p.system_prefix.size());
  for (const auto& d : p.documents) {
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    if (reused({d.key, p.mode == CacheMode::kLazy ? DocCacheKey::kAnyOffset : offset}, n)) {
      tokens -= n;
    }
    offset += n;
  }
  return tokens;
}

EngineCore::Request* EngineCore::FindRequest(RequestId id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

EngineCore::EncodeJob* EngineCore::FindJob(JobId id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

int64_t EngineCore::OutstandingPrefillBlocks() const {
  const int64_t B = block_size();
  int64_t n = 0;
  for (RequestId id : running_) {
    const Request& r = *requests_.at(id);
    if (r.phase != Request::Phase::kPrefill) continue;
    for (const Segment& s : r.segments) {
      if (s.job == 0) n += CeilDiv(s.length(), B) - static_cast<int64_t>(s.blocks.size());
    }
  }
  for (const auto& [id, job] : jobs_) {
    n += CeilDiv(job->length(), B) - static_cast<int64_t>(job->blocks.size());
  }
  return n;
}

bool EngineCore::EndsUnstarted(const Request& r) const {
  // Nothing of it reached its client (prefill progress aside), so a router may run it elsewhere.
  return !end_unstarted_.ok() && r.phase == Request::Phase::kWaiting && r.result.token_ids.empty();
}

void EngineCore::Admit() {
  if (waiting_.empty()) return;
  int64_t reserved = OutstandingPrefillBlocks();
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    Request& r = *requests_.at(waiting_.front());
    const std::optional<int64_t> needed = TryAdmit(r, reserved);
    if (!needed) break;
    reserved += *needed;
    running_.push_back(waiting_.front());
    waiting_.pop_front();
  }
}

std::optional<int64_t> EngineCore::TryAdmit(Request& r, int64_t reserved) {
  const PreparedRequest& p = r.prepared;
  const CacheMode mode = p.mode;
  const int64_t B = block_size();
  ModeCounters& counters = stats_.mode(mode);
  const bool first_admission = !r.counted;
  r.segments.clear();
  ResetTable(r);
  RequestUsage& usage = r.result.usage;
  usage.cached_tokens = 0;
  usage.documents_hit = 0;
  usage.document_cached_tokens = 0;
  usage.document_copied_tokens = 0;
  usage.document_hit_tokens = 0;
  usage.prefix_tokens = 0;

  // The query segment carries what was generated before a preemption: it is recomputed.
  std::vector<DocOutcome> outcomes;  // per segment, documents only
  // Made only once the pool has room for them: a copy allocates blocks (evicting for them), and
  // a request refused here would leave its copies in the cache and the blocks they took from
  // what running requests were promised.
  std::vector<PendingCopy> copies;
  std::vector<int32_t> query = p.question;
  query.insert(query.end(), r.result.token_ids.begin(), r.result.token_ids.end());

  if (!EncodesDocumentsAlone(mode)) {
    Segment s;
    s.kind = Segment::Kind::kQuery;
    s.tokens = p.system_prefix;
    for (const auto& d : p.documents) s.tokens.insert(s.tokens.end(), d.tokens.begin(), d.tokens.end());
    s.tokens.insert(s.tokens.end(), query.begin(), query.end());
    // Always compute at least the last token (its logits start generation).
    const int64_t limit = mode == CacheMode::kPrefix
                              ? s.length() - 1
                              : std::min<int64_t>(static_cast<int64_t>(p.system_prefix.size()),
                                                  s.length() - 1);
    auto match = cache_.prefixes().MatchAndPin(s.tokens, limit, cache_.Tick(), p.prefix_scope);
    s.blocks = std::move(match.blocks);
    s.ready = match.num_tokens;
    usage.cached_tokens += match.num_tokens;
    r.segments.push_back(std::move(s));
  } else {
    int64_t offset = 0;
    if (!p.system_prefix.empty()) {
      Segment s;
      s.kind = Segment::Kind::kPrefix;
      s.tokens = p.system_prefix;
      auto match =
          cache_.prefixes().MatchAndPin(s.tokens, s.length(), cache_.Tick(), p.prefix_scope);
      s.blocks = std::move(match.blocks);
      s.ready = match.num_tokens;
      usage.cached_tokens += match.num_tokens;
      offset = s.length();
      r.segments.push_back(std::move(s));
    }
    usage.prefix_tokens = offset;
    for (const auto& d : p.documents) {
      Segment s;
      s.kind = Segment::Kind::kDocument;
      s.tokens = d.tokens;
      s.offset = offset;
      s.cache_key = {d.key, mode == CacheMode::kLazy ? DocCacheKey::kAnyOffset : offset};
      offset += s.length();
      r.segments.push_back(std::move(s));
    }
    Segment q;
    q.kind = Segment::Kind::kQuery;
    q.tokens = std::move(query);
    q.offset = offset;
    r.segments.push_back(std::move(q));
    outcomes.resize(r.segments.size(), DocOutcome::kEncode);
    // Keys acquired so far: a lazy request naming a document twice holds one key for both.
    absl::flat_hash_set<DocCacheKey> acquired;
    for (size_t i = 0; i < r.segments.size(); ++i) {
      if (r.segments[i].kind == Segment::Kind::kDocument) {
        const bool repeat = !acquired.insert(r.segments[i].cache_key).second;
        outcomes[i] = AcquireDocument(r, i, repeat, copies);
      }
    }
  }

  // Blocks still to fill: own segments (a pending copy's among them), and the jobs this request
  // started (a job it joined is in `reserved` already; one it started has only this request's
  // segments as waiters).
  int64_t needed = 0;
  std::vector<JobId> counted_jobs;
  for (const Segment& s : r.segments) {
    if (s.job == 0) {
      needed += CeilDiv(s.length(), B) - static_cast<int64_t>(s.blocks.size());
      continue;
    }
    const EncodeJob& job = *jobs_.at(s.job);
    const bool started_here = std::all_of(job.waiters.begin(), job.waiters.end(),
                                          [&](const auto& w) { return w.request == r.id; });
    if (started_here && std::find(counted_jobs.begin(), counted_jobs.end(), s.job) == counted_jobs.end()) {
      counted_jobs.push_back(s.job);
      needed += CeilDiv(job.length(), B) - static_cast<int64_t>(job.blocks.size());
    }
  }
  // (Pinned, a copy's source is not counted available here although it could be evicted once
  // copied: the check errs strict by its blocks, and only while other requests run.)
  if (needed > cache_.AvailableBlocks() - reserved && !running_.empty()) {
    for (const PendingCopy& c : copies) {
      for (BlockId b : c.source) cache_.pool().Unref(b);
    }
    Release(r);  // try again when running requests have finished
    return std::nullopt;
  }
  for (const PendingCopy& c : copies) {
    outcomes[c.segment] = MakeCopy(r, c);
    // A copy made took its blocks now (AvailableBlocks fell by as many): what this request
    // still needs, and Admit reserves for it, leaves them out (a fallback encoding keeps them).
    if (outcomes[c.segment] == DocOutcome::kCopy) {
      needed -= static_cast<int64_t>(r.segments[c.segment].blocks.size());
    }
  }
  if (first_admission) {
    r.counted = true;
    r.result.queue_ms = absl::ToDoubleMilliseconds(MonotonicNow() - r.submitted);
    ++counters.requests;
    counters.prefill_tokens_reused += usage.cached_tokens;
    for (size_t i = 0; i < r.segments.size(); ++i) {
      const Segment& s = r.segments[i];
      if (s.kind != Segment::Kind::kDocument) continue;
      ++counters.doc_lookups;
      counters.doc_lookup_tokens += s.length();
      if (outcomes[i] == DocOutcome::kHit) {
        ++counters.doc_hits;
        counters.doc_hit_tokens += s.length();
      } else if (outcomes[i] == DocOutcome::kCopy) {
        ++counters.doc_copies;
      }
    }
  }
  usage.computed_tokens = usage.prompt_tokens - usage.cached_tokens;
  r.phase = Request::Phase::kPrefill;
  return needed;
}

EngineCore::DocOutcome EngineCore::AcquireDocument(Request& r, size_t segment, bool repeat,
                                                   std::vector<PendingCopy>& copies) {
  Segment& s = r.segments[segment];
  if (const CachedDocument* hit = cache_.documents().Lookup(s.cache_key)) {
    s.blocks = hit->blocks;
    for (BlockId b : s.blocks) cache_.pool().Ref(b);
    s.ready = s.length();
    r.result.usage.cached_tokens += s.length();
    r.result.usage.document_cached_tokens += s.length();
    // A repeat is reused from this request's own first occurrence, as when the document was not
    // cached (StartOrJoinJob): one hit, which is what the router predicts (it counts each
    // document of a request once).
    if (!repeat) {
      r.result.usage.document_hit_tokens += s.length();
      ++r.result.usage.documents_hit;
    }
    return DocOutcome::kHit;
  }
  // A job already encoding the document at this offset is joined, never raced by a copy: the copy
  // would take the key first and the job's finished encoding would be thrown away.
  DocCacheKey found;
  if (r.prepared.mode == CacheMode::kBlock && !job_by_key_.contains(s.cache_key)) {
    if (const CachedDocument* other = cache_.documents().FindAnyOffset(s.cache_key.doc, &found)) {
      // Pinned until the copy is made, so eviction cannot take it.
      PendingCopy copy{.segment = segment,
                       .source = other->blocks,
                       .source_offset = found.offset == DocCacheKey::kAnyOffset ? 0 : found.offset};
      for (BlockId b : copy.source) cache_.pool().Ref(b);
      copies.push_back(std::move(copy));
      s.ready = 0;
      return DocOutcome::kCopy;
    }
  }
  return StartOrJoinJob(r, segment);
}

EngineCore::DocOutcome EngineCore::MakeCopy(Request& r, const PendingCopy& copy) {
  Segment& s = r.segments[copy.segment];
  std::vector<BlockId> dst;
  bool ok = true;
  while (ok && dst.size() < copy.source.size()) {
    auto b = cache_.Allocate();
    if (b) dst.push_back(*b);
    ok = b.has_value();
  }
  if (ok) {
    const int32_t delta = static_cast<int32_t>(s.offset - copy.source_offset);
    std::vector<BlockCopy> copies;
    for (size_t i = 0; i < copy.source.size(); ++i) {
      copies.push_back({copy.source[i], dst[i], delta});
    }
    // A failed copy (device error) falls back to encoding the document.
    ok = runner_->CopyBlocks(copies).ok();
  }
  for (BlockId b : copy.source) cache_.pool().Unref(b);
  if (!ok) {
    for (BlockId b : dst) cache_.pool().Unref(b);
    return StartOrJoinJob(r, copy.segment);
  }
  cache_.documents().Insert(s.cache_key, dst, s.length(), DocumentCache::Origin::kCopied);
  s.blocks = std::move(dst);  // the request keeps the references Allocate gave it
  s.ready = s.length();
  r.result.usage.cached_tokens += s.length();
  r.result.usage.document_cached_tokens += s.length();
  r.result.usage.document_copied_tokens += s.length();
  return DocOutcome::kCopy;
}

EngineCore::DocOutcome EngineCore::StartOrJoinJob(Request& r, size_t segment) {
  Segment& s = r.segments[segment];
  JobId job_id;
  if (auto in_flight = job_by_key_.find(s.cache_key); in_flight != job_by_key_.end()) {
    job_id = in_flight->second;
    const auto& waiters = jobs_.at(job_id)->waiters;
    if (std::any_of(waiters.begin(), waiters.end(),
                    [&](const auto& w) { return w.request == r.id; })) {
      // The same document earlier in this request (lazy: one key at every offset): encoded
      // once, and this occurrence reads the cache entry that encoding makes. Computed once, so
      // counted once: the repeat is cached tokens (Usage.computed_tokens, Prefetch's
      // computed_tokens), not a directory hit.
      r.result.usage.cached_tokens += s.length();
      r.result.usage.document_cached_tokens += s.length();
    } else {
      // Encoded once for every waiter: another request's encoding is this one's reuse.
      r.result.usage.document_hit_tokens += s.length();
    }
  } else {
    auto job = std::make_unique<EncodeJob>();
    job_id = job->id = next_job_id_++;
    job->key = s.cache_key;
    job->mode = r.prepared.mode;
    job->tokens = s.tokens;
    job->position_base = r.prepared.mode == CacheMode::kBlock ? s.offset : 0;
    job_by_key_.emplace(s.cache_key, job_id);
    jobs_.emplace(job_id, std::move(job));
  }
  jobs_.at(job_id)->waiters.push_back({r.id, segment});
  s.job = job_id;
  s.ready = 0;
  return DocOutcome::kEncode;
}

bool EngineCore::EnsureBlocks(std::vector<BlockId>& blocks, int64_t tokens, RequestId owner) {
  while (static_cast<int64_t>(blocks.size()) * block_size() < tokens) {
    auto b = cache_.Allocate();
    if (!b) {
      if (owner == 0 || !PreemptNewest(owner)) return false;
      continue;
    }
    blocks.push_back(*b);
  }
  return true;
}

bool EngineCore::PreemptNewest(RequestId keep) {
  // Newest first; never a request with a chunk in this step, never `keep` or anything older.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (*it == keep) return false;
    Request& victim = *requests_.at(*it);
    if (victim.scheduled || victim.phase == Request::Phase::kDone) continue;
    Release(victim);
    victim.phase = Request::Phase::kWaiting;
    ++victim.result.preemptions;
    ++stats_.preemptions;
    waiting_.push_front(victim.id);
    running_.erase(std::next(it).base());
    return true;
  }
  return false;
}

void EngineCore::Release(Request& r) {
  ResetTable(r);  // its blocks go back: nothing of its table may be reused
  for (size_t i = 0; i < r.segments.size(); ++i) {
    Segment& s = r.segments[i];
    for (BlockId b : s.blocks) cache_.pool().Unref(b);
    s.blocks.clear();
    s.ready = 0;
    if (s.job != 0) {
      const JobId job = s.job;
      s.job = 0;
      LeaveJob(job, r.id, i);
    }
  }
}

void EngineCore::LeaveJob(JobId id, RequestId request, size_t segment) {
  EncodeJob* job = FindJob(id);
  if (job == nullptr) return;
  std::erase(job->waiters, EncodeJob::Waiter{request, segment});
  if (!job->waiters.empty()) return;
  for (BlockId b : job->blocks) cache_.pool().Unref(b);
  job_by_key_.erase(job->key);
  jobs_.erase(id);  // destroys *job
}

void EngineCore::CompleteJob(EncodeJob& job) {
  ++stats_.encode_jobs;  // counted done: a job a refused admission started and dropped ran nothing
  cache_.documents().Insert(job.key, job.blocks, job.length());
  for (const EncodeJob::Waiter& w : job.waiters) {
    Request* r = FindRequest(w.request);
    if (r == nullptr || w.segment >= r->segments.size()) continue;
    Segment& s = r->segments[w.segment];
    if (s.job != job.id) continue;
    s.job = 0;
    s.blocks = job.blocks;
    for (BlockId b : s.blocks) cache_.pool().Ref(b);
    s.ready = job.length();
  }
  for (BlockId b : job.blocks) cache_.pool().Unref(b);
  job_by_key_.erase(job.key);
  jobs_.erase(job.id);  // destroys job
}

void EngineCore::FailJob(JobId id, const absl::Status& status) {
  const EncodeJob* job = FindJob(id);
  if (job == nullptr) return;
  std::vector<RequestId> waiting;
  for (const EncodeJob::Waiter& w : job->waiters) waiting.push_back(w.request);
  // Finishing a request releases its segments, which leaves the job; the last one drops it.
  for (RequestId rid : waiting) {
    Request* r = FindRequest(rid);
    if (r != nullptr && r->phase != Request::Phase::kDone) Finish(*r, status);
  }
}

void EngineCore::EraseFinished() {
  auto done = [&](RequestId id) { return requests_.at(id)->phase == Request::Phase::kDone; };
  std::erase_if(running_, done);
  std::erase_if(waiting_, done);
  absl::erase_if(requests_, [](const auto& entry) {
    return entry.second->phase == Request::Phase::kDone;
  });
}

}  // namespace lazyattn
