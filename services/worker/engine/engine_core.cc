#include "services/worker/engine/engine_core.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/device_error.h"
#include "common/monotonic_time.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine_core_state.h"

namespace lazyattn {
namespace {

// What a step's requests end with when its runner refused it. Their inputs were checked on
// arrival (CheckPreparedRequest): the fault is the engine's, so a code telling a client its
// request was bad (INVALID_ARGUMENT for a chunk) becomes INTERNAL; a device's own codes stay.
absl::Status StepFailureStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return absl::InternalError(absl::StrCat("the engine's step failed: ", s.message()));
    default:
      return s;
  }
}

}  // namespace

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
  for (auto& [id, r] : requests_) Finish(*r, absl::UnavailableError("engine shut down"));
}

int64_t EngineCore::BlocksNeeded(const PreparedRequest& r) const {
  const int64_t B = block_size();
  // Generation also ends at the model's context (finish "length"), so a max_tokens past it
  // reserves nothing a request can use; counting it would refuse requests that fit.
  const int64_t gen = std::min<int64_t>(
      r.sampling.max_tokens, std::max<int64_t>(0, config().max_positions - r.prompt_tokens()));
  if (!EncodesDocumentsAlone(r.mode)) return CeilDiv(r.prompt_tokens() + gen, B);
  int64_t blocks = CeilDiv(static_cast<int64_t>(r.system_prefix.size()), B) +
                   CeilDiv(static_cast<int64_t>(r.question.size()) + gen, B);
  // Mode lazy stores a document once however often the request names it.
  absl::flat_hash_set<DocumentKey> seen;
  for (const auto& d : r.documents) {
    if (r.mode == CacheMode::kLazy && !seen.insert(d.key).second) continue;
    blocks += CeilDiv(static_cast<int64_t>(d.tokens.size()), B);
  }
  return blocks;
}

uint64_t EngineCore::Add(PreparedRequest prepared, uint64_t id) {
  auto r = std::make_unique<Request>();
  if (id == 0) {
    while (requests_.contains(next_id_)) ++next_id_;
    id = next_id_++;
  }
  r->id = id;
  r->prepared = std::move(prepared);
  r->submitted =
      r->prepared.submitted == absl::InfinitePast() ? MonotonicNow() : r->prepared.submitted;
  if (r->prepared.deadline == absl::InfiniteFuture()) {
    r->prepared.deadline = r->submitted + options_.default_deadline;
  }
  if (!r->prepared.sampling.seed) {
    // Unseeded: a fresh seed per request (else every unseeded request would draw the same
    // tokens); it is fixed from here on, so the request's own draws stay one Philox stream.
    thread_local absl::BitGen gen;
    r->prepared.sampling.seed = absl::Uniform<uint64_t>(gen);
  }
  const SamplingParams& sp = r->prepared.sampling;
  r->sampler = std::make_unique<Sampler>(sp);
  r->decoder = std::make_unique<StreamingDecoder>(tokenizer_);
  r->stop = std::make_unique<StopMatcher>(sp.stop);
  r->stop_ids = sp.stop_token_ids;
  if (!sp.ignore_eos) {
    for (int32_t eos : tokenizer_->end_of_generation_ids()) r->stop_ids.push_back(eos);
  }
  r->result.usage.prompt_tokens = r->prepared.prompt_tokens();
  r->result.usage.documents = static_cast<int64_t>(r->prepared.documents.size());
  for (const auto& d : r->prepared.documents) {
    r->result.usage.document_tokens += static_cast<int64_t>(d.tokens.size());
  }
  const int64_t needed = BlocksNeeded(r->prepared);
  absl::Status invalid;
  if (!health_.ok()) {
    Finish(*r, absl::UnavailableError(health_.message()));
  } else if (requests_.contains(id)) {
    Finish(*r, absl::AlreadyExistsError(absl::StrCat("request id ", id, " is in use")));
  } else if (invalid = CheckPreparedRequest(r->prepared, config()); !invalid.ok()) {
    Finish(*r, invalid);
  } else if (needed > options_.num_kv_blocks) {
    Finish(*r,
           absl::FailedPreconditionError(
               r->prepared.prefetch
                   ? absl::StrCat("documents: need ", needed, " KV blocks of ", block_size(),
                                  " tokens together but the worker has ", options_.num_kv_blocks,
                                  " in all; send fewer documents per Prefetch")
                   : absl::StrCat("request needs ", needed, " KV blocks of ", block_size(),
                                  " tokens (prompt and max_tokens) but the worker has ",
                                  options_.num_kv_blocks,
                                  " in all; shorten the documents or max_tokens")));
  } else {
    requests_.emplace(id, std::move(r));
    waiting_.push_back(id);
  }
  return id;
}

