#include "services/worker/engine/engine_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/include/block_copy.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/stop_matcher.h"

namespace lazyattn {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t PreparedRequest::prompt_tokens() const {
  int64_t n = static_cast<int64_t>(system_prefix.size() + question.size());
  for (const auto& d : documents) n += static_cast<int64_t>(d.tokens.size());
  return n;
}

struct EngineCore::EncodeJob {
  DocCacheKey key;
  CacheMode mode;
  std::vector<int32_t> token_storage;
  int64_t position_base = 0;  // mode block: the global offset (Q and K at base + m); lazy: 0
  std::vector<BlockId> blocks;  // one reference each, held by the job
  int64_t ready = 0;
  std::vector<Request*> waiters;
};

struct EngineCore::Segment {
  enum class Kind { kPrefix, kDocument, kQuery };
  Kind kind = Kind::kQuery;
  std::vector<int32_t> tokens;
  int64_t offset = 0;            // global position of tokens[0]
  std::vector<BlockId> blocks;   // one reference each, held by the request
  int64_t ready = 0;             // tokens whose KV is in `blocks`
  DocCacheKey cache_key;         // documents
  EncodeJob* job = nullptr;      // documents being encoded
  int64_t length() const { return static_cast<int64_t>(tokens.size()); }
};

struct EngineCore::Request {
  enum class Phase { kWaiting, kPrefill, kDecode, kDone };
  uint64_t id = 0;
  PreparedRequest prepared;
  std::vector<Segment> segments;
  Phase phase = Phase::kWaiting;
  bool cancelled = false;
  bool counted = false;            // per-mode lookup counters taken (first admission only)
  bool scheduled = false;          // has a chunk in the current step
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamingDecoder> decoder;
  std::unique_ptr<StopMatcher> stop;
  std::vector<int32_t> stop_ids;
  RequestResult result;
  absl::Time submitted;
  absl::Time first_token;
  Segment& query() { return segments.back(); }
};

// One chunk of a step and what it belongs to.
struct EngineCore::Planned {
  Request* request = nullptr;  // null for an encoding job
  EncodeJob* job = nullptr;
  size_t segment = 0;
  bool decode = false;
  std::vector<int64_t> slots;
  std::vector<KvBlockEntry> table;
  ForwardChunk chunk;
};

EngineCore::EngineCore(std::unique_ptr<ModelRunner> runner, const Tokenizer* tokenizer,
                       EngineOptions options)
    : runner_(std::move(runner)),
      tokenizer_(tokenizer),
      options_(options),
      cache_(runner_->num_kv_blocks(), kDefaultKvBlockSize) {
  options_.num_kv_blocks = runner_->num_kv_blocks();
}

EngineCore::EngineCore(const ModelWeights* weights, const Tokenizer* tokenizer,
                       EngineOptions options)
    : EngineCore(std::make_unique<CpuModelRunner>(weights, options.num_kv_blocks), tokenizer,
                 options) {}

EngineCore::~EngineCore() {
  if (!in_flight_.empty()) (void)runner_->Collect();  // nothing may write the pool after us
  for (auto& r : running_) {
    if (r->phase != Request::Phase::kDone) Finish(*r, absl::UnavailableError("engine shut down"));
  }
  for (auto& r : waiting_) Finish(*r, absl::UnavailableError("engine shut down"));
}

int64_t EngineCore::BlocksNeeded(const PreparedRequest& r) const {
  const int64_t B = block_size();
  const int64_t gen = r.sampling.max_tokens;
  if (!EncodesDocumentsAlone(r.mode)) return CeilDiv(r.prompt_tokens() + gen, B);
  int64_t blocks = CeilDiv(static_cast<int64_t>(r.system_prefix.size()), B) +
                   CeilDiv(static_cast<int64_t>(r.question.size()) + gen, B);
  for (const auto& d : r.documents) blocks += CeilDiv(static_cast<int64_t>(d.tokens.size()), B);
  return blocks;
}

uint64_t EngineCore::Add(PreparedRequest prepared, uint64_t id) {
  auto r = std::make_unique<Request>();
  r->id = id != 0 ? id : next_id_++;
  r->prepared = std::move(prepared);
  r->submitted = r->prepared.submitted == absl::InfinitePast() ? absl::Now()
                                                                : r->prepared.submitted;
  const SamplingParams& sp = r->prepared.sampling;
  r->sampler = std::make_unique<Sampler>(sp);
  r->decoder = std::make_unique<StreamingDecoder>(tokenizer_);
  r->stop = std::make_unique<StopMatcher>(sp.stop);
  r->stop_ids = sp.stop_token_ids;
  if (!sp.ignore_eos) {
    for (int32_t id : tokenizer_->end_of_generation_ids()) r->stop_ids.push_back(id);
  }
  r->result.usage.prompt_tokens = r->prepared.prompt_tokens();
  r->result.usage.documents = static_cast<int64_t>(r->prepared.documents.size());
  for (const auto& d : r->prepared.documents) {
    r->result.usage.document_tokens += static_cast<int64_t>(d.tokens.size());
  }
  id = r->id;
  const int64_t needed = BlocksNeeded(r->prepared);
  if (needed > options_.num_kv_blocks) {
    Finish(*r, absl::ResourceExhaustedError(absl::StrCat(
                   "request needs ", needed, " KV blocks of ", block_size(),
                   " tokens (prompt and max_tokens) but the worker has ", options_.num_kv_blocks,
                   " in all; shorten the documents or max_tokens")));
    return id;
  }
  waiting_.push_back(std::move(r));
  return id;
}

void EngineCore::Cancel(uint64_t id) {
  for (auto& r : running_) {
    if (r->id == id) r->cancelled = true;
  }
  for (auto& r : waiting_) {
    if (r->id == id) r->cancelled = true;
  }
}

absl::Time EngineCore::NextDeadline() const {
  absl::Time t = absl::InfiniteFuture();
  for (const auto& r : running_) t = std::min(t, r->prepared.deadline);
  for (const auto& r : waiting_) t = std::min(t, r->prepared.deadline);
  return t;
}

EngineLoad EngineCore::Load() const {
  EngineLoad load;
  // (Requests that finished while a pipelined step ran stay in running_ until it is collected.)
  load.running = static_cast<int>(std::count_if(
      running_.begin(), running_.end(),
      [](const auto& r) { return r->phase != Request::Phase::kDone; }));
  load.waiting = static_cast<int>(waiting_.size());
  for (const auto& r : waiting_) {
    load.queued_prefill_tokens +=
        r->prepared.prompt_tokens() + static_cast<int64_t>(r->result.token_ids.size());
  }
  for (const auto& r : running_) {
    if (r->phase != Request::Phase::kPrefill) continue;
    for (const Segment& s : r->segments) {
      if (s.job == nullptr) load.queued_prefill_tokens += s.length() - s.ready;
    }
  }
  for (const EncodeJob* job : job_order_) {
    load.queued_prefill_tokens += static_cast<int64_t>(job->token_storage.size()) - job->ready;
  }
  return load;
}

// --- Admission ------------------------------------------------------------------------------

void EngineCore::Admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    Request& r = *waiting_.front();
    if (!TryAdmit(r)) break;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

bool EngineCore::TryAdmit(Request& r) {
  const PreparedRequest& p = r.prepared;
  const CacheMode mode = p.mode;
  const int64_t B = block_size();
  ModeCounters& counters = stats_.mode(mode);
  const bool first_admission = !r.counted;
  r.segments.clear();
  RequestUsage& usage = r.result.usage;
  usage.cached_tokens = 0;
  usage.documents_hit = 0;
  usage.document_cached_tokens = 0;

  // The query segment carries what was generated before a preemption: it is recomputed.
  std::vector<DocOutcome> outcomes;  // per segment, documents only
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
    auto match = cache_.prefixes().MatchAndPin(s.tokens, limit, cache_.Tick());
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
      auto match = cache_.prefixes().MatchAndPin(s.tokens, s.length(), cache_.Tick());
      s.blocks = std::move(match.blocks);
      s.ready = match.num_tokens;
      usage.cached_tokens += match.num_tokens;
      offset = s.length();
      r.segments.push_back(std::move(s));
    }
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
    for (size_t i = 0; i < r.segments.size(); ++i) {
      if (r.segments[i].kind == Segment::Kind::kDocument) outcomes[i] = AcquireDocument(r, r.segments[i]);
    }
  }

  // Blocks still to fill: own segments and documents being encoded (counted once per job).
  int64_t needed = 0;
  for (const Segment& s : r.segments) {
    if (s.job != nullptr) {
      if (s.job->waiters.size() == 1) needed += CeilDiv(s.length(), B) - static_cast<int64_t>(s.job->blocks.size());
    } else {
      needed += CeilDiv(s.length(), B) - static_cast<int64_t>(s.blocks.size());
    }
  }
  if (needed > cache_.AvailableBlocks() && !running_.empty()) {
    Release(r);  // try again when running requests have finished
    return false;
  }
  if (first_admission) {
    r.counted = true;
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
  return true;
}

