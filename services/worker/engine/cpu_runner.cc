#include "services/worker/engine/cpu_runner.h"

#include <cmath>

#include "kernels/include/block_copy.h"
#include "kernels/include/embedding.h"
#include "kernels/include/gemm.h"
#include "kernels/include/paged_attention.h"
#include "kernels/include/quant_linear.h"
#include "kernels/include/rms_norm.h"
#include "kernels/include/swiglu.h"

namespace lazyattn {
namespace {

// y = x W^T (+ y) from whichever form the weights were loaded in: packed matrices (the stored
// types, quant_linear.h) run part by part into their columns of y; fp32 ones take OpenBLAS.
void Linear(const float* x, int64_t rows, const std::vector<float>& w32, const PackedMatrix& packed,
            int64_t in, int64_t out, float* y, bool accumulate = false) {
  if (packed.empty()) {
    LinearCpu(x, w32.data(), rows, in, out, y, accumulate);
    return;
  }
  int64_t first = 0;
  for (size_t i = 0; i < packed.parts.size(); ++i) {
    QuantLinearCpu(x, rows, packed.view(i), y + first, out, accumulate);
    first += packed.parts[i].rows;
  }
}

}  // namespace

CpuRunner::CpuRunner(const ModelWeights* weights)
    : weights_(weights), rope_(weights->config.rope, weights->config.max_positions) {}

absl::Status CpuRunner::Validate(std::span<const ForwardChunk> chunks, const KvCacheCpu& kv) const {
  return ValidateForwardChunks(chunks, config(), kv.num_blocks(), kv.shape().block_size);
}

absl::StatusOr<std::vector<float>> CpuRunner::Forward(std::span<const ForwardChunk> chunks,
                                                      KvCacheCpu& kv) {
  if (absl::Status s = Validate(chunks, kv); !s.ok()) return s;
  const ModelConfig& c = config();
  const ModelWeights& w = *weights_;
  const int64_t H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  const int64_t qkv_width = Q + 2 * KV;

  int64_t rows = 0;
  for (const auto& ch : chunks) rows += static_cast<int64_t>(ch.tokens.size());
  std::vector<float> x(rows * H), h(rows * H), qkv(rows * qkv_width), attn(rows * Q),
      gate_up(rows * 2 * I), act(rows * I), k_local(KV), q_pos_rotated;

  int64_t row = 0;
  for (const auto& ch : chunks) {
    if (w.packed()) {
      for (size_t t = 0; t < ch.tokens.size(); ++t) {
        w.token_embedding_packed.RowValues(ch.tokens[t], &x[(row + t) * H]);
      }
    } else {
      EmbeddingGatherCpu(w.token_embedding.data(), H, ch.tokens.data(),
                         static_cast<int>(ch.tokens.size()), &x[row * H]);
    }
    row += static_cast<int64_t>(ch.tokens.size());
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    RmsNormCpu(x.data(), L.attn_norm.data(), static_cast<int>(rows), static_cast<int>(H),
               c.rms_norm_eps, h.data());
    Linear(h.data(), rows, L.wqkv, L.wqkv_packed, H, qkv_width, qkv.data());
    row = 0;
    for (const auto& ch : chunks) {
      const int n = static_cast<int>(ch.tokens.size());
      std::vector<float> q(int64_t{n} * Q), k(int64_t{n} * KV), v(int64_t{n} * KV);
      for (int t = 0; t < n; ++t) {
        const float* src = &qkv[(row + t) * qkv_width];
        std::copy(src, src + Q, &q[t * Q]);
        std::copy(src + Q, src + Q + KV, &k[t * KV]);
        std::copy(src + Q + KV, src + Q + 2 * KV, &v[t * KV]);
        const int64_t local = ch.local_start + t;
        for (int hd = 0; hd < c.num_heads; ++hd) {
          RopeRotateHeadCpu(&q[t * Q + int64_t{hd} * c.head_dim], ch.segment_delta + local, rope_);
        }
        for (int hd = 0; hd < c.num_kv_heads; ++hd) {
          RopeRotateHeadCpu(&k[t * KV + int64_t{hd} * c.head_dim], ch.k_rotation_base + local,
                            rope_);
        }
      }
      if (kv.dtype() == KvCacheDtype::kF16) {
        PagedKvWriteCpu(k.data(), v.data(), n, ch.kv_slots.data(), kv.shape(), kv.k_f16(l),
                        kv.v_f16(l));
      } else {
        PagedKvWriteCpu(k.data(), v.data(), n, ch.kv_slots.data(), kv.shape(), kv.k(l), kv.v(l));
      }
      const PagedAttentionArgs args{.q = q.data(),
                                    .num_queries = n,
                                    .num_heads = c.num_heads,
                                    .first_query_index = ch.first_query_index,
                                    .block_table = ch.block_table.data(),
                                    .num_blocks = static_cast<int>(ch.block_table.size()),
                                    .k_pool = kv.k(l),
                                    .v_pool = kv.v(l),
                                    .shape = kv.shape(),
                                    .scale = scale,
                                    .rope = &rope_,
                                    .out = &attn[row * Q],
                                    .k_pool_f16 = kv.k_f16(l),
                                    .v_pool_f16 = kv.v_f16(l)};
      // One query that sees the whole table (a decode step) reads the pool in place
      // (PagedDecodeAttentionCpu, heads over the kernel threads); the prefill form would first
      // copy every key and value of the table, as many bytes again as the attention reads.
      int64_t table_keys = 0;
      for (const KvBlockEntry e : ch.block_table) table_keys += KvEntryValid(e);
      if (n == 1 && ch.first_query_index + 1 == table_keys) {
        PagedDecodeAttentionCpu(args);
      } else {
        PagedAttentionCpu(args);
      }
      row += n;
    }
    Linear(attn.data(), rows, L.wo, L.wo_packed, Q, H, x.data(), /*accumulate=*/true);
    RmsNormCpu(x.data(), L.ffn_norm.data(), static_cast<int>(rows), static_cast<int>(H),
               c.rms_norm_eps, h.data());
    Linear(h.data(), rows, L.w_gate_up, L.w_gate_up_packed, H, 2 * I, gate_up.data());
    SwiGluCpu(gate_up.data(), rows, I, act.data());
    Linear(act.data(), rows, L.w_down, L.w_down_packed, I, H, x.data(), /*accumulate=*/true);
  }

  // LM head only for the rows that need logits.
  std::vector<float> last;
  row = 0;
  for (const auto& ch : chunks) {
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    const int64_t first = ch.logits_for_all_tokens ? row : row + n - 1;
    if (ch.emit_logits) last.insert(last.end(), &x[first * H], &x[(row + n) * H]);
    row += n;
  }
  if (last.empty()) return std::vector<float>{};
  const int64_t out_rows = static_cast<int64_t>(last.size()) / H;
  RmsNormCpu(last.data(), w.output_norm.data(), static_cast<int>(out_rows), static_cast<int>(H),
             c.rms_norm_eps, last.data());
  std::vector<float> logits(out_rows * c.vocab_size);
  if (w.packed()) {
    Linear(last.data(), out_rows, {}, w.lm_head_packed_or_tied(), H, c.vocab_size, logits.data());
  } else {
    LinearCpu(last.data(), w.lm_head_data(), out_rows, H, c.vocab_size, logits.data());
  }
  return logits;
}

CpuModelRunner::CpuModelRunner(const ModelWeights* weights, int64_t num_kv_blocks,
                               std::optional<KvCacheDtype> kv_dtype)
    : runner_(weights), kv_(weights->config, num_kv_blocks, kDefaultKvBlockSize, kv_dtype) {}

CpuModelRunner::CpuModelRunner(std::unique_ptr<ModelWeights> weights, int64_t num_kv_blocks,
                               std::optional<KvCacheDtype> kv_dtype)
    : owned_weights_(std::move(weights)),
      runner_(owned_weights_.get()),
      kv_(owned_weights_->config, num_kv_blocks, kDefaultKvBlockSize, kv_dtype) {}

absl::Status CpuModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    if (c.src >= kv_.num_blocks() || c.dst >= kv_.num_blocks() || c.src == c.dst) {
      return absl::InvalidArgumentError("block copy names a block out of range or onto itself");
    }
  }
  for (int l = 0; l < config().num_layers; ++l) {  // the CPU pools are one array per layer
    if (kv_.dtype() == KvCacheDtype::kF16) {
      BlockCopyRerotateCpu(copies.data(), static_cast<int>(copies.size()), /*num_layers=*/1,
                           /*layer_stride=*/0, kv_.shape(), runner_.rope(), kv_.k_f16(l),
                           kv_.v_f16(l));
    } else {
      BlockCopyRerotateCpu(copies.data(), static_cast<int>(copies.size()), /*num_layers=*/1,
                           /*layer_stride=*/0, kv_.shape(), runner_.rope(), kv_.k(l), kv_.v(l));
    }
  }
  return absl::OkStatus();
}

}  // namespace lazyattn
