// EngineCore: what a step computes. Planning the batch (decodes, document encodings, prefills
// under the token budget; a failed step's items one at a time) and the chunks' slots and block
// tables.
#include <algorithm>

#include "services/worker/engine/engine_core_state.h"
#include "services/worker/engine/sampler.h"

namespace lazyattn {

bool EngineCore::HasSuspects() const {
  return std::any_of(running_.begin(), running_.end(),
                     [this](RequestId id) { return requests_.at(id)->suspect_tokens > 0; }) ||
         std::any_of(jobs_.begin(), jobs_.end(),
                     [](const auto& j) { return j.second->suspect_tokens > 0; });
}

void EngineCore::PlanSegment(Request& r, size_t si, int64_t n, bool decode,
                             std::vector<Planned>& plan) {
  Segment& s = r.segments[si];
  Planned p;
  p.request = r.id;
  p.segment = si;
  p.decode = decode;
  p.slots = SlotsFor(s.blocks, s.ready, n);
  TableFor(r, si, s.ready + n, p.chunk);
  int64_t before = 0;
  for (size_t i = 0; i < si; ++i) before += r.segments[i].length();
  p.chunk.segment_delta = s.offset;
  p.chunk.local_start = s.ready;
  p.chunk.k_rotation_base = KRotationBase(r.prepared.mode, s.offset);
  p.chunk.first_query_index = before + s.ready;
  p.chunk.tokens = std::span(s.tokens).subspan(s.ready, n);
  p.chunk.emit_logits = s.kind == Segment::Kind::kQuery && s.ready + n == s.length();
  // The runner draws the token (draw number = tokens generated so far; penalties over the
  // question, then what was generated: Request::PenaltyHistory); the first step's logits come
  // back too when they are to be kept, and every step's when the request wants the most
  // likely alternatives (EngineCore::SampleAndEmit ranks them on the host).
  p.chunk.sampling = RowSamplingParams(r.prepared.sampling, r.result.token_ids.size());
  p.chunk.penalties = r.PenaltyCountsNow(p.chunk.sampling);
  p.chunk.logit_bias = r.prepared.sampling.logit_bias;
  p.chunk.return_logits =
      p.chunk.emit_logits && ((options_.keep_first_logits && r.result.token_ids.empty()) ||
                              r.prepared.sampling.top_logprobs > 0);
  r.scheduled = true;
  plan.push_back(std::move(p));
}

std::vector<EngineCore::Planned> EngineCore::PlanBatch(PlanScope scope) {
  std::vector<Planned> plan;
  plan.reserve(scope == PlanScope::kOneSuspect ? 1 : running_.size() + jobs_.size());
  int64_t budget = options_.max_batch_tokens;
  const int64_t B = block_size();
  const bool isolating = scope == PlanScope::kOneSuspect;
  // Whether an item belongs in this plan, and how many of its tokens at most.
  auto wanted = [&](int64_t suspect_tokens) {
    return isolating ? suspect_tokens > 0 && plan.empty() : suspect_tokens == 0;
  };
  auto cap = [&](int64_t n, int64_t suspect_tokens) {
    return isolating ? std::min(n, suspect_tokens) : n;
  };

  // Decodes first: one token each, oldest request first. (Preemption may shrink running_.)
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& r = *requests_.at(running_[i]);
    if (r.phase != Request::Phase::kDecode || !wanted(r.suspect_tokens)) continue;
    Segment& q = r.query();
    if (!EnsureBlocks(q.blocks, q.ready + 1, r.id)) continue;
    PlanSegment(r, r.segments.size() - 1, 1, /*decode=*/true, plan);
    budget -= 1;
  }
  // Document encodings, in the order they were started.
  for (auto& [job_id, job] : jobs_) {
    if (budget <= 0) break;
    if (!wanted(job->suspect_tokens)) continue;
    const int64_t n = cap(std::min(budget, job->length() - job->ready), job->suspect_tokens);
    if (n <= 0 || !EnsureBlocks(job->blocks, job->ready + n, /*owner=*/0)) continue;
    Planned p;
    p.job = job_id;
    p.slots = SlotsFor(job->blocks, job->ready, n);
    for (int64_t b = 0; b * B < job->ready + n; ++b) {
      p.table.push_back(PackKvBlockEntry(
          job->blocks[b], 0, static_cast<uint32_t>(std::min(B, job->ready + n - b * B))));
    }
    p.chunk.tokens = std::span(job->tokens).subspan(job->ready, n);
    p.chunk.segment_delta = job->position_base;
    p.chunk.local_start = job->ready;
    p.chunk.k_rotation_base = job->position_base;
    p.chunk.first_query_index = job->ready;
    p.chunk.emit_logits = false;
    // Their blocks must not be preempted while this chunk writes the job's.
    for (const EncodeJob::Waiter& w : job->waiters) requests_.at(w.request)->scheduled = true;
    plan.push_back(std::move(p));
    budget -= n;
  }
  // Prefills: the system prefix tail, then (documents ready) the query.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Request& r = *requests_.at(running_[i]);
    if (r.phase != Request::Phase::kPrefill || !wanted(r.suspect_tokens)) continue;
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
    const int64_t n = cap(std::min(budget, s.length() - s.ready), r.suspect_tokens);
    if (!EnsureBlocks(s.blocks, s.ready + n, r.id)) continue;
    PlanSegment(r, si, n, /*decode=*/false, plan);
    budget -= n;
  }
  return plan;
}