EngineCore::DocOutcome EngineCore::AcquireDocument(Request& r, Segment& s) {
  if (const CachedDocument* hit = cache_.documents().Lookup(s.cache_key)) {
    s.blocks = hit->blocks;
    for (BlockId b : s.blocks) cache_.pool().Ref(b);
    s.ready = s.length();
    r.result.usage.cached_tokens += s.length();
    r.result.usage.document_cached_tokens += s.length();
    ++r.result.usage.documents_hit;
    return DocOutcome::kHit;
  }
  DocCacheKey found;
  if (r.prepared.mode == CacheMode::kBlock) {
    if (const CachedDocument* other = cache_.documents().FindAnyOffset(s.cache_key.doc, &found)) {
      // Pin the source while allocating the copy, so eviction cannot take it.
      const std::vector<BlockId> src = other->blocks;
      for (BlockId b : src) cache_.pool().Ref(b);
      std::vector<BlockId> dst;
      bool ok = true;
      while (ok && dst.size() < src.size()) {
        auto b = cache_.Allocate();
        if (b) dst.push_back(*b);
        ok = b.has_value();
      }
      if (ok) {
        std::vector<BlockCopy> copies;
        // A position-agnostic (lazy) entry holds K at local positions, i.e. at offset 0.
        const int64_t from = found.offset == DocCacheKey::kAnyOffset ? 0 : found.offset;
        const int32_t delta = static_cast<int32_t>(s.offset - from);
        for (size_t i = 0; i < src.size(); ++i) copies.push_back({src[i], dst[i], delta});
        // A failed copy (device error) falls back to encoding the document.
        ok = runner_->CopyBlocks(copies).ok();
      }
      if (ok) {
        cache_.documents().Insert(s.cache_key, dst, s.length());
        s.blocks = dst;  // the request keeps the references Allocate gave it
        s.ready = s.length();
        r.result.usage.cached_tokens += s.length();
        r.result.usage.document_cached_tokens += s.length();
      } else {
        for (BlockId b : dst) cache_.pool().Unref(b);
      }
      for (BlockId b : src) cache_.pool().Unref(b);
      if (ok) return DocOutcome::kCopy;
    }
  }
  auto it = jobs_.find(s.cache_key);
  if (it == jobs_.end()) {
    auto job = std::make_unique<EncodeJob>();
    job->key = s.cache_key;
    job->mode = r.prepared.mode;
    job->token_storage = s.tokens;
    job->position_base = r.prepared.mode == CacheMode::kBlock ? s.offset : 0;
    job_order_.push_back(job.get());
    it = jobs_.emplace(s.cache_key, std::move(job)).first;
    ++stats_.encode_jobs;
  }
  it->second->waiters.push_back(&r);
  s.job = it->second.get();
  s.ready = 0;
  return DocOutcome::kEncode;
}