void EngineCore::Cancel(uint64_t id) {
  if (Request* r = FindRequest(id)) r->cancelled = true;
}

absl::Time EngineCore::NextDeadline() const {
  absl::Time t = absl::InfiniteFuture();
  for (const auto& [id, r] : requests_) t = std::min(t, r->prepared.deadline);
  return t;
}

// --- One step ----------------------------------------------------------------------------------

bool EngineCore::Step(absl::Time now) {
  ++stats_.steps;
  step_computed_ = false;
  const bool progressed = RunStep(now);
  VerifyPool();
  EraseFinished();
  // Only a forward pass whose results came back says the queue moves: a step that only
  // preempted, or whose pass failed, is no sign of life for the requests waiting.
  if (step_computed_) ReportQueued(now);
  return progressed;
}

void EngineCore::VerifyPool() {
  const BlockPool& pool = cache_.pool();
  absl::Status problem;
  if (pool.errors() > 0) {
    problem = absl::InternalError(
        absl::StrCat(pool.errors(), " misuses of the KV block pool, first: ", pool.first_error()));
  } else if (pool.num_free() + pool.num_referenced() + pool.num_cached_unreferenced() !=
             pool.num_blocks()) {
    problem = absl::InternalError("KV block pool counts do not add up");
  } else if (options_.check_pool_every_step) {
    problem = cache_.CheckInvariant();
    // Every persistent table equals the table rebuilt from its request's segments.
    for (RequestId id : running_) {
      const Request& r = *requests_.at(id);
      const SequenceBlockTable& t = r.table;
      if (!problem.ok() || r.phase == Request::Phase::kDone || t.segments() == 0) continue;
      const std::vector<KvBlockEntry> rebuilt =
          RebuildTable(r, t.segments() - 1, t.last_segment_tokens());
      if (!std::equal(rebuilt.begin(), rebuilt.end(), t.entries().begin(), t.entries().end())) {
        problem = absl::InternalError(absl::StrCat(
            "the block table of request ", id, " (", t.entries().size(),
            " entries) differs from its rebuild (", rebuilt.size(), ")"));
      }
    }
  }
  if (problem.ok() || !health_.ok()) return;
  // A bug, not bad input: blocks may now have two owners, so no answer computed from them can be
  // trusted. Stop serving; requests that never ran are safe to retry on another worker.
  stats_.pool_errors = std::max<int64_t>(1, pool.errors());
  StopServing(absl::InternalError(absl::StrCat("KV cache inconsistent, the worker stops serving: ",
                                               problem.message())),
              /*running_unavailable=*/false);
}

void EngineCore::StopServing(const absl::Status& why, bool running_unavailable) {
  health_ = why;
  if (!in_flight_.empty()) {
    (void)runner_->Collect();
    in_flight_.clear();
  }
  const absl::Status unavailable = absl::UnavailableError(why.message());
  for (RequestId id : running_) Finish(*requests_.at(id), running_unavailable ? unavailable : why);
  for (RequestId id : waiting_) Finish(*requests_.at(id), unavailable);
}

