// One forward step of a llama-architecture model on the CPU: fp32 activations, the matrices fp32
// or packed in their stored type (ModelWeights::packed(), kernels/include/quant_linear.h), whose
// decode products take 8-bit inputs by default (engine.cpu_activations, CpuActivations). Decode
// steps read the KV pool in place (PagedDecodeAttentionCpu); prefill takes the BLAS form, its
// (query head, query chunk) tasks over the kernel threads. The KV pools hold f16 or f32
// (kv_cache_cpu.h); the attention kernels widen f16 as they read it.
//
// A step takes several chunks at once (continuous batching): each chunk is a run of consecutive
// tokens of one segment of one sequence (model_runner.h). The linear layers run once over the rows
// of all chunks; attention runs per chunk over that chunk's block table.
//
// CpuRunner is stateless about KV (tests hand it any KvCacheCpu); CpuModelRunner is the engine's
// backend: a CpuRunner with the KV storage it owns.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_CPU_RUNNER_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_CPU_RUNNER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/include/kv_block_entry.h"
#include "kernels/include/rope.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/model_runner.h"
#include "services/worker/model/model_weights.h"

namespace lazyattn {

class CpuRunner {
 public:
  // `weights` must outlive the runner. The RoPE table covers the model's maximum context.
  explicit CpuRunner(const ModelWeights* weights);

  const ModelConfig& config() const { return weights_->config; }
  const RopeTable& rope() const { return rope_; }

  // Runs the chunks, writes their K/V into `kv`, and returns the logits rows requested, in chunk
  // order: [rows][vocab] (no sampling: every row comes back).
  // InvalidArgument (naming the chunk) for token ids out of the vocabulary, positions past the
  // RoPE table, or slot/table sizes that do not match.
  absl::StatusOr<std::vector<float>> Forward(std::span<const ForwardChunk> chunks,
                                             KvCacheCpu& kv);

 private:
  absl::Status Validate(std::span<const ForwardChunk> chunks, const KvCacheCpu& kv) const;

  const ModelWeights* weights_;
  RopeTable rope_;
};

class CpuModelRunner final : public ModelRunner {
 public:
  // `weights` must outlive the runner; `num_kv_blocks` blocks are allocated now, of element type
  // `kv_dtype` (nullopt: ConfiguredCpuKvCacheDtype(), engine.cpu_kv_cache). Callers that sized
  // `num_kv_blocks` for a type pass that type, so the pool cannot take another.
  CpuModelRunner(const ModelWeights* weights, int64_t num_kv_blocks,
                 std::optional<KvCacheDtype> kv_dtype = std::nullopt);
  // Owns the weights (random-weight models that nothing else holds).
  CpuModelRunner(std::unique_ptr<ModelWeights> weights, int64_t num_kv_blocks,
                 std::optional<KvCacheDtype> kv_dtype = std::nullopt);

  const ModelConfig& config() const override { return runner_.config(); }
  std::string backend_name() const override { return "cpu"; }
  int64_t num_kv_blocks() const override { return kv_.num_blocks(); }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    auto logits = runner_.Forward(chunks, kv_);
    if (!logits.ok()) return logits.status();
    return SampleRowsOnHost(chunks, std::move(*logits), config().vocab_size);
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override;

 private:
  std::unique_ptr<ModelWeights> owned_weights_;  // null when borrowed; before runner_
  CpuRunner runner_;
  KvCacheCpu kv_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_CPU_RUNNER_H_