// --- Blocks, preemption, release ---------------------------------------------------------------

bool EngineCore::EnsureBlocks(std::vector<BlockId>& blocks, int64_t tokens, Request* owner) {
  while (static_cast<int64_t>(blocks.size()) * block_size() < tokens) {
    auto b = cache_.Allocate();
    if (!b) {
      if (owner == nullptr || !PreemptNewest(owner)) return false;
      continue;
    }
    blocks.push_back(*b);
  }
  return true;
}

bool EngineCore::PreemptNewest(const Request* keep) {
  // Newest first; never a request with a chunk in this step, never `keep` or anything older.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Request& victim = **it;
    if (&victim == keep) return false;
    if (victim.scheduled || victim.phase == Request::Phase::kDone) continue;
    Release(victim);
    victim.phase = Request::Phase::kWaiting;
    ++victim.result.preemptions;
    ++stats_.preemptions;
    waiting_.push_front(std::move(*it));
    running_.erase(std::next(it).base());
    return true;
  }
  return false;
}

void EngineCore::Release(Request& r) {
  for (Segment& s : r.segments) {
    for (BlockId b : s.blocks) cache_.pool().Unref(b);
    s.blocks.clear();
    s.ready = 0;
    if (EncodeJob* job = s.job) {
      s.job = nullptr;
      std::erase(job->waiters, &r);
      if (job->waiters.empty()) {
        for (BlockId b : job->blocks) cache_.pool().Unref(b);
        std::erase(job_order_, job);
        jobs_.erase(job->key);
      }
    }
  }
}

