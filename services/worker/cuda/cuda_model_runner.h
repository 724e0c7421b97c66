// The CUDA backend: one forward step of a llama-architecture model on one GPU, bf16 weights and a
// paged bf16 KV pool in HBM, behind the same ModelRunner interface as the CPU backend.
//
// A step is a fixed sequence of launches on the runner's stream:
//   metadata upload (one copy: token ids, positions, slots, the decode tables' new entries, the
//   prefill plan, the rows that need logits), the decode tables' gather from where they persist
//   on the device (decode_table_store.h), embedding gather, then per layer
//     RMSNorm -> QKV GEMM -> RoPE + KV append -> decode attention (one-token sequences that see
//     their whole table) and paged prefill attention (everything else) -> O GEMM (+= residual)
//     -> RMSNorm -> gate|up GEMM -> SwiGLU -> down GEMM (+= residual),
//   with the residual stream in fp32 (GEMM inputs, K/V and other activations are bf16): on
//   SmolLM2 a bf16 residual alone turns a greedy continuation at its third token,
//   and the LM head only over the rows that sample (fp32 logits); greedy rows are reduced to their
//   argmax on the GPU and only the ids come back, other rows come back whole.
// Rows are ordered decode-first inside the step so both attention kernels see contiguous
// queries; the logits come back in chunk order.
//
// Deferred RoPE is exactly the CPU backend's (model_runner.h): lazy-mode chunks carry deltas in
// their tables, which both attention kernels apply by rotating the query backward once per
// document (kernels/cuda/paged_*_attention.h). A step whose tables hold only zero deltas runs the kernels'
// no-rotation form.
//
// Not thread-safe (one engine thread drives it). Forward and CopyBlocks return once the GPU is
// done with the step.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_RUNNER_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_RUNNER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "services/worker/cuda/cuda_model_weights.h"
#include "services/worker/engine/model_runner.h"

namespace lazyattn {

struct CudaRunnerOptions {
  int device = 0;
  // HBM for K and V of every layer (bf16); the pool gets as many 16-token blocks as fit.
  int64_t kv_budget_bytes = int64_t{1} << 30;
  int64_t num_kv_blocks = 0;  // > 0: exactly this many blocks, ignoring the budget
  // Replay decode-only steps as CUDA graphs (one per batch size and table width bucket): one
  // launch instead of ~10 per layer.
  bool cuda_graphs = true;
  // Tune cuBLASLt for every row bucket of the model's GEMMs at creation instead of inside the
  // first steps that need them (tens of milliseconds each).
  bool warm_up_gemms = true;
  // Time cuBLASLt's candidate algorithms per row bucket and keep the fastest (CublasLtGemm's
  // autotuning). Off: the heuristic's first pick, the same in every runner on the same device;
  // for tests that compare two runners bit for bit, since two timings can rank near-tied
  // algorithms with different summation orders differently.
  bool autotune_gemms = true;
  // One-row products on the skinny CUDA-core kernel (kernels/cuda/skinny_linear.h) rather than
  // cuBLASLt; off only to measure what it gains. (The launch overlap of every kernel has its
  // own switch, LAZYATTN_OVERLAP_LAUNCHES in kernels/cuda/launch_overlap.cuh.)
  bool skinny_gemms = true;
  // At batch 1 (one row in the step), each layer's two RMSNorms run inside the skinny kernels
  // that read their output (SkinnyRmsNormLinearCuda), and the o and down projections add into
  // the residual themselves: 2 launches a layer fewer, bit-identical results. Needs
  // skinny_gemms; off only to measure what it gains.
  bool fused_norms = true;
  // Steps of more than wgmma_max_rows rows (prefill chunks; their products run on cuBLASLt):
  // the o and down projections add into the fp32 residual themselves (beta = 1) and the norms
  // after them only normalize, instead of writing a delta that AddRmsNormF32ToBf16Cuda adds. At
  // 8,192 rows each product saves a write and a read of the delta and the norm's write of x
  // (3 x 134 MB) for the product's read of x: 0.27 GB less traffic a layer, the products being
  // compute-bound. The same fp32 sums, so the same bits where cuBLASLt runs the same algorithm.
  // Off only to measure what it gains.
  bool residual_in_products = true;
  // Steps of 2 to wgmma_max_rows rows (at most 64; 0 = never) run the four layer products on
  // the wgmma + TMA few-row kernel (kernels/cuda/skinny_wgmma_linear.h), gate/up with SwiGLU
  // fused, rather than cuBLASLt, where the device supports it (compute capability 9.0).
  // Replayed from graphs its weight loads start before the previous kernel ends: batch 32 at 2K
  // context gained 0.7-3 % in tokens/s, all-cached TTFT (64 rows) was unchanged
  // (docs/benchmarks.md). `wgmma_cuts` overrides its choice of cut per product (zeros: the
  // kernel's; gate_up's tile_features count features, whose gate and up rows a CTA reads).
  int wgmma_max_rows = 64;
  // Where the wgmma kernel runs the QKV product and head_dim is 128, RoPE and the K/V append
  // run in its epilogue (SkinnyWgmmaLinearQkvRopeCuda) instead of RopeKvAppend's launch. Off:
  // it saves a launch (~0.08 ms a batch-32 step) but the heavier epilogue cost more, batch-32
  // decode lost 1.5-3.5 % (docs/kernels.md; the eighth pass in the history of
  // docs/benchmarks.md); kept to measure again.
  bool fused_qkv_rope = false;
  // The wgmma kernel reads its weights from a second copy in PackWeightsForWgmma's layout
  // (contiguous 8 KB blocks instead of 128-byte row pieces 8 KB+ apart), made at creation: as
  // much HBM again as the layer matrices (14 GB for llama3-8b). Batch-32 decode gained 2.4 %
  // (docs/kernels.md; the eighth pass in the history of docs/benchmarks.md). Made only when
  // the card has that much free memory plus kPackedWeightsHeadroomBytes after the KV pool;
  // otherwise the kernel reads the row-major
  // weights through its tensor maps and packed_weight_bytes() says 0.
  bool wgmma_packed_weights = true;
  // In decode-only steps the attention kernel issues its first K/V copies of blocks other than
  // each sequence's last (the only one the K/V append before it writes) before waiting for that
  // kernel (PagedDecodeArgs::early_kv_loads). Off only to measure what it gains.
  bool early_decode_kv_loads = true;
  // The prefill attention kernel (PagedPrefillArgs::kernel): the warp-specialized wgmma kernel
  // on compute capability 9.0 where it supports the shape (head_dim 128;
  // paged_prefill_attention.h), else mma.sync. Kernel rates: docs/benchmarks.md, "Prefill
  // attention (H200)"; whole steps against the first wgmma kernel (since removed): "CUDA
  // engine end to end".
  PrefillKernel prefill_kernel = PrefillKernel::kWgmmaWs;
  // kWgmmaWs's compiled variant (PagedPrefillArgs::variant; 0 is the one to use). Create
  // refuses one out of range.
  int prefill_variant = 0;
  struct WgmmaCuts {
    SkinnyWgmmaConfig qkv, o, gate_up, down;
  } wgmma_cuts;
};

// Free device memory the packed weight copy must leave for step buffers, cuBLASLt's workspace
// and the autotuning scratch (CudaRunnerOptions::wgmma_packed_weights).
inline constexpr int64_t kPackedWeightsHeadroomBytes = int64_t{2} << 30;

// Bytes one 16-token block of K and V takes across all layers (bf16).
int64_t CudaKvBytesPerBlock(const ModelConfig& config);

class CudaModelRunner final : public ModelRunner {
 public:
  // Takes the weights (already on `options.device`), allocates the KV pool and the RoPE table.
  // ResourceExhausted when the pool does not fit; Unavailable without a usable GPU.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      std::unique_ptr<CudaModelWeights> weights, const CudaRunnerOptions& options);
  ~CudaModelRunner() override;

