// Paged prefill attention benchmark (docs/benchmarks.md, "Prefill attention (H200)").
//
// Shapes (GQA 32/8, head_dim 128, bf16, block size 16):
//   q64 / q512 / q4096  that many new query tokens (causal among themselves) after 20,480 cached
//                       tokens in 5 documents of 4,096, each at its own non-zero delta, physical
//                       blocks shuffled across the pool
//   encode4096          a 4,096-token document encoded alone (one segment, delta 0, causal)
// Each in three variants on the mma.sync kernel: rotate-q (the kept one), rotate-k, none (no
// rotation: the price of it); and in the two the wgmma kernel covers (none, rotate-q): every
// compiled variant of the warp-specialized wgmma kernel (PrefillKernel::kWgmmaWs, rows
// "wgmma-ws/<variant>": pp = ping-pong between the consumer warpgroups, nopp = none, sN = N K/V
// stages), side by side, each kernel on the plan built for it (PrefillCtasPerSm: KV split to fill
// 2 CTAs an SM for mma.sync, 1 for wgmma-ws; the split counts go to stderr and the JSON). "vs
// none" compares a variant with the same kernel's (and kernel variant's) none, "vs mma.sync" a
// row's TFLOP/s with the mma.sync row of the same rotation variant.
// TFLOP/s = 4 * head_dim * heads * (visible query-key pairs) / time (causal pairs only counted),
// time = median of --reps single launches timed with CUDA events after --warmup launches; each
// variant is timed twice, interleaved, to show the run-to-run spread.
// Prints a markdown table and one JSON object per line (prefixed "JSON ", with "kernel" and
// "variant" naming the row); on stderr, per shape, the largest differences between variants that
// compute the same function (rotate-q against rotate-k, wgmma-ws against mma.sync).
//
//   lazyattn-bench-prefill [--only=q4096] [--variant=rotate-q] [--kernel=wgmma-ws] [--reps=50]
//                          [--warmup=5] [--wgmma-ctas-per-sm=N]
// --kernel takes mma.sync, wgmma-ws (every variant) or one variant (wgmma-ws/pp-s5).
// --wgmma-ctas-per-sm builds the wgmma-ws plan for N CTAs an SM instead (2: the mma.sync plan).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device_info.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/include/rope.h"

namespace lazyattn {
namespace {

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)
#define CHECK_OK(expr)                                                            \
  do {                                                                            \
    absl::Status s_ = (expr);                                                     \
    if (!s_.ok()) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #expr, std::string(s_.message()).c_str()); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

constexpr int kHeads = 32, kKvHeads = 8, kDim = 128, kBlock = 16;
constexpr uint32_t kPromptOffset = 128;

__global__ void FillRandomBf16(__nv_bfloat16* x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    const float u = (h & 0xffffff) / 16777216.0f;  // [0, 1)
    x[i] = __float2bfloat16((u * 2.f - 1.f) * scale);
  }
}

__global__ void MaxAbsDiff(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n,
                           unsigned int* out_bits, unsigned int* nonfinite) {
  float m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (!isfinite(x) || !isfinite(y)) atomicAdd(nonfinite, 1u);
    m = fmaxf(m, fabsf(x - y));
  }
  atomicMax(out_bits, __float_as_uint(m));
}

struct Shape {
  std::string name;
  int num_queries;
  int num_docs;  // documents of 4,096 tokens before the queries; 0 = document encoding
};

const char* VariantName(PrefillRotation r) {
  switch (r) {
    case PrefillRotation::kRotateQ:
      return "rotate-q";
    case PrefillRotation::kRotateK:
      return "rotate-k";
    case PrefillRotation::kNone:
      return "none";
  }
  return "?";
}

const char* KernelName(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::kMmaSync:
      return "mma.sync";
    case PrefillKernel::kWgmmaWs:
      return "wgmma-ws";
  }
  return "?";
}