void EngineCore::Finish(Request& r, const absl::Status& status) {
  Release(r);
  r.phase = Request::Phase::kDone;
  if (status.ok()) {
    ++stats_.requests_ok;
  } else {
    ++stats_.requests_failed;
  }
  RequestResult& res = r.result;
  res.usage.completion_tokens = static_cast<int64_t>(res.token_ids.size());
  if (res.token_ids.size() > 1) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - r.first_token);
    if (seconds > 0) res.decode_tokens_per_s = (res.token_ids.size() - 1) / seconds;
  }
  if (r.prepared.callbacks.on_done) r.prepared.callbacks.on_done(status, res);
}

// --- Sampling ----------------------------------------------------------------------------------

void EngineCore::SampleAndEmit(Request& r, std::span<const float> logits,
                               std::optional<int32_t> chosen) {
  RequestResult& res = r.result;
  const int32_t id = chosen ? *chosen : r.sampler->Sample(logits);
  if (res.token_ids.empty() && r.first_token == absl::Time()) {
    r.first_token = absl::Now();  // after this step's forward pass, not at its start
    res.ttft_ms = absl::ToDoubleMilliseconds(r.first_token - r.submitted);
    if (options_.keep_first_logits) res.first_logits.assign(logits.begin(), logits.end());
  }
  auto finish = [&](const char* reason) {
    res.finish_reason = reason;
    if (!r.stop->stopped()) {
      const std::string tail = r.stop->Push(r.decoder->Flush());
      const std::string rest = r.stop->stopped() ? tail : tail + r.stop->Flush();
      res.text += rest;
      if (!rest.empty() && r.prepared.callbacks.on_token) r.prepared.callbacks.on_token(-1, rest);
    }
    Finish(r, absl::OkStatus());
  };
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end()) {
    finish("stop");
    return;
  }
  res.token_ids.push_back(id);
  Segment& q = r.query();
  q.tokens.push_back(id);
  auto piece = r.decoder->Push(id);
  const std::string text = r.stop->Push(piece.ok() ? *piece : std::string());
  res.text += text;
  if (r.prepared.callbacks.on_token) r.prepared.callbacks.on_token(id, text);
  if (r.stop->stopped()) {
    res.finish_reason = "stop";
    Finish(r, absl::OkStatus());
    return;
  }
  if (static_cast<int>(res.token_ids.size()) >= r.prepared.sampling.max_tokens ||
      q.offset + q.length() >= config().max_positions) {
    finish("length");
    return;
  }
  r.phase = Request::Phase::kDecode;
}

