// CudaModelRunner::Launch: one step, enqueued on the runner's stream. The host assembles the
// step's metadata (rows in device order, decode chunks first; the decode tables' plan; the
// prefill plan; the emitting rows and their sampling parameters) into one pinned section list,
// grows the buffers it needs, uploads it in one copy, then enqueues the layers (eagerly, or as
// a decode graph: cuda_decode_graphs.cc) and the copies back into the step's host slot, which
// Collect (cuda_model_runner.cc) reads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_linear.h"
#include "kernels/cuda/swiglu.h"
#include "services/worker/cuda/cuda_runner_state.h"
#include "services/worker/cuda/decode_table_gather.h"
#include "services/worker/cuda/decode_table_store.h"
#include "services/worker/engine/sampler.h"

namespace lazyattn {
namespace {

using cuda_runner_internal::bf16;
using cuda_runner_internal::Buffer;
using cuda_runner_internal::GraphKey;

int64_t Align16(int64_t n) { return (n + 15) / 16 * 16; }

constexpr int kGraphBlockBucket = 64;  // table width granularity of decode graphs (1,024 tokens)

// A one-token chunk whose query sees every key of its table (`keys` valid slots): the decode
// kernel's case.
bool IsDecodeChunk(const ForwardChunk& ch, int64_t keys) {
  return ch.tokens.size() == 1 && !ch.block_table.empty() && ch.first_query_index == keys - 1;
}

}  // namespace

absl::Status CudaModelRunner::Launch(std::span<const ForwardChunk> chunks,
                                     std::span<const int32_t> previous_step_rows) {
  const auto entered = std::chrono::steady_clock::now();
  const ModelConfig& c = config();
  State& s = *state_;
  // Each table is checked over the entries the device does not hold yet: O(new entries).
  std::vector<DecodeTableStore::Checked> checked(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSIGN_OR_RETURN(checked[i], s.tables.Check(chunks[i], i, c, num_kv_blocks_));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].k_rotation_base > chunks[i].segment_delta) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward chunk ", i, ": k_rotation_base past the segment's offset"));
    }
  }
  if (chunks.empty()) return absl::InvalidArgumentError("a launched step needs chunks");
  if (s.in_flight.size() >= 2) {
    return absl::FailedPreconditionError("two launched steps are already uncollected");
  }
  const bool chained = !previous_step_rows.empty();
  const int64_t previous_greedy_rows = s.last_greedy_rows;
  const bool previous_argmax_only = s.last_argmax_only;
  // Only a launch that succeeds says what the next one may take its tokens from.
  s.last_greedy_rows = -1;
  if (chained) {
    bool valid = previous_step_rows.size() == chunks.size() && previous_greedy_rows > 0;
    for (size_t i = 0; valid && i < chunks.size(); ++i) {
      valid = chunks[i].tokens.size() == 1 && previous_step_rows[i] >= 0 &&
              previous_step_rows[i] < previous_greedy_rows;
    }
    if (!valid) {
      return absl::FailedPreconditionError(absl::StrCat(
          "previous_step_rows: ", previous_step_rows.size(), " rows for ", chunks.size(),
          " chunks of one token each, each below the emitting rows of the step before (",
          previous_greedy_rows, ")"));
    }
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  // The slot the uncollected step (if any) does not use.
  const int slot_index = s.in_flight.empty() ? 0 : 1 - s.in_flight.back();
  State::HostSlot& slot = s.slots[slot_index];
  if (slot.logits_pending) {
    // Its step's collection failed before its wait for the rows' copy ended: that copy may
    // still read the slot's buffers.
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(slot.logits_copied));
    slot.logits_pending = false;
  }

  // --- Host: the step's metadata, rows in device order (decode chunks first). ---
  std::vector<size_t> order;
  std::vector<bool> is_decode(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    is_decode[i] = IsDecodeChunk(chunks[i], checked[i].summary.keys);
    if (is_decode[i]) order.push_back(i);
  }
  const int num_decode = static_cast<int>(order.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!is_decode[i]) order.push_back(i);
  }
  int64_t rows = 0;
  for (const ForwardChunk& ch : chunks) rows += static_cast<int64_t>(ch.tokens.size());
  std::vector<int32_t> tokens, local, deltas;
  std::vector<int64_t> slots;
  std::vector<int64_t> chunk_row(chunks.size());
  tokens.reserve(rows);
  local.reserve(rows);
  deltas.reserve(rows);
  slots.reserve(rows);
  bool any_delta = false;
  int max_decode_blocks = 0;
  for (size_t i : order) {
    const ForwardChunk& ch = chunks[i];
    chunk_row[i] = static_cast<int64_t>(tokens.size());
    for (size_t t = 0; t < ch.tokens.size(); ++t) {
      tokens.push_back(ch.tokens[t]);
      // K at k_rotation_base + local, Q at segment_delta + local (RopeKvAppend's convention).
      local.push_back(static_cast<int32_t>(ch.k_rotation_base + ch.local_start + t));
      deltas.push_back(static_cast<int32_t>(ch.segment_delta - ch.k_rotation_base));
      slots.push_back(ch.kv_slots[t]);
    }
    any_delta |= checked[i].summary.delta_entries > 0;
  }
  for (int d = 0; d < num_decode; ++d) {
    max_decode_blocks =
        std::max(max_decode_blocks, static_cast<int>(chunks[order[d]].block_table.size()));
  }
  // Decode-only steps replay a CUDA graph per (batch, table width, ...): the table width is
  // rounded up so one graph serves kGraphBlockBucket blocks of growth (rows are zero-padded and
  // the kernel stops at each sequence's own block count).
  const bool decode_only = num_decode == static_cast<int>(chunks.size());
  if (decode_only && use_graphs_) {
    max_decode_blocks = (max_decode_blocks + kGraphBlockBucket - 1) / kGraphBlockBucket *
                        kGraphBlockBucket;
  }
  // Only what the device does not hold of each decode table goes up (decode_table_store.h); the
  // gather kernel assembles the [num_decode][max_decode_blocks] table on the device.
  DecodeTableStore::LaunchGuard table_guard(s.tables);
  std::vector<const ForwardChunk*> decode_chunks;
  std::vector<int64_t> decode_from;
  for (int d = 0; d < num_decode; ++d) {
    decode_chunks.push_back(&chunks[order[d]]);
    decode_from.push_back(checked[order[d]].from);
  }
  const DecodeTableStore::StepPlan tables = s.tables.PlanStep(decode_chunks, decode_from);
  // Emitting rows, chunk order: their device rows, sampling parameters (penalty histories
  // appended to one entry list) and whether their logits come back.
  std::vector<int32_t> logit_rows;
  std::vector<bool> row_logits;
  std::vector<SamplingRowParams> row_params;
  std::vector<PenaltyEntry> penalties;
  bool argmax_only = true, any_logprob = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ForwardChunk& ch = chunks[i];
    if (!ch.emit_logits) continue;
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    SamplingRowParams p = ch.sampling;
    p.penalty_begin = p.penalty_count = 0;
    if (AdjustsLogits(p)) {
      const std::vector<PenaltyEntry> e = RowAdjustments(p, ch.penalties, ch.logit_bias);
      p.penalty_begin = static_cast<int32_t>(penalties.size());
      p.penalty_count = static_cast<int32_t>(e.size());
      penalties.insert(penalties.end(), e.begin(), e.end());
      if (chained && HasPenalties(p)) p.flags |= kCountInputToken;
    }
    argmax_only &= SamplingIsGreedy(p) && !AdjustsLogits(p) && !(p.flags & kSampleLogprob);
    any_logprob |= (p.flags & kSampleLogprob) != 0;
    for (int64_t t = ch.logits_for_all_tokens ? 0 : n - 1; t < n; ++t) {
      logit_rows.push_back(static_cast<int32_t>(chunk_row[i] + t));
      row_logits.push_back(ch.return_logits);
      row_params.push_back(p);
    }
  }
  const int64_t out_rows = static_cast<int64_t>(logit_rows.size());
  const int64_t logits_rows = std::count(row_logits.begin(), row_logits.end(), true);

  PagedPrefillPlan plan;
  const int num_prefill = static_cast<int>(chunks.size()) - num_decode;
  if (num_prefill > 0) {
    std::vector<PagedPrefillSequence> seqs;
    for (size_t k = num_decode; k < order.size(); ++k) {
      const ForwardChunk& ch = chunks[order[k]];
      seqs.push_back({.num_queries = static_cast<int>(ch.tokens.size()),
                      .first_query_index = ch.first_query_index,
                      .block_table = ch.block_table.data(),
                      .num_blocks = static_cast<int>(ch.block_table.size())});
    }
    RETURN_IF_ERROR(plan.Build({.num_heads = c.num_heads,
                                .num_kv_heads = c.num_kv_heads,
                                .head_dim = c.head_dim,
                                .num_pool_blocks = num_kv_blocks_},
                               seqs.data(), num_prefill,
                               {.sm_count = s.sm_count,
                                .rope_max_positions = c.max_positions,
                                .ctas_per_sm = PrefillCtasPerSm(
                                    prefill_kernel_, c.head_dim,
                                    any_delta ? PrefillRotation::kRotateQ
                                              : PrefillRotation::kNone)}));
  }

  // Where each row's input token comes from in the step before (pipelined decode), device order.
  // (Always `rows` long, so the sections after it keep their offsets in a replayed graph.)
  std::vector<int32_t> token_source_rows(rows, 0);
  if (chained) {
    for (size_t k = 0; k < order.size(); ++k) token_source_rows[k] = previous_step_rows[order[k]];
  }

  // One metadata buffer, one upload.
  using Section = cuda_runner_internal::StepSection;
  Section sec[] = {{tokens.data(), rows * 4},
                   {local.data(), rows * 4},
                   {deltas.data(), rows * 4},
                   {slots.data(), rows * 8},
                   {logit_rows.data(), out_rows * 4},
                   {tables.rows.data(),
                    static_cast<int64_t>(tables.rows.size() * sizeof(DecodeTableRow))},
                   {tables.num_blocks.data(), int64_t{num_decode} * 4},
                   {plan.metadata(), num_prefill > 0 ? plan.metadata_bytes() : 0},
                   {token_source_rows.data(), static_cast<int64_t>(token_source_rows.size()) * 4},
                   {row_params.data(), out_rows * static_cast<int64_t>(sizeof(SamplingRowParams))},
                   {penalties.data(),
                    static_cast<int64_t>(penalties.size() * sizeof(PenaltyEntry))},
                   // Last: its size changes from step to step, and a replayed graph needs the
                   // sections it reads at the offsets it was captured with.
                   {tables.patch.data(),
                    static_cast<int64_t>(tables.patch.size() * sizeof(KvBlockEntry))}};
  int64_t meta_bytes = 0;
  for (Section& x : sec) {
    x.offset = meta_bytes;
    meta_bytes += Align16(x.bytes);
  }

  // --- Buffers (grown only while no launched step can still use them: see `grows`). ---
  const int64_t H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  const int64_t V = c.vocab_size, qkv_width = Q + 2 * KV;
  const int64_t generation_before = Buffer::generation();
  const int64_t dense_table_bytes = int64_t{num_decode} * max_decode_blocks * 8;
  const bool grows = rows > s.row_capacity || out_rows > s.logit_row_capacity ||
                     meta_bytes > s.metadata.bytes() || tables.store_grew ||
                     dense_table_bytes > s.decode_tables.bytes() ||
                     (num_prefill > 0 && plan.workspace_bytes() > s.prefill_workspace.bytes());
  if (grows && !s.in_flight.empty()) RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s.stream));
  // Every Reserve that grows frees its old memory first, so once one has run, the decode graphs
  // hold dangling pointers, whether or not a later Reserve fails: they are dropped on both ways
  // out. (Dropped only on success, a step whose prefill workspace could not grow, after its row
  // buffers had, left them in place; a decode-only step, which reserves no workspace and so grew
  // nothing, then replayed one into freed memory.)
  const absl::Status grown = [&]() -> absl::Status {
    if (rows > s.row_capacity) {
      // None of the group until all have the room: a Reserve that fails leaves its buffer empty,
      // and a smaller step after it must grow it again rather than use it.
      s.row_capacity = 0;
      const int64_t cap = std::max<int64_t>(rows, 256);
      for (auto [buf, width] : {std::pair{&s.h, H},
                                {&s.qkv, qkv_width},
                                {&s.q_rot, Q},
                                {&s.attn, Q},
                                {&s.gate_up, 2 * I},
                                {&s.act, I}}) {
        RETURN_IF_ERROR(buf->Reserve(cap * width * static_cast<int64_t>(sizeof(bf16))));
      }
      RETURN_IF_ERROR(s.x.Reserve(cap * H * static_cast<int64_t>(sizeof(float))));
      RETURN_IF_ERROR(s.delta.Reserve(cap * H * static_cast<int64_t>(sizeof(float))));
      s.row_capacity = cap;
    }
    if (out_rows > s.logit_row_capacity) {
      s.logit_row_capacity = 0;  // as row_capacity above
      const int64_t cap = std::max<int64_t>(out_rows, 64);
      RETURN_IF_ERROR(s.last_hidden.Reserve(cap * H * static_cast<int64_t>(sizeof(bf16))));
      RETURN_IF_ERROR(s.logits.Reserve(cap * V * static_cast<int64_t>(sizeof(float))));
      RETURN_IF_ERROR(s.sampled.Reserve(cap * static_cast<int64_t>(sizeof(uint64_t))));
      RETURN_IF_ERROR(s.ids.Reserve(cap * static_cast<int64_t>(sizeof(int32_t))));
      RETURN_IF_ERROR(s.logprobs.Reserve(cap * static_cast<int64_t>(sizeof(float))));
      s.logit_row_capacity = cap;
    }
    RETURN_IF_ERROR(s.metadata.Reserve(std::max<int64_t>(meta_bytes, int64_t{1} << 20)));
    RETURN_IF_ERROR(s.table_store.Reserve(s.tables.store_entries() * 8));
    RETURN_IF_ERROR(s.decode_tables.Reserve(dense_table_bytes));
    if (num_prefill > 0) RETURN_IF_ERROR(s.prefill_workspace.Reserve(plan.workspace_bytes()));
    return absl::OkStatus();
  }();
  if (Buffer::generation() != generation_before) s.ClearGraphs();  // they hold old pointers
  RETURN_IF_ERROR(grown);
  // This slot's pinned buffers: no uncollected step uses them.
  RETURN_IF_ERROR(slot.metadata.Reserve(std::max<int64_t>(meta_bytes, int64_t{1} << 20)));
  RETURN_IF_ERROR(slot.logits.Reserve(std::max<int64_t>(logits_rows, 1) * V *
                                      static_cast<int64_t>(sizeof(float))));
  // A device buffer no graph reads: growing it clears none (the check is above). Grown by
  // doubling, as batches ramp up; where the card has no room for it the rows come back as they
  // did before it, straight to the host on the step's stream.
  const int64_t staged_bytes = logits_rows * V * static_cast<int64_t>(sizeof(float));
  const bool stage_logits =
      logits_rows > 0 && slot.staged_logits
                             .Reserve(staged_bytes > slot.staged_logits.bytes()
                                          ? std::max(staged_bytes, 2 * slot.staged_logits.bytes())
                                          : staged_bytes)
                             .ok();
  RETURN_IF_ERROR(slot.sampled.Reserve(std::max<int64_t>(out_rows, 1) *
                                       static_cast<int64_t>(sizeof(uint64_t))));
  RETURN_IF_ERROR(slot.ids.Reserve(std::max<int64_t>(out_rows, 1) * 4));
  RETURN_IF_ERROR(slot.logprobs.Reserve(std::max<int64_t>(out_rows, 1) * 4));
  for (const Section& x : sec) {
    if (x.bytes > 0) std::memcpy(slot.metadata.as<char>(x.offset), x.src, x.bytes);
  }

  cudaStream_t st = s.stream;
  // Everything from the embedding to the greedy ids: the part a CUDA graph replays
  // (cuda_step_layers.cc).
  const cuda_runner_internal::StepShape shape{.rows = rows,
                                              .out_rows = out_rows,
                                              .num_decode = num_decode,
                                              .num_prefill = num_prefill,
                                              .max_decode_blocks = max_decode_blocks,
                                              .any_delta = any_delta,
                                              .decode_only = decode_only,
                                              .argmax_only = argmax_only,
                                              .plan = &plan,
                                              .sections = sec};
  auto enqueue_compute = [&]() -> absl::Status { return s.EnqueueLayers(*this, shape); };

  const auto prepared = std::chrono::steady_clock::now();
  auto enqueued = entered;
  slot.profiled = s.profiling;
  absl::Status status = [&]() -> absl::Status {
    if (slot.profiled) RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.start, st));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.metadata.as<void>(), slot.metadata.as<void>(),
                                         meta_bytes, cudaMemcpyHostToDevice, st));
    // Outside any graph: the patch's size and place change every step.
    RETURN_IF_ERROR(GatherDecodeTablesCuda(
        s.metadata.as<DecodeTableRow>(sec[5].offset), num_decode,
        s.metadata.as<KvBlockEntry>(sec[11].offset), s.table_store.as<KvBlockEntry>(),
        s.tables.capacity(), s.decode_tables.as<KvBlockEntry>(), max_decode_blocks, st));
    if (chained) {
      // The previous step's ids are still on the device (stream order): those of the rows
      // named become this step's tokens, over the placeholders just uploaded.
      if (previous_argmax_only) {
        RETURN_IF_ERROR(GreedyIdsToTokensCuda(s.sampled.as<uint64_t>(),
                                              s.metadata.as<int32_t>(sec[8].offset),
                                              static_cast<int>(rows),
                                              s.metadata.as<int32_t>(sec[0].offset), st));
      } else {
        RETURN_IF_ERROR(SampledIdsToTokensCuda(s.ids.as<int32_t>(),
                                               s.metadata.as<int32_t>(sec[8].offset),
                                               static_cast<int>(rows),
                                               s.metadata.as<int32_t>(sec[0].offset), st));
      }
    }
    if (decode_only && use_graphs_) {
      const GraphKey key{num_decode, max_decode_blocks, any_delta,
                         out_rows == 0 ? 0 : (argmax_only ? 1 : 2), static_cast<int>(out_rows)};
      RETURN_IF_ERROR(s.RunGraph(key, enqueue_compute));
    } else {
      RETURN_IF_ERROR(enqueue_compute());
    }
    if (slot.profiled) RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.end, st));
    enqueued = std::chrono::steady_clock::now();
    if (out_rows > 0) {
      if (argmax_only) {
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.sampled.as<void>(), s.sampled.as<void>(),
                                             out_rows * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                             st));
      } else {
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.ids.as<void>(), s.ids.as<void>(),
                                             out_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                             st));
        if (any_logprob) {
          RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.logprobs.as<void>(), s.logprobs.as<void>(),
                                               out_rows * sizeof(float), cudaMemcpyDeviceToHost,
                                               st));
        }
      }
      // Whole rows only where they were asked for, packed in order (one copy per run of
      // consecutive rows): staged on the device, then brought back on the copy stream.
      int64_t packed = 0;
      for (int64_t r = 0; r < out_rows;) {
        if (!row_logits[r]) {
          ++r;
          continue;
        }
        int64_t run = 1;
        while (r + run < out_rows && row_logits[r + run]) ++run;
        float* to = stage_logits ? slot.staged_logits.as<float>() : slot.logits.as<float>();
        RETURN_IF_CUDA_ERROR(
            cudaMemcpyAsync(to + packed * V, s.logits.as<float>() + r * V, run * V * sizeof(float),
                            stage_logits ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost, st));
        packed += run;
        r += run;
      }
      if (packed > 0 && stage_logits) {
        RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.rows_staged, st));
        RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s.copy_stream, slot.rows_staged, 0));
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.logits.as<void>(), slot.staged_logits.as<void>(),
                                             packed * V * sizeof(float), cudaMemcpyDeviceToHost,
                                             s.copy_stream));
        RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.logits_copied, s.copy_stream));
        slot.logits_pending = true;
      }
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.copied, st));
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    // Leave no launch reading buffers that may be regrown; an uncollected step before this one
    // stays collectable (its results are in its own slot).
    cudaStreamSynchronize(s.stream);
    cudaStreamSynchronize(s.copy_stream);
    slot.logits_pending = false;
    s.last_greedy_rows = -1;
    return status;
  }
  using Ms = std::chrono::duration<double, std::milli>;
  slot.row_logits = std::move(row_logits);
  slot.argmax_only = argmax_only;
  slot.any_logprob = any_logprob;
  slot.entered = entered;
  slot.prep_ms = Ms(prepared - entered).count();
  slot.enqueue_ms = Ms(enqueued - entered).count();
  bool one_row_each = out_rows == static_cast<int64_t>(chunks.size());
  for (const ForwardChunk& ch : chunks) one_row_each &= !ch.logits_for_all_tokens;
  s.last_greedy_rows = one_row_each ? out_rows : -1;
  s.last_argmax_only = argmax_only;
  s.in_flight.push_back(slot_index);
  s.chained_launches += chained;
  table_guard.Launched();
  return absl::OkStatus();
}

}  // namespace lazyattn