struct Variant {
  PrefillKernel kernel;
  PrefillRotation rotation;
  int kernel_variant = 0;  // PagedPrefillArgs::variant (kWgmmaWs)
};

// "wgmma-ws/pp-s5" for a kWgmmaWs row, the kernel's name otherwise.
std::string RowKernelName(const Variant& v) {
  std::string name = KernelName(v.kernel);
  if (v.kernel == PrefillKernel::kWgmmaWs) {
    name += std::string("/") + PrefillWgmmaWsVariantName(v.kernel_variant);
  }
  return name;
}

std::string Arg(int argc, char** argv, const char* key, const char* def) {
  const std::string prefix = std::string("--") + key + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return def;
}

int Main(int argc, char** argv) {
  const std::string only = Arg(argc, argv, "only", "");
  const std::string only_variant = Arg(argc, argv, "variant", "");
  const std::string only_kernel = Arg(argc, argv, "kernel", "");
  const int reps = std::atoi(Arg(argc, argv, "reps", "50").c_str());
  const int warmup = std::atoi(Arg(argc, argv, "warmup", "5").c_str());
  const int wgmma_ctas_per_sm = std::atoi(Arg(argc, argv, "wgmma-ctas-per-sm", "0").c_str());
  auto info = QueryDevice(0);
  if (!info.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", std::string(info.status().message()).c_str());
    return 1;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device: %s, %d SMs, L2 %lld MB, driver %d, runtime %d\n", info->name.c_str(),
              info->sm_count, static_cast<long long>(info->l2_bytes >> 20), driver, runtime);

  // RoPE table on the device (Llama-3 theta; 64K positions cover every delta used here).
  const int64_t positions = 65536;
  RopeParams rope_params;
  rope_params.head_dim = kDim;
  rope_params.theta = 500000;
  RopeTable rope(rope_params, positions);
  float *d_cos = nullptr, *d_sin = nullptr;
  CHECK_CUDA(cudaMalloc(&d_cos, rope.cos_data().size() * 4));
  CHECK_CUDA(cudaMalloc(&d_sin, rope.sin_data().size() * 4));
  CHECK_CUDA(cudaMemcpy(d_cos, rope.cos_data().data(), rope.cos_data().size() * 4,
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_sin, rope.sin_data().data(), rope.sin_data().size() * 4,
                        cudaMemcpyHostToDevice));

  // One pool large enough for the largest shape, random bf16 (never zeros).
  const int kDocLen = 4096, kMaxQ = 4096, kMaxDocs = 5;
  const int pool_blocks = (kMaxDocs * kDocLen + kMaxQ) / kBlock;
  const int64_t block_elems = int64_t{kKvHeads} * kBlock * kDim;
  __nv_bfloat16 *d_k, *d_v, *d_q, *d_out, *d_out_ref;
  CHECK_CUDA(cudaMalloc(&d_k, pool_blocks * block_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_v, pool_blocks * block_elems * 2));
  CHECK_CUDA(cudaMalloc(&d_q, int64_t{kMaxQ} * kHeads * kDim * 2));
  CHECK_CUDA(cudaMalloc(&d_out, int64_t{kMaxQ} * kHeads * kDim * 2));
  CHECK_CUDA(cudaMalloc(&d_out_ref, int64_t{kMaxQ} * kHeads * kDim * 2));
  FillRandomBf16<<<1024, 256>>>(d_k, pool_blocks * block_elems, 1u, 2.0f);
  FillRandomBf16<<<1024, 256>>>(d_v, pool_blocks * block_elems, 2u, 1.0f);
  FillRandomBf16<<<1024, 256>>>(d_q, int64_t{kMaxQ} * kHeads * kDim, 3u, 2.0f);
  CHECK_CUDA(cudaGetLastError());
  unsigned int* d_diff;
  CHECK_CUDA(cudaMalloc(&d_diff, 8));
  // One plan per kernel (PagedPrefillPlanOptions::ctas_per_sm: the wgmma-ws kernel holds one CTA
  // an SM, so its plan splits KV half as much), each with its own metadata and workspace.
  struct KernelPlan {
    PagedPrefillPlan plan;
    void* d_meta = nullptr;
    void* d_ws = nullptr;
    int64_t meta_cap = 0, ws_cap = 0;
  };
  KernelPlan plans[2];
  auto plan_for = [&](PrefillKernel k) -> KernelPlan& {
    return plans[k == PrefillKernel::kMmaSync ? 0 : 1];
  };

  std::mt19937 rng(12345);
  std::vector<uint32_t> physical(pool_blocks);
  std::iota(physical.begin(), physical.end(), 0u);
  std::shuffle(physical.begin(), physical.end(), rng);

  const std::vector<Shape> shapes = {
      {"q64", 64, 5}, {"q512", 512, 5}, {"q4096", 4096, 5}, {"encode4096", 4096, 0}};
  std::vector<Variant> variants = {{PrefillKernel::kMmaSync, PrefillRotation::kNone},
                                   {PrefillKernel::kMmaSync, PrefillRotation::kRotateK},
                                   {PrefillKernel::kMmaSync, PrefillRotation::kRotateQ}};
  for (int kv = 0; kv < PrefillWgmmaWsVariants(); ++kv) {
    variants.push_back({PrefillKernel::kWgmmaWs, PrefillRotation::kNone, kv});
    variants.push_back({PrefillKernel::kWgmmaWs, PrefillRotation::kRotateQ, kv});
  }
  auto selected = [&](const Variant& v) {
    return (only_variant.empty() || only_variant == VariantName(v.rotation)) &&
           (only_kernel.empty() || only_kernel == KernelName(v.kernel) ||
            only_kernel == RowKernelName(v));
  };
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  std::printf(
      "\n| shape | kernel | variant | queries | cached keys | visible pairs | ms (run 1 / run 2) | "
      "TFLOP/s | vs none | vs mma.sync |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> json;
  for (const Shape& sh : shapes) {
    if (!only.empty() && only != sh.name) continue;
    // Table: documents at deltas 128, 128 + 4096, ... (as after a 128-token system prompt, so
    // every segment needs a rotation), their physical blocks shuffled across the pool, then the
    // query's own blocks at delta 128 + 20,480. The document encoding is one segment at delta 0.
    std::vector<KvBlockEntry> table;
    int next = 0;
    std::vector<int> doc_order(sh.num_docs);
    std::iota(doc_order.begin(), doc_order.end(), 0);
    std::shuffle(doc_order.begin(), doc_order.end(), rng);
    for (int i = 0; i < sh.num_docs; ++i) {
      const uint32_t delta = kPromptOffset + static_cast<uint32_t>(i) * kDocLen;
      for (int b = 0; b < kDocLen / kBlock; ++b) {
        table.push_back(
            PackKvBlockEntry(physical[doc_order[i] * (kDocLen / kBlock) + b], delta, kBlock));
      }
      next += kDocLen / kBlock;
    }
    const int cached = sh.num_docs * kDocLen;
    const uint32_t own_delta = sh.num_docs > 0 ? kPromptOffset + cached : 0;
    for (int t = 0; t < sh.num_queries; t += kBlock) {
      table.push_back(
          PackKvBlockEntry(physical[next++], own_delta, std::min(kBlock, sh.num_queries - t)));
    }
    PagedPrefillSequence seq;
    seq.num_queries = sh.num_queries;
    seq.first_query_index = cached;
    seq.block_table = table.data();
    seq.num_blocks = static_cast<int>(table.size());
    PagedPrefillShape shape;
    shape.num_heads = kHeads;
    shape.num_kv_heads = kKvHeads;
    shape.head_dim = kDim;
    shape.num_pool_blocks = pool_blocks;
    for (PrefillKernel k : {PrefillKernel::kMmaSync, PrefillKernel::kWgmmaWs}) {
      KernelPlan& kp = plan_for(k);
      PagedPrefillPlanOptions options;
      options.sm_count = info->sm_count;
      options.rope_max_positions = positions;
      // Both wgmma-ws variants (none, rotate-q) run the wgmma kernel at head_dim 128.
      options.ctas_per_sm = k == PrefillKernel::kWgmmaWs && wgmma_ctas_per_sm > 0
                                ? wgmma_ctas_per_sm
                                : PrefillCtasPerSm(k, kDim, PrefillRotation::kRotateQ);
      CHECK_OK(kp.plan.Build(shape, &seq, 1, options));
      if (kp.plan.metadata_bytes() > kp.meta_cap) {
        if (kp.d_meta) CHECK_CUDA(cudaFree(kp.d_meta));
        kp.meta_cap = kp.plan.metadata_bytes();
        CHECK_CUDA(cudaMalloc(&kp.d_meta, kp.meta_cap));
      }
      if (kp.plan.workspace_bytes() > kp.ws_cap) {
        if (kp.d_ws) CHECK_CUDA(cudaFree(kp.d_ws));
        kp.ws_cap = kp.plan.workspace_bytes();
        CHECK_CUDA(cudaMalloc(&kp.d_ws, kp.ws_cap));
      }
      CHECK_OK(kp.plan.Upload(kp.d_meta, stream));
      std::fprintf(stderr, "%s: %s plan (%d CTAs/SM): %d work items, %d split groups\n",
                   sh.name.c_str(), KernelName(k), options.ctas_per_sm, kp.plan.num_work_items(),
                   kp.plan.num_split_groups());
    }
    double pairs = 0;
    for (int i = 0; i < sh.num_queries; ++i) pairs += cached + i + 1;
    const double flops = 4.0 * kDim * kHeads * pairs;

    PagedPrefillArgs args;
    args.q = d_q;
    args.k_pool = d_k;
    args.v_pool = d_v;
    args.rope_cos = d_cos;
    args.rope_sin = d_sin;
    args.scale = 1.0f / std::sqrt(float(kDim));
    args.out = d_out;
    auto run = [&](const Variant& v) {
      const KernelPlan& kp = plan_for(v.kernel);
      args.kernel = v.kernel;
      args.variant = v.kernel_variant;
      args.device_metadata = kp.d_meta;
      args.workspace = kp.d_ws;
      CHECK_OK(PagedPrefillAttention(kp.plan, args, v.rotation, stream));
    };
    std::vector<std::vector<float>> medians(variants.size());
    for (int round = 0; round < 2; ++round) {
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        if (!selected(variants[vi])) continue;
        for (int i = 0; i < warmup; ++i) run(variants[vi]);
        std::vector<float> ms(reps);
        for (int i = 0; i < reps; ++i) {
          CHECK_CUDA(cudaEventRecord(start, stream));
          run(variants[vi]);
          CHECK_CUDA(cudaEventRecord(stop, stream));
          CHECK_CUDA(cudaEventSynchronize(stop));
          CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
        }
        std::sort(ms.begin(), ms.end());
        medians[vi].push_back(ms.empty() ? 0.f : ms[ms.size() / 2]);
      }
    }
    // Sanity: variants that compute the same function on these inputs.
    auto max_diff = [&](const Variant& a, const Variant& b, const std::string& what) {
      args.out = d_out_ref;
      run(a);
      args.out = d_out;
      run(b);
      CHECK_CUDA(cudaMemsetAsync(d_diff, 0, 8, stream));
      MaxAbsDiff<<<264, 256, 0, stream>>>(d_out, d_out_ref, int64_t{sh.num_queries} * kHeads * kDim,
                                          d_diff, d_diff + 1);
      unsigned int h[2];
      CHECK_CUDA(cudaMemcpyAsync(h, d_diff, 8, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      float diff;
      std::memcpy(&diff, &h[0], 4);
      std::fprintf(stderr, "%s: max |%s| = %.3g, non-finite %u\n", sh.name.c_str(), what.c_str(),
                   diff, h[1]);
    };
    if (only_variant.empty() && only_kernel.empty()) {
      max_diff({PrefillKernel::kMmaSync, PrefillRotation::kRotateK},
               {PrefillKernel::kMmaSync, PrefillRotation::kRotateQ}, "rotate-q - rotate-k");
      for (int kv = 0; kv < PrefillWgmmaWsVariants(); ++kv) {
        for (PrefillRotation r : {PrefillRotation::kRotateQ, PrefillRotation::kNone}) {
          const Variant ws{PrefillKernel::kWgmmaWs, r, kv};
          max_diff({PrefillKernel::kMmaSync, r}, ws,
                   RowKernelName(ws) + " " + VariantName(r) + " - mma.sync " + VariantName(r));
        }
      }
    }
    auto best_ms = [&](PrefillKernel k, PrefillRotation r, int kv) -> double {
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        if (variants[vi].kernel == k && variants[vi].rotation == r &&
            variants[vi].kernel_variant == kv && !medians[vi].empty()) {
          return std::min(medians[vi][0], medians[vi][1]);
        }
      }
      return 0;
    };
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      if (medians[vi].empty()) continue;
      const Variant& v = variants[vi];
      const float best = std::min(medians[vi][0], medians[vi][1]);
      const double tflops = flops / (best * 1e-3) / 1e12;
      const double none_ms = best_ms(v.kernel, PrefillRotation::kNone, v.kernel_variant);
      char vs[32] = "-";
      if (none_ms > 0 && v.rotation != PrefillRotation::kNone) {
        std::snprintf(vs, sizeof(vs), "%+.1f%%", (best / none_ms - 1) * 100);
      }
      const double mma_ms = best_ms(PrefillKernel::kMmaSync, v.rotation, 0);
      char vs_mma[32] = "-";
      if (mma_ms > 0 && v.kernel != PrefillKernel::kMmaSync) {
        std::snprintf(vs_mma, sizeof(vs_mma), "x%.2f", mma_ms / best);
      }
      std::printf("| %s | %s | %s | %d | %d | %.4g | %.4f / %.4f | %.1f | %s | %s |\n",
                  sh.name.c_str(), RowKernelName(v).c_str(), VariantName(v.rotation),
                  sh.num_queries, cached, pairs, medians[vi][0], medians[vi][1], tflops, vs,
                  vs_mma);
      char line[640];
      std::snprintf(
          line, sizeof(line),
          "{\"bench\":\"prefill_attention\",\"shape\":\"%s\",\"kernel\":\"%s\","
          "\"kernel_variant\":\"%s\",\"variant\":\"%s\",\"queries\":%d,\"cached_keys\":%d,"
          "\"heads\":%d,"
          "\"kv_heads\":%d,\"head_dim\":%d,\"visible_pairs\":%.0f,\"ms\":%.5f,"
          "\"ms_run2\":%.5f,\"tflops\":%.2f,\"work_items\":%d,\"split_groups\":%d,"
          "\"device\":\"%s\"}",
          sh.name.c_str(), KernelName(v.kernel),
          v.kernel == PrefillKernel::kWgmmaWs ? PrefillWgmmaWsVariantName(v.kernel_variant) : "",
          VariantName(v.rotation), sh.num_queries, cached, kHeads, kKvHeads, kDim, pairs,
          medians[vi][0], medians[vi][1], tflops, plan_for(v.kernel).plan.num_work_items(),
          plan_for(v.kernel).plan.num_split_groups(), info->name.c_str());
      json.push_back(line);
    }
  }
  std::printf("\n");
  for (const std::string& l : json) std::printf("JSON %s\n", l.c_str());
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
