// Decode attention benchmark: TB/s of K+V read by PagedDecodeAttention on Llama-3-8B's head shape
// (32 query / 8 KV heads, d = 128, block 16), documents of 2K tokens at different deltas, physical
// blocks shuffled, with and without the deferred rotation. Prints a markdown table and one JSON
// line per row.
//
//   lazyattn-bench-decode [--batches 1,8,32,128] [--contexts 1024,4096,16384,32768]
//                         [--max-gb 40] [--runs 51] [--splits 0 (automatic)] [--delta-base 0]
//
// Bytes counted per launch: batch * context * kv_heads * head_dim * 2 bytes * 2 (K and V); q, the
// table and the output are noise next to that. Each launch is timed alone between CUDA events,
// queued behind a 200 us spin kernel so the host's launch latency is not counted (what
// triton.testing.do_bench does; an engine replays decode steps from CUDA graphs), and the median
// over many launches is reported. sdpa_decode_baseline.py times PyTorch the same way. Launches
// rotate over several copies of the inputs whose total exceeds 4x the L2, so no launch is served
// from L2: launch i (rotating and non-rotating interleaved, alternating which goes first) reads
// copy i % copies. (Until
// 2026-11-29 both variants of one round read the same copy, so at sizes that fit in the L2 the
// non-rotating launch re-read what the rotating one had just brought into it: that inflated the
// "rotation cost" at small sizes, e.g. +22 % at B=8 1K; see docs/kernels.md.)
//
// Three variants: the rotating kernel on the documents' deltas, the rotation-free kernel
// (`rotate = false`), and the rotating kernel on the same table with every delta 0, where its
// delta-0 fast path skips every rotation. The rotation's cost is printed against both: against
// the rotation-free kernel it includes what merely having the rotation compiled in costs
// (registers, code), against the delta-0 run it is the work of rotating alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device_info.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/include/rope.h"