void EngineCore::OnPrefillDone(Request& r, std::span<const float> logits,
                               std::optional<int32_t> chosen) {
  Segment& q = r.query();
  const PreparedRequest& p = r.prepared;
  // Share what later requests can reuse: the whole prompt in mode prefix, the system prefix in
  // mode full (block/lazy insert their prefix segment when it completes).
  int64_t shareable = 0;
  if (p.mode == CacheMode::kPrefix) shareable = q.length() - static_cast<int64_t>(r.result.token_ids.size());
  if (p.mode == CacheMode::kFull) shareable = static_cast<int64_t>(p.system_prefix.size());
  if (shareable > 0) {
    cache_.prefixes().Insert(std::span(q.tokens).first(shareable),
                             std::span(q.blocks).first(std::min<size_t>(q.blocks.size(), shareable / block_size())),
                             cache_.Tick());
  }
  SampleAndEmit(r, logits, chosen);
}

void EngineCore::CompleteJob(EncodeJob& job) {
  const int64_t n = static_cast<int64_t>(job.token_storage.size());
  cache_.documents().Insert(job.key, job.blocks, n);
  for (Request* w : job.waiters) {
    for (Segment& s : w->segments) {
      if (s.job != &job) continue;
      s.job = nullptr;
      s.blocks = job.blocks;
      for (BlockId b : s.blocks) cache_.pool().Ref(b);
      s.ready = n;
    }
  }
  for (BlockId b : job.blocks) cache_.pool().Unref(b);
  std::erase(job_order_, &job);
  jobs_.erase(job.key);  // destroys job
}

// --- One step ----------------------------------------------------------------------------------

std::vector<KvBlockEntry> EngineCore::TableFor(const Request& r, size_t seg,
                                               int64_t own_tokens) const {
  const int64_t B = block_size();
  // Sized once: a decode step rebuilds every running sequence's table (130 entries each at 2K
  // tokens), and growing them entry by entry was a tenth of the engine's host time per step.
  size_t entries = 0;
  for (size_t i = 0; i <= seg; ++i) {
    const int64_t len = i == seg ? own_tokens : r.segments[i].length();
    entries += static_cast<size_t>((len + B - 1) / B);
  }
  std::vector<KvBlockEntry> table;
  table.reserve(entries);
  for (size_t i = 0; i <= seg; ++i) {
    const Segment& s = r.segments[i];
    const int64_t len = i == seg ? own_tokens : s.length();
    const uint32_t delta = static_cast<uint32_t>(TableDelta(r.prepared.mode, s.offset));
    for (int64_t b = 0; b * B < len; ++b) {
      table.push_back(PackKvBlockEntry(s.blocks[b], delta,
                                       static_cast<uint32_t>(std::min(B, len - b * B))));
    }
  }
  return table;
}

std::vector<int64_t> EngineCore::SlotsFor(const std::vector<BlockId>& blocks, int64_t start,
                                          int64_t n) const {
  const int64_t B = block_size();
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = int64_t{blocks[(start + i) / B]} * B + (start + i) % B;
  return slots;
}