void EngineCore::TableFor(Request& r, size_t seg, int64_t own_tokens, ForwardChunk& chunk) {
  SequenceBlockTable& t = r.table;
  // Segments before `seg` are covered whole on the way (each once in the table's life); the last
  // covered one is revisited, as it may have grown. A table that went past `seg` (never, as the
  // engine plans segments in order) is rebuilt.
  if (seg + 1 < t.segments()) ResetTable(r);
  bool covered = true;
  for (size_t i = t.segments() == 0 ? 0 : t.segments() - 1; covered && i <= seg; ++i) {
    const Segment& s = r.segments[i];
    covered = t.Cover(i, s.blocks, i == seg ? own_tokens : s.length(),
                      static_cast<uint32_t>(TableDelta(r.prepared.mode, s.offset)));
  }
  // A segment without its blocks (a bug: blocks are ensured before planning) leaves the chunk an
  // empty table, which the runner refuses as not covering the chunk: the request fails.
  if (!covered) ResetTable(r);
  const SequenceBlockTable::Snapshot snap = t.Take();
  chunk.block_table = snap.entries;
  chunk.table_sequence = snap.sequence;
  chunk.table_version = snap.version;
  chunk.table_unchanged = snap.unchanged;
}

void EngineCore::ResetTable(Request& r) { r.table.Reset(next_table_sequence_++); }

std::vector<KvBlockEntry> EngineCore::RebuildTable(const Request& r, size_t seg,
                                                   int64_t own_tokens) const {
  const int64_t B = block_size();
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
    // (Bounded by the blocks held: the check that calls this must not read past them.)
    for (int64_t b = 0; b * B < len && b < static_cast<int64_t>(s.blocks.size()); ++b) {
      table.push_back(
          PackKvBlockEntry(s.blocks[b], delta, static_cast<uint32_t>(std::min(B, len - b * B))));
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

std::vector<ForwardChunk> EngineCore::ChunksOf(std::span<Planned> plan) {
  std::vector<ForwardChunk> chunks;
  chunks.reserve(plan.size());
  for (Planned& p : plan) {
    p.chunk.kv_slots = p.slots;
    if (p.job != 0) p.chunk.block_table = p.table;
    chunks.push_back(p.chunk);
  }
  return chunks;
}

}  // namespace lazyattn
