// What the engine needs from a backend: one forward step over a batch of chunks, and the block
// copy of the `block` cache mode, on KV storage the backend owns. The CPU backend (fp32, OpenBLAS)
// and the CUDA backend (bf16, fused kernels) implement it; EngineCore never knows which it has.
//
// Deferred RoPE (DESIGN.md section 2): a token at segment-local position m of a segment that starts
// at global position delta has its Q rotated by delta + m and its K by k_rotation_base + m (m alone
// for position-agnostic KV, valid at any placement). The chunk's block table carries each block's
// delta, applied to K at attention time.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_MODEL_RUNNER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device_error.h"
#include "kernels/include/block_copy.h"
#include "kernels/include/kv_block_entry.h"
#include "kernels/include/sampling.h"
#include "services/worker/model/model_config.h"

namespace lazyattn {

// A run of consecutive tokens of one segment of one sequence.
struct ForwardChunk {
  std::span<const int32_t> tokens;
  int64_t segment_delta = 0;  // global position of the segment's first token
  int64_t local_start = 0;    // segment-local position of tokens[0]
  // K is written rotated at k_rotation_base + local: 0 for position-agnostic KV (mode lazy; the
  // table's delta rotates it later), segment_delta for KV stored at global positions.
  int64_t k_rotation_base = 0;
  // KV slot (block * block_size + slot) of each token; its K/V is written there this step.
  std::span<const int64_t> kv_slots;
  // Everything the chunk attends to, in sequence order, including the blocks its own tokens are
  // written to. tokens[0] has sequence index `first_query_index` in this table.
  // Lifetime of every span in a chunk: valid only during the Forward or Launch call that receives
  // it (the engine may grow or free the vectors behind them right after, e.g. a running sequence's
  // table); a backend copies what it needs later, at Collect or in a later step.
  std::span<const KvBlockEntry> block_table;
  int64_t first_query_index = 0;
  // Persistent tables (docs/kernels.md, "Block tables across steps"). A running sequence's table
  // lives between its steps and only grows, so a backend may keep it (on the device) and take only
  // what changed. `block_table` is then version `table_version` (1, 2, ...) of the table of
  // sequence `table_sequence`, and its entries [0, table_unchanged) are exactly those of version
  // table_version - 1 (which had at least that many). A sequence id is never reused, and one id's
  // versions come in order, one per chunk. table_sequence 0: no such promise, the whole table is
  // new (encoding jobs, tests). A backend that did not see version table_version - 1 (a failed
  // step, another chunk in between) must take the whole table; one that ignores these fields
  // reads `block_table` whole, as the CPU backend does.
  uint64_t table_sequence = 0;
  uint64_t table_version = 0;
  int64_t table_unchanged = 0;
  // Logits for every token of the chunk (tests, scoring) or only for the last one (generation),
  // or none (document encoding, prefix computation: the LM head runs only where we sample).
  bool logits_for_all_tokens = false;
  bool emit_logits = true;
  // How the runner draws the token of this chunk's emitting row (its last, or every row of a
  // logits_for_all_tokens chunk): kernels/include/sampling.h. The default, temperature 0, is
  // greedy (argmax, the lowest id among equal maxima). `sampling.step` is the index of the token
  // being generated and, with the seed, all the draw's randomness (penalty ranges are the
  // runner's to fill).
  SamplingRowParams sampling;
  // The penalty history's counts (PenaltyEntries or PenaltyCounts, sampler.h, of the question
  // then the output so far: distinct ids, in_prompt for the question's), read only when
  // `sampling` has penalties. Counts rather than the history, so a step costs the runner
  // O(distinct ids), not O(history). In a chained launch (previous_step_rows) the input token,
  // drawn on the device, counts as one more output occurrence.
  std::span<const PenaltyEntry> penalties;
  // The request's logit bias (SamplingParams::logit_bias: distinct ids in increasing order),
  // read only when `sampling` has kLogitBias.
  std::span<const LogitBias> logit_bias;
  // Also return the emitting rows' fp32 logits (the LM head's, before penalties): tests,
  // scoring, EngineOptions::keep_first_logits. A GPU backend copies vocab_size floats per row.
  bool return_logits = false;
};

// What one step returns, for the rows that emit (chunks with emit_logits; every token of a
// logits_for_all_tokens chunk, else its last), in chunk order: every row's drawn id in
// `token_ids`, its log-probability in `logprobs` (0 unless sampling asked, kSampleLogprob), and
// the fp32 logits of the return_logits chunks' rows in `logits` ([rows][vocab]).
struct ForwardOutput {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<float> logits;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  // "cpu" or "cuda" (for logs and metrics).
  virtual std::string backend_name() const = 0;
  // Physical KV blocks of kDefaultKvBlockSize tokens the backend's storage holds; block ids in
  // chunks and copies are below it.
  virtual int64_t num_kv_blocks() const = 0;