  const ModelConfig& config() const override { return weights_->config(); }
  std::string backend_name() const override { return "cuda"; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override;
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override;
  // Pipelined decode (model_runner.h): a launched step's metadata and results use one of two
  // pinned host slots, and with previous_step_rows a small kernel turns the previous step's
  // argmax keys, still on the device, into this step's input tokens.
  bool SupportsPipelinedDecode() const override { return true; }
  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override;
  absl::StatusOr<ForwardOutput> Collect() override;

  int64_t weight_bytes() const { return weights_->bytes(); }
  int64_t kv_pool_bytes() const;
  // Where a step's time goes, when profiling is on (CUDA events around the step's GPU work;
  // benchmarks read it to separate GPU time from host overhead). Reset by set_profiling.
  struct StepProfile {
    int64_t steps = 0;
    double forward_wall_ms = 0;  // a step's Launch() entry to its Collect() return
    double prep_ms = 0;          // Launch() from entry to its first CUDA call (host metadata)
    double enqueue_ms = 0;       // Launch() from entry until every launch is queued
    double gpu_ms = 0;           // metadata upload to the last kernel
    // From one Collect()'s return to the next Launch()'s entry (the engine's host time between
    // steps); 0 for a step launched before the previous one was collected (pipelined).
    double between_ms = 0;
  };
  void set_profiling(bool on);
  StepProfile profile() const;

  // Decode steps replayed from graphs, and graphs captured, so far.
  int64_t graph_launches() const;
  int64_t graph_captures() const;
  // QKV products enqueued with RoPE and the K/V append in their epilogue (fused_qkv_rope), one
  // per layer, in eager steps and graph captures (replays enqueue nothing). For tests.
  int64_t fused_qkv_rope_launches() const;
  // Steps enqueued with the o and down products adding into the residual
  // (residual_in_products). For tests.
  int64_t residual_in_product_steps() const;
  // Bytes of the packed copy of the layer matrices (wgmma_packed_weights; 0 without it).
  int64_t packed_weight_bytes() const;
  // Steps launched with previous_step_rows (pipelined decode), so far. For tests.
  int64_t chained_launches() const;

 private:
  struct State;  // device buffers, workspaces, stream (CUDA types kept out of this header)
  CudaModelRunner() = default;
  absl::Status WarmUpGemms();

  std::unique_ptr<CudaModelWeights> weights_;
  int device_ = 0;
  bool use_graphs_ = true;
  bool fused_norms_ = true;
  bool residual_in_products_ = true;
  int wgmma_max_rows_ = 0;
  bool fused_qkv_rope_ = false;
  bool early_kv_loads_ = false;
  PrefillKernel prefill_kernel_ = PrefillKernel::kMmaSync;
  int prefill_variant_ = 0;
  absl::Status PackWeights();
  CudaRunnerOptions::WgmmaCuts wgmma_cuts_;
  int64_t num_kv_blocks_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_CUDA_MODEL_RUNNER_H_