bool EngineCore::RunStep(absl::Time now) {
  // 0. A pipelined decode step launched by the previous call: when nothing else wants the
  // device, the next decode step is launched behind it before its results are read, so the
  // device goes from one to the other without waiting for this thread. A request that finishes
  // as the launched step is read may be a row of the next one: its result is dropped then (its
  // id no longer names a request), and its blocks, back in the pool, are reused only by work
  // launched after the next step on the device.
  if (!in_flight_.empty()) {
    std::vector<Planned> launched = std::move(in_flight_);
    in_flight_.clear();
    std::optional<std::vector<Planned>> next = LaunchChainedDecode(launched, now);
    const absl::StatusOr<ForwardOutput> collected = runner_->Collect();
    if (!collected.ok() && next) {
      // The chained step took its input tokens from the failed one: read and dropped.
      (void)runner_->Collect();
      next.reset();
    }
    ApplyResults(launched, collected);
    if (next) {
      in_flight_ = std::move(*next);
      return true;
    }
    EraseFinished();
  }
  // 1. Cancellations, deadlines, and requests not started once they are to end (EndUnstarted).
  for (auto& [id, r] : requests_) {
    if (r->phase == Request::Phase::kDone) continue;
    if (r->cancelled) {
      Finish(*r, absl::CancelledError("request cancelled"));
    } else if (r->prepared.deadline <= now) {
      Finish(*r, absl::DeadlineExceededError("request deadline passed"));
    } else if (EndsUnstarted(*r)) {
      Finish(*r, end_unstarted_);
    }
  }
  EraseFinished();

  // 2. Admission.
  Admit();

  // 3. Plan the batch: the items of a failed step one at a time while any can run (file
  // comment, "A failed step"), everything else otherwise.
  for (RequestId id : running_) requests_.at(id)->scheduled = false;
  std::vector<Planned> plan;
  if (HasSuspects()) plan = PlanBatch(PlanScope::kOneSuspect);
  const bool isolated = !plan.empty();
  if (!isolated) plan = PlanBatch(PlanScope::kAllButSuspects);

  if (plan.empty()) {
    if (running_.size() > 1) {
      // Everyone is stuck on blocks: make room by preempting the newest request.
      for (RequestId id : running_) requests_.at(id)->scheduled = false;
      PreemptNewest(/*keep=*/0);
      return true;
    }
    if (running_.size() == 1) {
      Finish(*requests_.at(running_[0]),
             absl::ResourceExhaustedError(
                 "KV cache exhausted: the request cannot proceed even alone"));
      return true;
    }
    return false;
  }

  // 4. One forward pass; a decode-only step is only launched, and its results are read
  // by the next call (step 0), which may first launch the step after it.
  std::vector<ForwardChunk> chunks = ChunksOf(plan);
  const bool pipeline = options_.pipeline_decode && runner_->SupportsPipelinedDecode() &&
                        !isolated && std::all_of(plan.begin(), plan.end(), [](const Planned& p) {
                          return p.decode && p.chunk.emit_logits;
                        });
  if (pipeline) {
    absl::Status launched = runner_->Launch(chunks, /*previous_step_rows=*/{});
    if (launched.ok()) {
      in_flight_ = std::move(plan);
      return true;
    }
    ApplyResults(plan, launched, isolated);
  } else {
    ApplyResults(plan, runner_->Forward(chunks), isolated);
  }
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
  const bool waiting_ends = std::any_of(waiting_.begin(), waiting_.end(), [&](RequestId id) {
    const Request& r = *requests_.at(id);
    return r.cancelled || r.prepared.deadline <= now || EndsUnstarted(r);
  });
  if (can_admit || waiting_ends || !jobs_.empty() || launched.size() != running_.size()) {
    return std::nullopt;
  }
  for (const Planned& p : launched) {
    const Request* r = FindRequest(p.request);
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
    const Request& r = *requests_.at(launched[i].request);
    const Segment& q = r.segments[launched[i].segment];
    const bool last_token =
        static_cast<int64_t>(r.result.token_ids.size()) + 1 >= r.prepared.sampling.max_tokens ||
        q.offset + q.length() + 1 >= config().max_positions;
    if (!last_token) rows.push_back(static_cast<int32_t>(i));
  }
  if (rows.empty()) return std::nullopt;
  for (int32_t i : rows) {
    Segment& q = requests_.at(launched[i].request)->segments[launched[i].segment];
    if (!EnsureBlocks(q.blocks, q.ready + 2, /*owner=*/0)) return std::nullopt;
  }
  static constexpr int32_t kTokenFromDevice = 0;  // placeholder the runner does not read
  std::vector<Planned> next(rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const Planned& p = launched[rows[k]];
    Request& r = *requests_.at(p.request);
    const Segment& q = r.segments[p.segment];
    Planned& n = next[k];
    n.request = p.request;
    n.segment = p.segment;
    n.decode = true;
    n.slots = SlotsFor(q.blocks, q.ready + 1, 1);
    n.chunk = p.chunk;  // the segment's offsets, sampling and logits flags
    TableFor(r, p.segment, q.ready + 2, n.chunk);
    n.chunk.sampling.step = p.chunk.sampling.step + 1;
    // The runner adds the input token drawn on the device.
    n.chunk.penalties = r.PenaltyCountsNow(n.chunk.sampling);
    n.chunk.tokens = std::span(&kTokenFromDevice, 1);
    n.chunk.local_start = q.ready + 1;
    n.chunk.first_query_index = p.chunk.first_query_index + 1;
  }
  if (!runner_->Launch(ChunksOf(next), rows).ok()) {
    return std::nullopt;  // the launched step is collected as usual, and the next call plans
  }
  return next;
}