namespace lazyattn {
namespace {

#define CHECK_CUDA(call)                                                             \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));        \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

#define CHECK_OK(expr)                                                               \
  do {                                                                               \
    absl::Status s_ = (expr);                                                        \
    if (!s_.ok()) {                                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, std::string(s_.ToString()).c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16, kDocTokens = 2048;

// Random bf16 in [-1, 1) from a hash of the index: never zeros, cheap to make 17 GB of.
__global__ void FillRandom(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn(float(h & 0xffff) / 32768.0f - 1.0f);
  }
}

std::vector<int> ParseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

// Keeps the stream busy while the host queues the timed launch behind it.
__global__ void Spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  std::vector<int> batches = {1, 8, 32, 128}, contexts = {1024, 4096, 16384, 32768};
  double max_gb = 40;
  int runs = 51;
  int splits = 0;  // PagedDecodeArgs::num_splits: 0 automatic
  // Added to every document's delta. 0: the first document sits at offset 0, where the kernel
  // skips its rotation (R_0 q = q); e.g. 64 puts every document behind a 64-token system prompt,
  // so every block needs a rotation.
  int delta_base = 0;
  const long long spin_cycles = 400000;  // ~200 us at 1.98 GHz
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--batches")) batches = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--contexts")) contexts = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-gb")) max_gb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--runs")) runs = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--splits")) splits = std::max(0, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--delta-base"))
      delta_base = std::max(0, std::atoi(argv[i + 1]));
  }
  auto info = QueryDevice(0);
  if (!info.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", std::string(info.status().ToString()).c_str());
    return 1;
  }
  std::printf("device: %s, %d SMs, L2 %lld MB; documents' deltas start at %d\n",
              info->name.c_str(), info->sm_count, static_cast<long long>(info->l2_bytes >> 20),
              delta_base);
  auto ws = PagedDecodeWorkspace::Create(0);
  CHECK_OK(ws.status());
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  RopeTable host_rope(RopeParams{.head_dim = kHeadDim, .theta = 500000},
                      max_ctx + kDocTokens + delta_base);
  auto rope = DeviceRopeTable::Create(host_rope);
  CHECK_OK(rope.status());

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
  std::mt19937 rng(1234);

  std::printf(
      "\n| B | context | splits | rotate (us) | rotate TB/s | no rotation (us) | "
      "no rotation TB/s | rotation cost | rotating kernel, every delta 0 (us) | "
      "rotation cost, same kernel |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> json;
  for (int batch : batches) {
    for (int ctx : contexts) {
      const double bytes = double(batch) * ctx * kKvHeads * kHeadDim * 2 * 2;
      if (bytes > max_gb * 1e9) continue;
      const int blocks = (ctx + kBlock - 1) / kBlock;
      const int sets = int(std::max<double>(1, std::ceil(4.0 * info->l2_bytes / bytes)));
      const int64_t pool_blocks = int64_t(sets) * batch * blocks;
      const size_t pool_elems = size_t(pool_blocks) * kKvHeads * kBlock * kHeadDim;
      __nv_bfloat16 *k = nullptr, *v = nullptr, *q = nullptr;
      float* out = nullptr;
      KvBlockEntry* tables = nullptr;
      KvBlockEntry* tables_delta0 = nullptr;  // the same blocks, every delta 0
      int32_t* nblocks = nullptr;
      CHECK_CUDA(cudaMalloc(&k, pool_elems * 2));
      CHECK_CUDA(cudaMalloc(&v, pool_elems * 2));
      CHECK_CUDA(cudaMalloc(&q, size_t(sets) * batch * kHeads * kHeadDim * 2));
      CHECK_CUDA(cudaMalloc(&out, size_t(batch) * kHeads * kHeadDim * 4));
      CHECK_CUDA(cudaMalloc(&tables, size_t(sets) * batch * blocks * sizeof(KvBlockEntry)));
      CHECK_CUDA(
          cudaMalloc(&tables_delta0, size_t(sets) * batch * blocks * sizeof(KvBlockEntry)));
      CHECK_CUDA(cudaMalloc(&nblocks, size_t(batch) * 4));
      FillRandom<<<4096, 256, 0, stream>>>(k, pool_elems, 1);
      FillRandom<<<4096, 256, 0, stream>>>(v, pool_elems, 2);
      FillRandom<<<256, 256, 0, stream>>>(q, size_t(sets) * batch * kHeads * kHeadDim, 3);
      // Shuffled physical blocks; each 2K-token document has its own delta (its offset).
      std::vector<uint32_t> phys(pool_blocks);
      std::iota(phys.begin(), phys.end(), 0u);
      std::shuffle(phys.begin(), phys.end(), rng);
      std::vector<KvBlockEntry> h_tables(size_t(sets) * batch * blocks);
      std::vector<KvBlockEntry> h_tables_delta0(h_tables.size());
      for (size_t i = 0; i < h_tables.size(); ++i) {
        const int token0 = int(i % blocks) * kBlock;
        const uint32_t delta = uint32_t(delta_base + token0 / kDocTokens * kDocTokens);
        const int valid = std::min(kBlock, ctx - token0);
        h_tables[i] = PackKvBlockEntry(phys[i], delta, valid);
        h_tables_delta0[i] = PackKvBlockEntry(phys[i], 0, valid);
      }
      CHECK_CUDA(cudaMemcpy(tables, h_tables.data(), h_tables.size() * sizeof(KvBlockEntry),
                            cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(tables_delta0, h_tables_delta0.data(),
                            h_tables_delta0.size() * sizeof(KvBlockEntry),
                            cudaMemcpyHostToDevice));
      std::vector<int32_t> h_nb(batch, blocks);
      CHECK_CUDA(cudaMemcpy(nblocks, h_nb.data(), batch * 4, cudaMemcpyHostToDevice));

      // Variants: 0 rotating, 1 rotation-free kernel, 2 rotating with every delta 0.
      auto args_for = [&](int set, int variant) {
        const bool rotate = variant != 1;
        PagedDecodeArgs a;
        a.q = q + size_t(set) * batch * kHeads * kHeadDim;
        a.k_pool = k;
        a.v_pool = v;
        a.block_tables = (variant == 2 ? tables_delta0 : tables) + size_t(set) * batch * blocks;
        a.num_blocks = nblocks;
        a.batch = batch;
        a.num_heads = kHeads;
        a.num_kv_heads = kKvHeads;
        a.head_dim = kHeadDim;
        a.max_blocks_per_seq = blocks;
        a.scale = 1.0f / std::sqrt(float(kHeadDim));
        a.rotate = rotate;
        a.rope = (*rope)->view();
        a.out = out;
        a.out_type = DecodeOutputType::kBf16;
        a.num_splits = splits;
        return a;
      };
      auto plan = PlanPagedDecode(args_for(0, 0), **ws);
      CHECK_OK(plan.status());
      constexpr int kVariants = 3;
      for (int i = 0; i < kVariants; ++i) {  // warm-up
        for (int variant = 0; variant < kVariants; ++variant) {
          CHECK_OK(PagedDecodeAttention(args_for((kVariants * i + variant) % sets, variant), **ws,
                                        stream));
        }
      }
      // The variants interleaved, so clock and thermal drift hit them alike, and which one goes
      // first rotates between rounds, so an order effect cancels.
      std::vector<float> times[kVariants];
      for (int r = 0; r < runs; ++r) {
        for (int k = 0; k < kVariants; ++k) {
          const int variant = (r + k) % kVariants;
          // Each launch reads the next copy: never the data the previous launch left in L2.
          const PagedDecodeArgs a = args_for((kVariants * r + k) % sets, variant);
          Spin<<<1, 1, 0, stream>>>(spin_cycles);
          CHECK_CUDA(cudaEventRecord(ev0, stream));
          CHECK_OK(PagedDecodeAttention(a, **ws, stream));
          CHECK_CUDA(cudaEventRecord(ev1, stream));
          CHECK_CUDA(cudaEventSynchronize(ev1));
          float ms = 0;
          CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
          times[variant].push_back(ms);
        }
      }
      CHECK_CUDA(cudaGetLastError());
      const double rot = Median(times[0]), plain = Median(times[1]), zero = Median(times[2]);
      const double tb = bytes / 1e12;
      std::printf("| %d | %dK | %d | %.1f | %.2f | %.1f | %.2f | %+.1f%% | %.1f | %+.1f%% |\n",
                  batch, ctx / 1024, plan->num_splits, rot * 1e3, tb / (rot * 1e-3), plain * 1e3,
                  tb / (plain * 1e-3), (rot / plain - 1) * 100, zero * 1e3,
                  (rot / zero - 1) * 100);
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"decode_attention\",\"gpu\":\"%s\",\"batch\":%d,\"context\":%d,"
                    "\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"doc_tokens\":%d,"
                    "\"delta_base\":%d,"
                    "\"splits\":%d,\"runs\":%d,\"rotate_us\":%.2f,\"no_rotation_us\":%.2f,"
                    "\"rotate_tbps\":%.3f,\"no_rotation_tbps\":%.3f,\"rotate_delta0_us\":%.2f}",
                    info->name.c_str(), batch, ctx, kHeads, kKvHeads, kHeadDim, kDocTokens,
                    delta_base, plan->num_splits, runs, rot * 1e3, plain * 1e3, tb / (rot * 1e-3),
                    tb / (plain * 1e-3), zero * 1e3);
      json.push_back(line);
      std::fflush(stdout);
      CHECK_CUDA(cudaFree(k));
      CHECK_CUDA(cudaFree(v));
      CHECK_CUDA(cudaFree(q));
      CHECK_CUDA(cudaFree(out));
      CHECK_CUDA(cudaFree(tables));
      CHECK_CUDA(cudaFree(tables_delta0));
      CHECK_CUDA(cudaFree(nblocks));
    }
  }
  std::printf("\n");
  for (const std::string& j : json) std::printf("%s\n", j.c_str());
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