bool EngineCore::Step(absl::Time now) {
  ++stats_.steps;
  // 0. A pipelined decode step launched by the previous call: when nothing else wants the
  // device, the next decode step is launched behind it before its results are read, so the
  // device goes from one to the other without waiting for this thread.
  if (!in_flight_.empty()) {
    std::vector<Planned> launched = std::move(in_flight_);
    in_flight_.clear();
    std::optional<std::vector<Planned>> next = LaunchChainedDecode(launched, now);
    ApplyResults(launched, runner_->Collect());
    if (next) {
      // A request that finished just now but is a row of `next` (it stopped on a stop token)
      // stays in running_ until `next` is collected; its blocks are back in the pool already,
      // and anything launched later that reuses them runs after `next` on the device.
      std::erase_if(running_, [&](const auto& r) {
        return r->phase == Request::Phase::kDone &&
               std::none_of(next->begin(), next->end(),
                            [&](const Planned& p) { return p.request == r.get(); });
      });
      in_flight_ = std::move(*next);
      return true;
    }
    std::erase_if(running_, [](const auto& r) { return r->phase == Request::Phase::kDone; });
  }
  // 1. Cancellations and deadlines.
  auto expire = [&](Request& r) {
    if (r.phase == Request::Phase::kDone) return;
    if (r.cancelled) Finish(r, absl::CancelledError("request cancelled"));
    else if (r.prepared.deadline <= now) Finish(r, absl::DeadlineExceededError("request deadline passed"));
  };
  for (auto& r : running_) expire(*r);
  for (auto& r : waiting_) expire(*r);
  std::erase_if(running_, [](const auto& r) { return r->phase == Request::Phase::kDone; });
  std::erase_if(waiting_, [](const auto& r) { return r->phase == Request::Phase::kDone; });

  // 2. Admission.
  Admit();

  // 3. Plan the batch.
  std::vector<Planned> plan;
  plan.reserve(running_.size() + job_order_.size());
  int64_t budget = options_.max_batch_tokens;
  const int64_t B = block_size();
  auto plan_segment = [&](Request& r, size_t si, int64_t n, bool decode) {
    Segment& s = r.segments[si];
    Planned p;
    p.request = &r;
    p.segment = si;
    p.decode = decode;
    p.slots = SlotsFor(s.blocks, s.ready, n);
    p.table = TableFor(r, si, s.ready + n);
    int64_t before = 0;
    for (size_t i = 0; i < si; ++i) before += r.segments[i].length();
    p.chunk.segment_delta = s.offset;
    p.chunk.local_start = s.ready;
    p.chunk.k_rotation_base = KRotationBase(r.prepared.mode, s.offset);
    p.chunk.first_query_index = before + s.ready;
    p.chunk.tokens = std::span(s.tokens).subspan(s.ready, n);
    p.chunk.emit_logits = s.kind == Segment::Kind::kQuery && s.ready + n == s.length();
    // Greedy requests need only the argmax, unless the first step's logits are to be kept.
    p.chunk.greedy = r.prepared.sampling.temperature == 0 &&
                     !(options_.keep_first_logits && r.result.token_ids.empty());
    r.scheduled = true;
    plan.push_back(std::move(p));
    budget -= n;
  };
  for (auto& r : running_) r->scheduled = false;

  // Decodes first: one token each, oldest request first.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& r = *running_[i];
    if (r.phase != Request::Phase::kDecode) continue;
    Segment& q = r.query();
    if (!EnsureBlocks(q.blocks, q.ready + 1, &r)) continue;
    plan_segment(r, r.segments.size() - 1, 1, /*decode=*/true);
  }
  // Document encodings, in the order they were started.
  for (EncodeJob* job : std::vector<EncodeJob*>(job_order_)) {
    if (budget <= 0) break;
    const int64_t len = static_cast<int64_t>(job->token_storage.size());
    const int64_t n = std::min(budget, len - job->ready);
    if (n <= 0 || !EnsureBlocks(job->blocks, job->ready + n, nullptr)) continue;
    Planned p;
    p.job = job;
    p.slots = SlotsFor(job->blocks, job->ready, n);
    for (int64_t b = 0; b * B < job->ready + n; ++b) {
      p.table.push_back(PackKvBlockEntry(job->blocks[b], 0,
                                         static_cast<uint32_t>(std::min(B, job->ready + n - b * B))));
    }
    p.chunk.tokens = std::span(job->token_storage).subspan(job->ready, n);
    p.chunk.segment_delta = job->position_base;
    p.chunk.local_start = job->ready;
    p.chunk.k_rotation_base = job->position_base;
    p.chunk.first_query_index = job->ready;
    p.chunk.emit_logits = false;
    for (Request* w : job->waiters) w->scheduled = true;  // their blocks must not be preempted
    plan.push_back(std::move(p));
    budget -= n;
  }
  // Prefills: the system prefix tail, then (documents ready) the query.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& r = *running_[i];
    if (r.phase != Request::Phase::kPrefill) continue;
    size_t si = 0;
    bool blocked = false;
    for (; si < r.segments.size(); ++si) {
      const Segment& s = r.segments[si];
      if (s.ready == s.length()) continue;
      blocked = s.kind == Segment::Kind::kDocument;  // waits for its encoding job
      break;
    }
    if (blocked || si == r.segments.size()) continue;
    Segment& s = r.segments[si];
    const int64_t n = std::min(budget, s.length() - s.ready);
    if (!EnsureBlocks(s.blocks, s.ready + n, &r)) continue;
    plan_segment(r, si, n, /*decode=*/false);
  }

  if (plan.empty()) {
    if (running_.size() > 1) {
      // Everyone is stuck on blocks: make room by preempting the newest request.
      for (auto& r : running_) r->scheduled = false;
      PreemptNewest(nullptr);
      return true;
    }
    if (running_.size() == 1) {
      Finish(*running_[0], absl::ResourceExhaustedError(
                               "KV cache exhausted: the request cannot proceed even alone"));
      running_.clear();
      return true;
    }
    return false;
  }

  // 4. One forward pass; an all-greedy decode step is only launched, and its results are read
  // by the next call (step 0), which may first launch the step after it.
  std::vector<ForwardChunk> chunks = ChunksOf(plan);
  const bool pipeline = options_.pipeline_decode && runner_->SupportsPipelinedDecode() &&
                        std::all_of(plan.begin(), plan.end(), [](const Planned& p) {
                          return p.decode && p.chunk.emit_logits && p.chunk.greedy;
                        });
  if (pipeline) {
    absl::Status launched = runner_->Launch(chunks, /*previous_step_rows=*/{});
    if (launched.ok()) {
      in_flight_ = std::move(plan);
      return true;
    }
    ApplyResults(plan, launched);
  } else {
    ApplyResults(plan, runner_->Forward(chunks));
  }
  std::erase_if(running_, [](const auto& r) { return r->phase == Request::Phase::kDone; });
  return true;
}