void EngineCore::ApplyResults(std::span<Planned> plan, const absl::StatusOr<ForwardOutput>& logits,
                              bool isolated) {
  step_computed_ |= logits.ok();
  if (!logits.ok()) {
    ++stats_.step_failures;
    // A suspect failing alone is that item's fault, not the device's: it does not count toward
    // stopping (two bad requests in one batch must not stop a sound worker). A broken device
    // still fails every ordinary step after.
    if (!isolated) ++consecutive_step_failures_;
    const bool sticky = IsStickyDeviceError(logits.status());
    const bool stop =
        health_.ok() && (sticky || (!isolated && consecutive_step_failures_ >=
                                                     options_.max_consecutive_step_failures));
    absl::Status why;
    if (stop) {
      why = absl::UnavailableError(absl::StrCat(
          sticky ? std::string("sticky device error")
          : consecutive_step_failures_ == 1
              ? std::string("a failed step (engine.max_consecutive_step_failures 1)")
              : absl::StrCat(consecutive_step_failures_, " failed steps in a row"),
          ", the worker stops serving: ", logits.status().message()));
    }
    // Nothing of the step was applied. Of an ordinary step of several items (some may have
    // ended since it was launched), each live one runs alone next, at most its chunk's tokens
    // (the file comment, "A failed step"); their tables start afresh, as the runner may hold a
    // version of them it never used.
    if (!stop && !isolated && plan.size() > 1) {
      bool marked = false;
      for (const Planned& p : plan) {
        const int64_t tokens = std::max<int64_t>(1, static_cast<int64_t>(p.chunk.tokens.size()));
        if (EncodeJob* job = p.job != 0 ? FindJob(p.job) : nullptr; job != nullptr) {
          job->suspect_tokens = tokens;
          marked = true;
        } else if (Request* r = FindRequest(p.request);
                   r != nullptr && r->phase != Request::Phase::kDone) {
          r->suspect_tokens = tokens;
          ResetTable(*r);
          marked = true;
        }
      }
      stats_.steps_isolated += marked;
      return;
    }
    // The one item fails, and so does every request waiting for it if it is an encoding (else
    // they would wait for a job that may never succeed). When the worker stops serving, the
    // failure is the worker's, not the requests': Unavailable.
    const absl::Status status = stop ? why : StepFailureStatus(logits.status());
    for (Planned& p : plan) {
      if (Request* r = FindRequest(p.request); r != nullptr) Finish(*r, status);
      if (p.job != 0) FailJob(p.job, status);
    }
    if (stop) StopServing(why, /*running_unavailable=*/true);
    return;
  }
  if (!isolated) consecutive_step_failures_ = 0;
  for (const Planned& p : plan) {  // passed a step: a suspect no more
    if (EncodeJob* job = p.job != 0 ? FindJob(p.job) : nullptr; job != nullptr) {
      job->suspect_tokens = 0;
    } else if (Request* r = FindRequest(p.request); r != nullptr) {
      r->suspect_tokens = 0;
    }
  }
  const int64_t V = config().vocab_size;
  int64_t row = 0, logits_row = 0;
  std::vector<RequestId> progressed;  // prompts that advanced in this step
  for (Planned& p : plan) {
    const int64_t n = static_cast<int64_t>(p.chunk.tokens.size());
    std::span<const float> out;
    std::optional<int32_t> chosen;
    float logprob = 0;
    if (p.chunk.emit_logits) {
      if (static_cast<size_t>(row) < logits->logprobs.size()) logprob = logits->logprobs[row];
      chosen = logits->token_ids[row++];
      if (p.chunk.return_logits) {
        out = std::span<const float>(logits->logits).subspan(logits_row++ * V, V);
      }
    }
    if (p.job != 0) {
      EncodeJob* job = FindJob(p.job);
      if (job == nullptr) continue;
      for (const EncodeJob::Waiter& w : job->waiters) progressed.push_back(w.request);
      job->ready += n;
      stats_.mode(job->mode).prefill_tokens_computed += n;
      if (job->ready == job->length()) CompleteJob(*job);
      continue;
    }
    Request* r = FindRequest(p.request);
    if (r == nullptr || r->phase == Request::Phase::kDone) continue;
    Segment& s = r->segments[p.segment];
    s.ready += n;
    if (p.decode) {
      SampleAndEmit(*r, out, chosen, logprob);
      continue;
    }
    stats_.mode(r->prepared.mode).prefill_tokens_computed += n;
    progressed.push_back(r->id);
    if (s.ready < s.length()) continue;
    if (s.kind == Segment::Kind::kPrefix) {
      cache_.prefixes().Insert(s.tokens, s.blocks, cache_.Tick(), r->prepared.prefix_scope);
    } else if (s.kind == Segment::Kind::kQuery) {
      OnPrefillDone(*r, out, chosen, logprob);
    }
  }
  if (!progressed.empty()) ReportPrefillProgress(progressed);
}

}  // namespace lazyattn
