// lazyattn-bench-engine's kernel-level parts: the decode step's GEMMs alone and the other
// decode-step kernels (tools/bench/cuda_engine_bench.h).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "kernels/cuda/swiglu.h"
#include "services/worker/cuda/weight_fill.h"
#include "tools/bench/cuda_engine_bench.h"

namespace lazyattn::engine_bench {

// --- The decode step's GEMMs alone: what the runner uses (the skinny kernel for 1-4 rows,
// cuBLASLt with the autotuned algorithm above), and cuBLASLt alone for the skinny rows. ---
// "Cold" rotates over copies of the weights that together exceed the 50 MB L2, as inside a step
// where each layer's weights are read once; "warm" repeats one copy (the o projection's 33.5 MB
// then sit in L2, which is how a timed-alone loop flatters it).
// `gemms`: the GEMM table; `kernels`: the other kernels' table (the sampler among them).
absl::Status RunGemms(const ModelConfig& c, bool with_wgmma, bool gemms, bool kernels, json& out) {
  if (gemms) std::cout << "\n### Decode-shaped GEMMs (" << c.name << " weights, bf16, fp32 accumulate)\n\n"
            << "| rows | product | warm us | cold us | cold weight TB/s | cuBLASLt cold us | "
               "wgmma swap-AB cold us (features/splits) | best wgmma cut cold us |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  struct Shape {
    const char* name;
    int64_t in, out;
    GemmOutputType type;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  // Output types as in the runner: the o and down projections add into the fp32 residual.
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  if (gemms) {
  const Shape shapes[] = {{"qkv", H, c.q_size() + 2 * c.kv_size(), GemmOutputType::kBf16},
                          {"o", c.q_size(), H, GemmOutputType::kFp32},
                          {"gate_up", H, 2 * I, GemmOutputType::kBf16},
                          {"down", I, H, GemmOutputType::kFp32},
                          {"lm_head", H, c.vocab_size, GemmOutputType::kFp32}};
  ASSIGN_OR_RETURN(auto tuned, CublasLtGemm::Create());
  ASSIGN_OR_RETURN(auto cublas_only, CublasLtGemm::Create());
  cublas_only->set_skinny(false);
  SkinnyWgmmaWorkspace wgmma_ws;
  if (with_wgmma) RETURN_IF_ERROR(wgmma_ws.Init());
  for (int64_t rows : {1, 8, 32, 64, 240}) {
    for (const Shape& sh : shapes) {
      const int64_t w_bytes = sh.in * sh.out * 2;
      const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t{256} << 20) / w_bytes + 1));
      __nv_bfloat16* x = nullptr;
      std::vector<__nv_bfloat16*> w(copies, nullptr);
      void* y = nullptr;
      RETURN_IF_CUDA_ERROR(cudaMalloc(reinterpret_cast<void**>(&x), rows * sh.in * 2));
      RETURN_IF_CUDA_ERROR(cudaMalloc(&y, rows * sh.out * 4));
      RETURN_IF_ERROR(FillNormalBf16(x, rows * sh.in, 1, 0, 0, 1, nullptr));
      for (int k = 0; k < copies; ++k) {
        RETURN_IF_CUDA_ERROR(cudaMalloc(reinterpret_cast<void**>(&w[k]), w_bytes));
        RETURN_IF_ERROR(FillNormalBf16(w[k], sh.in * sh.out, 1, 1 + k, 0, 0.02f, nullptr));
      }
      // Mean time of 24 calls after one untimed call (cuBLASLt autotunes there); `run(r)` is
      // the r-th call.
      auto mean_us = [&](const std::function<absl::Status(int)>& run) -> absl::StatusOr<double> {
        RETURN_IF_ERROR(run(0));
        constexpr int kReps = 24;
        cudaEventRecord(start);
        for (int r = 0; r < kReps; ++r) RETURN_IF_ERROR(run(r + 1));
        cudaEventRecord(stop);
        RETURN_IF_CUDA_ERROR(cudaEventSynchronize(stop));
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        return 1000.0 * ms / kReps;
      };
      auto time_us = [&](bool cold, CublasLtGemm* gemm) {
        return mean_us([&](int r) {
          return gemm->Linear(x, w[cold ? r % copies : 0], rows, sh.in, sh.out, y, sh.type, true,
                              nullptr);
        });
      };
      // The few-row wgmma kernel (kernels/cuda/skinny_wgmma_linear.h), same calls, same
      // weights, with its own choice of cut and with the best of every cut.
      double wgmma_cold = 0, best_cold = 0;
      std::string wgmma_cell = "-", best_cell = "-", best_cut;
      if (with_wgmma && SkinnyWgmmaLinearSupports(rows, sh.in, sh.out, x, w[0], y)) {
        auto wgmma_us = [&](SkinnyWgmmaConfig config) {
          return mean_us([&](int r) {
            return SkinnyWgmmaLinearCuda(x, w[r % copies], rows, sh.in, sh.out, y, sh.type, true,
                                         wgmma_ws, nullptr, config);
          });
        };
        auto cut = [&](SkinnyWgmmaConfig asked) {
          const SkinnyWgmmaConfig c = SkinnyWgmmaChosenConfig(rows, sh.in, sh.out, asked);
          return absl::StrCat(c.tile_features, "/", c.splits);
        };
        ASSIGN_OR_RETURN(wgmma_cold, wgmma_us({}));
        wgmma_cell = absl::StrCat(wgmma_cold, " (", cut({}), ")");
        // Every cut, to check the kernel's own choice against the best one.
        for (int features : {64, 128, 256}) {
          for (int splits : {1, 2, 3, 4, 6, 8}) {
            ASSIGN_OR_RETURN(const double us, wgmma_us({features, splits}));
            if (best_cold == 0 || us < best_cold) {
              best_cold = us;
              best_cut = cut({features, splits});
              best_cell = absl::StrCat(us, " (", best_cut, ")");
            }
          }
        }
      }
      ASSIGN_OR_RETURN(const double warm, time_us(false, tuned.get()));
      ASSIGN_OR_RETURN(const double cold, time_us(true, tuned.get()));
      double cublas_cold = cold;
      if (rows == 1) {
        ASSIGN_OR_RETURN(cublas_cold, time_us(true, cublas_only.get()));
      }
      const double tbs = w_bytes / (cold * 1e-6) / 1e12;
      std::cout << absl::StrCat("| ", rows, " | ", sh.name, " ", sh.in, "->", sh.out, " | ", warm,
                                " | ", cold, " | ", tbs, " | ", cublas_cold, " | ",
                                wgmma_cell, " | ", best_cell, " |\n");
      out["gemm"].push_back({{"rows", rows}, {"name", sh.name}, {"warm_us", warm},
                             {"cold_us", cold}, {"cold_weight_tbs", tbs},
                             {"cublaslt_cold_us", cublas_cold}, {"wgmma_cold_us", wgmma_cold},
                             {"wgmma_best_cold_us", best_cold}, {"wgmma_best_cut", best_cut}});
      cudaFree(x);
      for (auto* p : w) cudaFree(p);
      cudaFree(y);
    }
  }
  }
  if (!kernels) return absl::OkStatus();
  // The other launches of a decode step, one layer's worth each (plus the once-per-step ones).
  std::cout << "\n### Decode-step kernels besides the GEMMs (us per launch)\n\n"
            << "| rows | rms_norm (fp32 in) | rope_kv_append | decode attention (2K ctx) | swiglu | "
               "greedy argmax (vocab) | sampler, T 0.8 top-p 0.95 |\n|---|---|---|---|---|---|---|\n";
  for (int rows : {1, 32, 240}) {
    const int64_t Q = c.q_size(), KV = c.kv_size(), qkv_w = Q + 2 * KV;
    const int blocks_per_seq = 2048 / 16;
    DeviceRopeTable* rope_ptr = nullptr;
    ASSIGN_OR_RETURN(auto rope, DeviceRopeTable::Create(RopeTable(c.rope, 4096)));
    rope_ptr = rope.get();
    std::vector<void*> allocs;
    auto alloc = [&](int64_t bytes) -> void* {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
      cudaMemset(p, 0, bytes);
      allocs.push_back(p);
      return p;
    };
    auto* x = static_cast<__nv_bfloat16*>(alloc(rows * std::max(qkv_w, 2 * I) * 2));
    auto* y = static_cast<__nv_bfloat16*>(alloc(rows * std::max(qkv_w, 2 * I) * 2));
    auto* norm_w = static_cast<__nv_bfloat16*>(alloc(H * 2));
    const int64_t pool_blocks = int64_t{rows} * blocks_per_seq;
    auto* k_pool = static_cast<__nv_bfloat16*>(alloc(pool_blocks * KV * 16 * 2));
    auto* v_pool = static_cast<__nv_bfloat16*>(alloc(pool_blocks * KV * 16 * 2));
    std::vector<KvBlockEntry> tables(pool_blocks);
    for (int64_t b = 0; b < pool_blocks; ++b) tables[b] = PackKvBlockEntry(b, 0, 16);
    auto* d_tables = static_cast<KvBlockEntry*>(alloc(pool_blocks * 8));
    cudaMemcpy(d_tables, tables.data(), pool_blocks * 8, cudaMemcpyHostToDevice);
    std::vector<int32_t> nblocks(rows, blocks_per_seq), zeros(rows, 0);
    std::vector<int64_t> slots(rows);
    for (int r = 0; r < rows; ++r) slots[r] = int64_t{r} * blocks_per_seq * 16;
    auto* d_nblocks = static_cast<int32_t*>(alloc(rows * 4));
    auto* d_zeros = static_cast<int32_t*>(alloc(rows * 4));
    auto* d_slots = static_cast<int64_t*>(alloc(rows * 8));
    cudaMemcpy(d_nblocks, nblocks.data(), rows * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_slots, slots.data(), rows * 8, cudaMemcpyHostToDevice);
    auto* logits = static_cast<float*>(alloc(int64_t{rows} * c.vocab_size * 4));
    auto* params = static_cast<SamplingRowParams*>(alloc(rows * sizeof(SamplingRowParams)));
    auto* ids = static_cast<int32_t*>(alloc(rows * 4));
    ASSIGN_OR_RETURN(auto ws, PagedDecodeWorkspace::Create(0));
    auto time = [&](const std::function<absl::Status()>& f) -> absl::StatusOr<double> {
      RETURN_IF_ERROR(f());
      constexpr int kReps = 50;
      cudaEventRecord(start);
      for (int r = 0; r < kReps; ++r) RETURN_IF_ERROR(f());
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      return 1000.0 * ms / kReps;
    };
    auto* residual = static_cast<float*>(alloc(rows * H * 4));
    ASSIGN_OR_RETURN(const double norm_us, time([&] {
      return RmsNormF32ToBf16Cuda(residual, norm_w, rows, static_cast<int>(H), 1e-5f, y, nullptr);
    }));
    ASSIGN_OR_RETURN(const double rope_us, time([&] {
      return RopeKvAppend({.q = x, .q_row_stride = qkv_w, .k = x + Q, .k_row_stride = qkv_w,
                           .v = x + Q + KV, .v_row_stride = qkv_w, .num_tokens = rows,
                           .num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads,
                           .head_dim = c.head_dim, .local_positions = d_zeros,
                           .deltas = d_zeros, .slots = d_slots, .rope = rope_ptr->view(),
                           .q_out = y, .k_pool = k_pool, .v_pool = v_pool},
                          nullptr);
    }));
    ASSIGN_OR_RETURN(const double attn_us, time([&] {
      return PagedDecodeAttention({.q = x, .k_pool = k_pool, .v_pool = v_pool,
                                   .block_tables = d_tables, .num_blocks = d_nblocks,
                                   .batch = rows, .num_heads = c.num_heads,
                                   .num_kv_heads = c.num_kv_heads, .head_dim = c.head_dim,
                                   .max_blocks_per_seq = blocks_per_seq, .scale = 0.088f,
                                   .rotate = false, .rope = rope_ptr->view(), .out = y},
                                  *ws, nullptr);
    }));
    ASSIGN_OR_RETURN(const double swiglu_us,
                     time([&] { return SwiGluCuda(x, rows, I, y, nullptr); }));
    // Random logits (a softmax over a flat row is the sampler's slow case: top-p keeps most of
    // the vocabulary), T 0.8, top-p 0.95, a seed per row.
    {
      std::vector<float> host(int64_t{rows} * c.vocab_size);
      std::mt19937 rng(rows);
      std::normal_distribution<float> normal(0, 2);
      for (float& v : host) v = normal(rng);
      cudaMemcpy(logits, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      std::vector<SamplingRowParams> hp(rows);
      for (int r = 0; r < rows; ++r) {
        hp[r] = {.temperature = 0.8f, .top_p = 0.95f, .seed = uint64_t(r), .step = 3};
      }
      cudaMemcpy(params, hp.data(), rows * sizeof(SamplingRowParams), cudaMemcpyHostToDevice);
    }
    ASSIGN_OR_RETURN(const double sample_us, time([&] {
      return SampleRowsCuda({.logits = logits, .row_stride = c.vocab_size, .rows = rows,
                             .vocab = static_cast<int>(c.vocab_size), .params = params,
                             .out_ids = ids},
                            nullptr);
    }));
    auto* packed = static_cast<uint64_t*>(alloc(rows * 8));
    ASSIGN_OR_RETURN(const double argmax_us, time([&] {
      return GreedyArgmaxCuda(logits, c.vocab_size, rows, static_cast<int>(c.vocab_size), packed,
                              nullptr);
    }));
    std::cout << absl::StrCat("| ", rows, " | ", norm_us, " | ", rope_us, " | ", attn_us, " | ",
                              swiglu_us, " | ", argmax_us, " | ", sample_us, " |\n");
    out["kernels"].push_back({{"rows", rows}, {"rms_norm_us", norm_us},
                              {"rope_kv_append_us", rope_us}, {"decode_attention_2k_us", attn_us},
                              {"swiglu_us", swiglu_us}, {"greedy_argmax_us", argmax_us},
                              {"sampler_top_p_us", sample_us}});
    for (void* p : allocs) cudaFree(p);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return absl::OkStatus();
}

}  // namespace lazyattn::engine_bench