  // Runs the chunks, writes their K/V, draws every emitting row's token and returns the ids
  // (and the logits rows requested).
  // InvalidArgument (naming the chunk) for token ids out of the vocabulary,
  // positions past the model's context, or slot/table sizes that do not match; the KV storage is
  // untouched then. Internal for a device failure; a backend marks it sticky
  // (MarkStickyDeviceError, common/device_error.h) when the device cannot recover in this process
  // (a corrupt CUDA context), and the engine then stops serving at once instead of counting one
  // failed step (EngineOptions::max_consecutive_step_failures). Launch and Collect likewise.
  virtual absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) = 0;

  // K[dst] = R_delta K[src], V[dst] = V[src] for every layer (kernels/include/block_copy.h).
  virtual absl::Status CopyBlocks(std::span<const BlockCopy> copies) = 0;

  // Pipelined decode, for backends that can enqueue a step before the host has read the one
  // before it (the CUDA backend): the host then schedules step N+1 while step N runs, as
  // SGLang's overlap scheduler does, and the device never waits for the host between them.
  //   Launch enqueues `chunks` as Forward would and returns without waiting; Collect waits for
  //   the oldest launched step and returns what Forward would have returned for it. At most two
  //   launched steps are uncollected; Forward and CopyBlocks need none. With
  //   `previous_step_rows` (one entry per chunk; each chunk one token), chunk i takes as its
  //   input token the id drawn for row previous_step_rows[i] of the step launched just before
  //   (one emitting row per chunk, any sampling); the chunks' own `tokens` are then not read.
  // A backend without it (the default) answers Unimplemented.
  virtual bool SupportsPipelinedDecode() const { return false; }
  virtual absl::Status Launch(std::span<const ForwardChunk> chunks,
                              std::span<const int32_t> previous_step_rows);
  virtual absl::StatusOr<ForwardOutput> Collect();
};

// Draws every emitting row's token on the host (SampleRowCpu) from `logits`, the rows of every
// emitting row in chunk order ([rows][vocab]), and keeps the rows of return_logits chunks. For
// backends that compute every row on the host.
ForwardOutput SampleRowsOnHost(std::span<const ForwardChunk> chunks, std::vector<float> logits,
                               int64_t vocab_size);

// Checks what every backend must refuse before touching its storage (the InvalidArgument cases
// of Forward). `num_kv_blocks` bounds block ids and slots. O(every table's entries).
absl::Status ValidateForwardChunks(std::span<const ForwardChunk> chunks, const ModelConfig& config,
                                   int64_t num_kv_blocks, int block_size = kDefaultKvBlockSize);

// What a chunk's table holds, for a backend that checks only its new tail.
struct TableSummary {
  int64_t keys = 0;          // valid slots over all entries
  int64_t delta_entries = 0;  // entries with a nonzero delta
};
// ValidateForwardChunks for chunk `index` alone, whose table entries [0, checked) were checked
// before (when the backend first saw them) and sum to `checked_summary`: only the entries from
// `checked` on are read, so the cost is independent of the context. Returns the whole table's
// summary.
absl::StatusOr<TableSummary> ValidateForwardChunk(const ForwardChunk& chunk, size_t index,
                                                  const ModelConfig& config, int64_t num_kv_blocks,
                                                  int block_size, int64_t checked,
                                                  TableSummary checked_summary);

// A runner that passes every call to the runner it owns: the base of runners that change a few
// calls and keep the rest (fault injection, tests' wrappers), so none forgets one.
class ForwardingModelRunner : public ModelRunner {
 public:
  explicit ForwardingModelRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    return inner_->Forward(chunks);
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    return inner_->CopyBlocks(copies);
  }
  bool SupportsPipelinedDecode() const override { return inner_->SupportsPipelinedDecode(); }
  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override {
    return inner_->Launch(chunks, previous_step_rows);
  }
  absl::StatusOr<ForwardOutput> Collect() override { return inner_->Collect(); }

 protected:
  ModelRunner& inner() { return *inner_; }

 private:
  std::unique_ptr<ModelRunner> inner_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_MODEL_RUNNER_H_