std::optional<std::vector<EngineCore::Planned>> EngineCore::LaunchChainedDecode(
    std::span<const Planned> launched, absl::Time now) {
  // Only when this step would be the launched requests, one token each, with nothing to admit,
  // cancel, expire or encode (those need the host's view after the launched step). Waiting
  // requests stop the chain only when one could be admitted (a full batch keeps a queue) or
  // must end now.
  const bool can_admit =
      !waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running;
  const bool waiting_ends = std::any_of(waiting_.begin(), waiting_.end(), [&](const auto& r) {
    return r->cancelled || r->prepared.deadline <= now;
  });
  if (can_admit || waiting_ends || !job_order_.empty() || launched.size() != running_.size()) {
    return std::nullopt;
  }
  for (const Planned& p : launched) {
    const Request* r = p.request;
    if (r == nullptr || !p.decode || r->phase != Request::Phase::kDecode || r->cancelled ||
        r->prepared.deadline <= now) {
      return std::nullopt;
    }
  }
  // The launched step writes position q.ready (its input token); this one writes q.ready + 1,
  // the token the launched step samples, which the runner takes from the device. Requests the
  // launched step surely finishes (their last token by max_tokens or the context) are left out,
  // as the step after it would leave them out; one that stops on a stop token is a row of this
  // step whose result is dropped.
  std::vector<int32_t> rows;
  for (size_t i = 0; i < launched.size(); ++i) {
    const Request& r = *launched[i].request;
    const Segment& q = r.segments[launched[i].segment];
    const bool last_token =
        static_cast<int64_t>(r.result.token_ids.size()) + 1 >= r.prepared.sampling.max_tokens ||
        q.offset + q.length() + 1 >= config().max_positions;
    if (!last_token) rows.push_back(static_cast<int32_t>(i));
  }
  if (rows.empty()) return std::nullopt;
  for (int32_t i : rows) {
    Segment& q = launched[i].request->segments[launched[i].segment];
    if (!EnsureBlocks(q.blocks, q.ready + 2, /*owner=*/nullptr)) return std::nullopt;
  }
  static constexpr int32_t kTokenFromDevice = 0;  // placeholder the runner does not read
  std::vector<Planned> next(rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const Planned& p = launched[rows[k]];
    Request& r = *p.request;
    const Segment& q = r.segments[p.segment];
    Planned& n = next[k];
    n.request = &r;
    n.segment = p.segment;
    n.decode = true;
    n.slots = SlotsFor(q.blocks, q.ready + 1, 1);
    n.table = TableFor(r, p.segment, q.ready + 2);
    n.chunk = p.chunk;  // the segment's offsets and the greedy/logits flags
    n.chunk.tokens = std::span(&kTokenFromDevice, 1);
    n.chunk.local_start = q.ready + 1;
    n.chunk.first_query_index = p.chunk.first_query_index + 1;
  }
  if (!runner_->Launch(ChunksOf(next), rows).ok()) {
    return std::nullopt;  // the launched step is collected as usual, and the next call plans
  }
  return next;
}

