// One forward step of a llama-architecture model on the CPU (fp32, OpenBLAS).
//
// A step takes several chunks at once (continuous batching): each chunk is a run of consecutive
// tokens of one segment of one sequence. The linear layers run once over the rows of all chunks;
// attention runs per chunk over that chunk's block table.
//
// Deferred RoPE (DESIGN.md section 2): a token at segment-local position m of a segment that starts
// at global position delta has its Q rotated by delta + m and its K by k_rotation_base + m (m alone
// for position-agnostic KV, valid at any placement). The chunk's block table carries each block's
// delta, applied to K at attention time.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_CPU_RUNNER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_CPU_RUNNER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/include/kv_block_entry.h"
#include "kernels/include/rope.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {

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
  std::span<const KvBlockEntry> block_table;
  int64_t first_query_index = 0;
  // Logits for every token of the chunk (tests, scoring) or only for the last one (generation),
  // or none (document encoding, prefix computation: the LM head runs only where we sample).
  bool logits_for_all_tokens = false;
  bool emit_logits = true;
};

class CpuRunner {
 public:
  // `weights` must outlive the runner. The RoPE table covers the model's maximum context.
  explicit CpuRunner(const ModelWeights* weights);

  const ModelConfig& config() const { return weights_->config; }
  const RopeTable& rope() const { return rope_; }

  // Runs the chunks, writes their K/V into `kv`, and returns the logits rows requested, in chunk
  // order: [rows][vocab]. InvalidArgument (naming the chunk) for token ids out of the vocabulary,
  // positions past the RoPE table, or slot/table sizes that do not match.
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardChunk> chunks,
                                             KvCacheCpu& kv);

 private:
  absl::Status Validate(std::span<const ForwardChunk> chunks, const KvCacheCpu& kv) const;

  const ModelWeights* weights_;
  RopeTable rope_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_CPU_RUNNER_H_
