// The layers of one step, enqueued on the runner's stream: the embedding gather, then per layer
// RMSNorm -> QKV product -> RoPE + K/V append -> decode and prefill attention -> O product ->
// RMSNorm -> gate|up product with SwiGLU -> down product, then the final norm, the LM head over
// the rows that sample and the greedy argmax or SampleRowsCuda. Everything from the embedding to
// the greedy ids: the part a CUDA graph replays (cuda_decode_graphs.cc).
#include <cmath>

#include "common/status_macros.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_linear.h"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "kernels/cuda/swiglu.h"
#include "services/worker/cuda/cuda_runner_state.h"
#include "services/worker/cuda/decode_table_row.h"

namespace lazyattn {

absl::Status CudaModelRunner::State::EnqueueLayers(const CudaModelRunner& runner,
                                                   const cuda_runner_internal::StepShape& step) {
  State& s = *this;  // read as `s`, like the runner's other step code
  const ModelConfig& c = runner.config();
  const std::unique_ptr<CudaModelWeights>& weights = runner.weights_;
  const CudaRunnerOptions::WgmmaCuts& wgmma_cuts = runner.wgmma_cuts_;
  const int64_t H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  const int64_t V = c.vocab_size, qkv_width = Q + 2 * KV;
  const int64_t rows = step.rows, out_rows = step.out_rows;
  const int num_decode = step.num_decode, num_prefill = step.num_prefill;
  const int max_decode_blocks = step.max_decode_blocks;
  const bool any_delta = step.any_delta, decode_only = step.decode_only;
  const bool argmax_only = step.argmax_only;
  const PagedPrefillPlan& plan = *step.plan;
  const std::span<const cuda_runner_internal::StepSection> sec = step.sections;
  cudaStream_t st = stream;
  const auto* d_tokens = s.metadata.as<int32_t>(sec[0].offset);
  const auto* d_local = s.metadata.as<int32_t>(sec[1].offset);
  const auto* d_deltas = s.metadata.as<int32_t>(sec[2].offset);
  const auto* d_slots = s.metadata.as<int64_t>(sec[3].offset);
  const auto* d_logit_rows = s.metadata.as<int32_t>(sec[4].offset);
  const auto* d_tables = s.decode_tables.as<KvBlockEntry>();
  const auto* d_num_blocks = s.metadata.as<int32_t>(sec[6].offset);
  const void* d_plan = s.metadata.as<void>(sec[7].offset);
  float* x = s.x.as<float>();  // the residual stream stays fp32
  bf16 *h = s.h.as<bf16>(), *qkv = s.qkv.as<bf16>(),
       *q_rot = s.q_rot.as<bf16>(), *attn = s.attn.as<bf16>(), *gu = s.gate_up.as<bf16>(),
       *act = s.act.as<bf16>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  CublasLtGemm& gemm = *s.gemm;
  // The layer products of this step: cuBLASLt (or the one-row kernel behind it), or the wgmma
  // few-row kernel where it is on and supports the product.
  const bool wgmma = rows >= 2 && rows <= runner.wgmma_max_rows_;
  auto linear = [&](const bf16* in_x, const bf16* w, const bf16* w_packed, int64_t in,
                    int64_t out, void* y, GemmOutputType type, bool accumulate,
                    SkinnyWgmmaConfig cut) -> absl::Status {
    if (wgmma && SkinnyWgmmaLinearSupports(rows, in, out, in_x, w, y)) {
      return SkinnyWgmmaLinearCuda(in_x, w, rows, in, out, y, type, accumulate,
                                   *s.wgmma_workspace, st, cut, w_packed);
    }
    return gemm.Linear(in_x, w, rows, in, out, y, type, accumulate, st);
  };
  auto linear_swiglu = [&](const bf16* in_x, const bf16* w,
                           const bf16* w_packed) -> absl::Status {
    if (wgmma && SkinnyWgmmaLinearSupports(rows, H, 2 * I, in_x, w, act)) {
      return SkinnyWgmmaLinearSwiGluCuda(in_x, w, rows, H, I, act, *s.wgmma_workspace, st,
                                         wgmma_cuts.gate_up, w_packed);
    }
    return gemm.LinearSwiGlu(in_x, w, rows, H, I, gu, act, st);
  };

  RETURN_IF_ERROR(EmbeddingGatherToF32Cuda(weights->token_embedding(), V, H, d_tokens,
                                           static_cast<int>(rows), x, st));
  float* delta = s.delta.as<float>();
  const int dim = static_cast<int>(H);
  const float eps = c.rms_norm_eps;
  // One row: the norms run inside the skinny kernels that read them, and the projections
  // that end a residual branch add into x directly (the same fp32 sums as through delta).
  const bool fused = rows == 1 && runner.fused_norms_ &&
                     SkinnyRmsNormLinearSupports(H, qkv_width, x, weights->layer(0).wqkv) &&
                     SkinnyRmsNormLinearSupports(H, 2 * I, x, weights->layer(0).w_gate_up);
  // Steps past the wgmma kernel's rows (products on cuBLASLt): the o and down projections add
  // into x (beta = 1, the same fp32 sum x + delta) and the norms after them only normalize.
  const bool add_in_products = !fused && !wgmma && rows > 1 && runner.residual_in_products_;
  if (add_in_products) ++s.residual_in_product_steps;
  float* const branch_out = add_in_products ? x : delta;
  // x += the branch that ended before this norm unless its product added it already.
  auto norm_after_branch = [&](const bf16* norm_weight) {
    return add_in_products ? RmsNormF32ToBf16Cuda(x, norm_weight, rows, dim, eps, h, st)
                           : AddRmsNormF32ToBf16Cuda(x, delta, norm_weight, rows, dim, eps, h, st);
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const CudaLayerWeights& L = weights->layer(l);
    const State::PackedLayer P = s.packed.empty() ? State::PackedLayer{} : s.packed[l];
    bf16* k_pool = s.k_pool.as<bf16>() + l * s.layer_stride;
    bf16* v_pool = s.v_pool.as<bf16>() + l * s.layer_stride;
    const RopeKvAppendArgs rope_kv{.q = qkv,
                                   .q_row_stride = qkv_width,
                                   .k = qkv + Q,
                                   .k_row_stride = qkv_width,
                                   .v = qkv + Q + KV,
                                   .v_row_stride = qkv_width,
                                   .num_tokens = static_cast<int>(rows),
                                   .num_heads = c.num_heads,
                                   .num_kv_heads = c.num_kv_heads,
                                   .head_dim = c.head_dim,
                                   .local_positions = d_local,
                                   .deltas = d_deltas,
                                   .slots = d_slots,
                                   .rope = s.rope->view(),
                                   .q_out = q_rot,
                                   .k_pool = k_pool,
                                   .v_pool = v_pool};
    // At 2-64 rows with head_dim 128, RoPE and the K/V append can run in the QKV product.
    const bool fused_rope = wgmma && runner.fused_qkv_rope_ &&
                            SkinnyWgmmaQkvRopeSupports(rows, H, rope_kv, h, L.wqkv);
    if (fused) {
      RETURN_IF_ERROR(SkinnyRmsNormLinearCuda(x, L.attn_norm, eps, L.wqkv, H, qkv_width, qkv,
                                              GemmOutputType::kBf16, /*accumulate=*/false, st));
    } else {
      // x += the previous layer's down projection (none before layer 0), then the norm.
      RETURN_IF_ERROR(l == 0 ? RmsNormF32ToBf16Cuda(x, L.attn_norm, rows, dim, eps, h, st)
                             : norm_after_branch(L.attn_norm));
      if (!fused_rope) {
        RETURN_IF_ERROR(
            linear(h, L.wqkv, P.wqkv, H, qkv_width, qkv, GemmOutputType::kBf16,
                   /*accumulate=*/false, wgmma_cuts.qkv));
      }
    }
    if (fused_rope) {
      RETURN_IF_ERROR(SkinnyWgmmaLinearQkvRopeCuda(h, L.wqkv, rows, H, rope_kv,
                                                   *s.wgmma_workspace, st,
                                                   {.splits = wgmma_cuts.qkv.splits},
                                                   P.wqkv));
      ++s.fused_qkv_rope_launches;
    } else {
      RETURN_IF_ERROR(RopeKvAppend(rope_kv, st));
    }
    if (num_decode > 0) {
      RETURN_IF_ERROR(PagedDecodeAttention({.q = q_rot,
                                            .k_pool = k_pool,
                                            .v_pool = v_pool,
                                            .block_tables = d_tables,
                                            .num_blocks = d_num_blocks,
                                            .batch = num_decode,
                                            .num_heads = c.num_heads,
                                            .num_kv_heads = c.num_kv_heads,
                                            .head_dim = c.head_dim,
                                            .max_blocks_per_seq = max_decode_blocks,
                                            .scale = scale,
                                            .rotate = any_delta,
                                            .rope = s.rope->view(),
                                            .out = attn,
                                            .out_type = DecodeOutputType::kBf16,
                                            // A decode token's K/V goes to its own last block.
                                            .early_kv_loads =
                                                decode_only && runner.early_kv_loads_},
                                           *s.decode_workspace, st));
    }
    if (num_prefill > 0) {
      RETURN_IF_ERROR(PagedPrefillAttention(
          plan,
          {.q = q_rot + int64_t{num_decode} * Q,
           .k_pool = k_pool,
           .v_pool = v_pool,
           .rope_cos = s.rope->view().cos,
           .rope_sin = s.rope->view().sin,
           .scale = scale,
           .out = attn + int64_t{num_decode} * Q,
           .device_metadata = d_plan,
           .workspace = s.prefill_workspace.as<void>(),
           .kernel = runner.prefill_kernel_,
           .variant = runner.prefill_variant_},
          any_delta ? PrefillRotation::kRotateQ : PrefillRotation::kNone, st));
    }
    if (fused) {
      RETURN_IF_ERROR(gemm.Linear(attn, L.wo, rows, Q, H, x, GemmOutputType::kFp32,
                                  /*accumulate=*/true, st));
      RETURN_IF_ERROR(
          SkinnyRmsNormLinearSwiGluCuda(x, L.ffn_norm, eps, L.w_gate_up, H, I, act, st));
      RETURN_IF_ERROR(gemm.Linear(act, L.w_down, rows, I, H, x, GemmOutputType::kFp32,
                                  /*accumulate=*/true, st));
      continue;
    }
    RETURN_IF_ERROR(linear(attn, L.wo, P.wo, Q, H, branch_out, GemmOutputType::kFp32,
                           add_in_products, wgmma_cuts.o));
    RETURN_IF_ERROR(norm_after_branch(L.ffn_norm));
    RETURN_IF_ERROR(linear_swiglu(h, L.w_gate_up, P.w_gate_up));
    RETURN_IF_ERROR(linear(act, L.w_down, P.w_down, I, H, branch_out, GemmOutputType::kFp32,
                           add_in_products, wgmma_cuts.down));
  }
  if (out_rows > 0) {
    // The last residual step and the final norm over every row (one launch, cheap next to
    // the step), then the rows that sample, gathered like embedding rows, into the LM head.
    bf16* last = s.last_hidden.as<bf16>();
    RETURN_IF_ERROR(fused ? RmsNormF32ToBf16Cuda(x, weights->output_norm(), rows, dim, eps, h, st)
                          : norm_after_branch(weights->output_norm()));
    // A lone row is its own logit row: no gather.
    if (rows == 1) {
      last = h;
    } else {
      RETURN_IF_ERROR(
          EmbeddingGatherCuda(h, rows, H, d_logit_rows, static_cast<int>(out_rows), last, st));
    }
    RETURN_IF_ERROR(gemm.Linear(last, weights->lm_head(), out_rows, H, V, s.logits.as<float>(),
                                GemmOutputType::kFp32, /*accumulate=*/false, st));
    if (argmax_only) {  // all greedy: the argmax spread over the whole card
      RETURN_IF_ERROR(GreedyArgmaxCuda(s.logits.as<float>(), V, static_cast<int>(out_rows),
                                       static_cast<int>(V), s.sampled.as<uint64_t>(), st));
    } else {
      RETURN_IF_ERROR(SampleRowsCuda(
          {.logits = s.logits.as<float>(),
           .row_stride = V,
           .rows = static_cast<int>(out_rows),
           .vocab = static_cast<int>(V),
           .params = s.metadata.as<SamplingRowParams>(sec[9].offset),
           .penalties = s.metadata.as<PenaltyEntry>(sec[10].offset),
           .input_tokens = d_tokens,
           .input_token_rows = d_logit_rows,
           .out_ids = s.ids.as<int32_t>(),
           .out_logprobs = s.logprobs.as<float>()},
          st));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