void EngineCore::ApplyResults(std::span<Planned> plan,
                              const absl::StatusOr<ForwardOutput>& logits) {
  if (!logits.ok()) {
    for (Planned& p : plan) {
      if (p.request && p.request->phase != Request::Phase::kDone) Finish(*p.request, logits.status());
    }
    return;
  }
  const int64_t V = config().vocab_size;
  int64_t row = 0, greedy_row = 0;
  for (Planned& p : plan) {
    const int64_t n = static_cast<int64_t>(p.chunk.tokens.size());
    std::span<const float> out;
    std::optional<int32_t> chosen;
    if (p.chunk.emit_logits && p.chunk.greedy) {
      chosen = logits->greedy_ids[greedy_row++];
    } else if (p.chunk.emit_logits) {
      out = std::span<const float>(logits->logits).subspan(row++ * V, V);
    }
    if (p.job != nullptr) {
      p.job->ready += n;
      stats_.mode(p.job->mode).prefill_tokens_computed += n;
      if (p.job->ready == static_cast<int64_t>(p.job->token_storage.size())) CompleteJob(*p.job);
      continue;
    }
    Request& r = *p.request;
    if (r.phase == Request::Phase::kDone) continue;
    Segment& s = r.segments[p.segment];
    s.ready += n;
    if (p.decode) {
      SampleAndEmit(r, out, chosen);
      continue;
    }
    stats_.mode(r.prepared.mode).prefill_tokens_computed += n;
    if (s.ready < s.length()) continue;
    if (s.kind == Segment::Kind::kPrefix) {
      cache_.prefixes().Insert(s.tokens, s.blocks, cache_.Tick());
    } else if (s.kind == Segment::Kind::kQuery) {
      OnPrefillDone(r, out, chosen);
    }
  }
}

std::vector<ForwardChunk> EngineCore::ChunksOf(std::span<Planned> plan) {
  std::vector<ForwardChunk> chunks;
  chunks.reserve(plan.size());
  for (Planned& p : plan) {
    p.chunk.kv_slots = p.slots;
    p.chunk.block_table = p.table;
    chunks.push_back(p.chunk);
  }
  return chunks;
}

}  // namespace lazyattn
