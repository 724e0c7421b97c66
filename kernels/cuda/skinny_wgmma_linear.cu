// Few-row linear layers on Hopper tensor cores (skinny_wgmma_linear.h has the contract).
//
// CTA = one consumer warpgroup (warps 0-3) + one producer warp (warp 4); it owns 64 * kM output
// features (`tile`) and a range of K (`split`). Per stage the producer's lane 0 TMA-loads the
// (64 kM) x 64 weight tile and the rows x 64 tile of x into 128-byte-swizzled shared memory and
// arms the stage's "full" mbarrier with their byte count; the consumers wait on it, issue 4 kM
// wgmma m64nNk16 (K = 64), wait for them, and arrive on the stage's "empty" mbarrier, which the
// producer waits on before it refills the stage. The accumulator is y^T for the tile: kM blocks
// of 64 x N fp32, N/2 registers a thread each.
//
// Why kM > 1: every CTA reads the whole rows x K-range tile of x, so x's traffic from L2 is
// (number of tiles) x (size of x); at 64 rows and 64 features that equals the weights' own
// bytes. Measured on the H200 (2026-12-01, every cut of the llama3-8b products at 1-64 rows),
// 64-feature tiles were the best cut for 14 of 20 (product, rows) pairs, 128-feature tiles for
// down at 1-8 rows and gate_up at 8 and 64 rows, 256-feature tiles once (the 8-row LM head).
//
// Split K: each split stores its fp32 partial tile in the workspace, and the split that arrives
// last (a per-tile counter) adds all of them in split order and writes y. The order is fixed,
// so results are the same from run to run, and a bf16 y is rounded once.
#include "kernels/cuda/skinny_wgmma_linear.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/split_arrival.cuh"
#include "kernels/cuda/wgmma_primitives.cuh"

namespace lazyattn {
namespace {

constexpr int kTileM = 64;  // output features per wgmma: its M
constexpr int kTileK = 64;  // K per stage: one 128-byte swizzle row of bf16
constexpr int kMaxStages = 8;
// Shared memory for a CTA's pipeline stages, below the 227 KB a CTA may have. Deep pipelines
// measured best: a 72 KB budget (three 64-feature CTAs an SM at every row count, 4-6 stages at
// 32-64 rows) was 0-15 % slower on 64-feature tiles at 32-64 rows and 30-34 % slower on the
// unsplit 128-feature tiles (2026-12-01, docs/kernels.md).
constexpr int kSmemBudget = 200 * 1024;

// Stages of `stage_bytes` each a CTA gets: what the budget holds, 2 to kMaxStages.
constexpr int StagesFor(int stage_bytes) {
  const int n = kSmemBudget / stage_bytes;
  return n < 2 ? 2 : n > kMaxStages ? kMaxStages : n;
}
constexpr int kConsumers = 128;          // one warpgroup
constexpr int kThreads = kConsumers + 32;
constexpr int kMaxSplits = 8;
constexpr int64_t kPartialFloats = int64_t{8} << 20;  // 32 MB of split-K partial tiles

template <int kRows, int kM>
struct Layout {
  static constexpr int kFeatures = kTileM * kM;
  static constexpr int kABytes = kFeatures * kTileK * 2;  // weights
  static constexpr int kBBytes = kRows * kTileK * 2;      // x
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kStageBytes % 1024 == 0, "swizzled tiles must stay 1024-byte aligned");
  static constexpr int kStages = StagesFor(kStageBytes);
  static constexpr int kFull = kStages * kStageBytes;  // mbarriers: full[kStages], empty[kStages]
  static constexpr int kEmpty = kFull + kStages * 8;
  static constexpr int kBytes = kEmpty + kStages * 8 + 1024;  // + realignment of the base
  static constexpr int kAccumulators = kM * kRows / 2;        // fp32 registers a thread
};

struct Params {
  void* y;
  int rows, in, out, k_blocks, splits;
  // > 0: the SwiGLU form. W is [gate rows; up rows] with `swiglu_inter` rows each, a tile's two
  // 64-row halves are gate and up rows of the same 64 features, and y = silu(gate) * up, bf16
  // [rows][swiglu_inter] (`out` is then swiglu_inter).
  int swiglu_inter;
  // For the QKV form (head_dim 128, 128-feature tiles: tile t is head t of [q heads | k heads |
  // v heads]): the epilogue does RopeKvAppend's work on the tile and writes rope.q_out and the
  // pool slots; y is not written.
  RopeKvAppendArgs rope;
  bool y_fp32, accumulate;
  int* counters;    // one per tile, zero between calls
  float* partials;  // [splits][tiles][accumulators][kConsumers] when splits > 1
  // Non-null: the weights in PackWeightsForWgmma's layout, read as contiguous 8 KB blocks
  // (cp.async.bulk) instead of through map_w.
  const __nv_bfloat16* packed_w;
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// A wait that never completes (a wrong byte count or descriptor) traps after ~2^28 polls
// instead of hanging the process: the launch then fails with a CUDA error a test can report.
constexpr uint32_t kMaxPolls = 1u << 28;

__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    if (polls == kMaxPolls) __trap();
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// TMA: the box at (c0 = k, c1 = row) of `map` into shared memory at `dst`, completing on `bar`,
// with an L2 eviction policy (weights are read once: evict first; x is read by every tile:
// evict last).
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}

// A contiguous `bytes` from global `src` into shared memory at `dst`, completing on `bar`, with
// an L2 eviction policy (no tensor map: the bytes are copied as they lie).
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t EvictLastPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

template <int kN>
__device__ void Wgmma(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b);

template <>
__device__ __forceinline__ void Wgmma<8>(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3}, "
      "%4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void Wgmma<16>(float (&d)[8], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void Wgmma<32>(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void Wgmma<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23,"
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ float RoundToBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// The accumulator element i of thread (warp w, lane l): feature (wgmma row) and x row (column).
__device__ __forceinline__ int AccFeature(int w, int l, int i) {
  return 16 * w + l / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int AccRow(int l, int i) { return 8 * (i / 4) + 2 * (l % 4) + (i % 2); }

// kQkvRope: the QKV form's epilogue (Params::rope), its own instantiation so the other forms'
// code is what it was when measured.
template <int kRows, int kM, bool kQkvRope>
__global__ void __launch_bounds__(kThreads) SkinnyWgmmaKernel(
    const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
    const Params p) {
  using L = Layout<kRows, kM>;
  constexpr int kStages = L::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ int is_last_split;
  // Swizzled tiles need 1024-byte alignment; dynamic shared memory only promises 16.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const uint32_t base = SmemAddr(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x, tile = blockIdx.y;
  // First output feature of the tile (the SwiGLU form's tile holds 64 features' gate and up).
  const int n0 = tile * (p.swiglu_inter > 0 ? kTileM : L::kFeatures);
  // Splits differ by at most one K block (MaxSplits keeps them at >= 4 blocks on average).
  const int kb_begin = split * p.k_blocks / p.splits;
  const int kb_end = (split + 1) * p.k_blocks / p.splits;
  const int steps = kb_end - kb_begin;
  auto full = [&](int s) { return base + L::kFull + 8 * s; };
  auto empty = [&](int s) { return base + L::kEmpty + 8 * s; };
  auto a_tile = [&](int s) { return base + s * L::kStageBytes; };
  auto b_tile = [&](int s) { return base + s * L::kStageBytes + L::kABytes; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), kConsumers / 32);
    }
    // Make the initialized barriers visible to the TMA unit (the async proxy).
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers / 32) {  // producer
    if (lane == 0) {
      const uint64_t weights_policy = EvictFirstPolicy(), x_policy = EvictLastPolicy();
      // The SwiGLU form's map has 64-row boxes: gate rows at n0, up rows at inter + n0.
      auto load_weights = [&](int s, int i) {
        const int k = (kb_begin + i) * kTileK;
        if (p.packed_w != nullptr) {
          // Block (64-row group g, K block kb) lies at (g * k_blocks + kb) * 8 KB, already in
          // the 128-byte-swizzled order TMA would write: a plain copy per 64-row group.
          for (int m = 0; m < kM; ++m) {
            const int row = p.swiglu_inter > 0 ? (m == 0 ? n0 : p.swiglu_inter + n0)
                                                : n0 + m * kTileM;
            const int64_t block = int64_t{row / kTileM} * p.k_blocks + kb_begin + i;
            BulkLoad(a_tile(s) + m * kTileM * 128, p.packed_w + block * kTileM * kTileK,
                     kTileM * 128, full(s), weights_policy);
          }
        } else if (p.swiglu_inter > 0) {
          TmaLoad2d(a_tile(s), &map_w, k, n0, full(s), weights_policy);
          TmaLoad2d(a_tile(s) + kTileM * 128, &map_w, k, p.swiglu_inter + n0, full(s),
                    weights_policy);
        } else {
          TmaLoad2d(a_tile(s), &map_w, k, n0, full(s), weights_policy);
        }
      };
      // Weights first: they never depend on the previous kernel, so their stages are in flight
      // before the wait (launch_overlap.cuh).
      const int first = min(steps, kStages);
      for (int i = 0; i < first; ++i) {
        MbarArriveExpectTx(full(i), L::kStageBytes);
        load_weights(i, i);
      }
      WaitForPrerequisiteGrid();
      AllowDependentLaunch();
      for (int i = 0; i < first; ++i) {
        TmaLoad2d(b_tile(i), &map_x, (kb_begin + i) * kTileK, 0, full(i), x_policy);
      }
      for (int i = kStages; i < steps; ++i) {
        const int s = i % kStages;
        MbarWait(empty(s), ((i / kStages) - 1) & 1);
        MbarArriveExpectTx(full(s), L::kStageBytes);
        load_weights(s, i);
        TmaLoad2d(b_tile(s), &map_x, (kb_begin + i) * kTileK, 0, full(s), x_policy);
      }
    } else {
      WaitForPrerequisiteGrid();
      AllowDependentLaunch();
    }
    return;
  }

  // Consumers.
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  float d[kM][kRows / 2];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) d[m][i] = 0.f;
  }
  for (int i = 0; i < steps; ++i) {
    const int s = i % kStages;
    MbarWait(full(s), (i / kStages) & 1);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        // Feature block m starts 64 swizzled 128-byte rows (8 KB) into the weight tile.
        // Both operands K-major (WgmmaDescKMajor128): 128-byte rows, 8-row atoms 1 KB apart.
        Wgmma<kRows>(d[m], WgmmaDescKMajor128(a_tile(s) + m * kTileM * 128 + 32 * kk),
                     WgmmaDescKMajor128(b_tile(s) + 32 * kk));
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
    if (lane == 0) MbarArrive(empty(s));
  }

  // y's element (m, i) of this thread: its index, or -1 outside y.
  auto y_index = [&](int m, int i) -> int64_t {
    const int r = AccRow(lane, i), n = n0 + m * kTileM + AccFeature(warp, lane, i);
    return r < p.rows && n < p.out ? static_cast<int64_t>(r) * p.out + n : -1;
  };
  // An accumulated y (the residual, for o and down) is loaded into registers now, when they
  // allow (kEarlyY), every load before any add: its round trip then overlaps the split
  // handshake and the partials' loads. (Added beside its own load in the epilogue, as the wider
  // tiles still do, each element waits one memory latency in turn: the compiler keeps every add
  // next to its load.)
  const bool add_y = !kQkvRope && p.accumulate && p.swiglu_inter == 0;
  constexpr bool kEarlyY = L::kAccumulators <= 32;  // at most 32 more live registers
  float y_early[kEarlyY ? kM : 1][kEarlyY ? kRows / 2 : 1];
  if constexpr (kEarlyY) {
    if (add_y) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) {
          const int64_t at = y_index(m, i);
          y_early[m][i] =
              at < 0       ? 0.f
              : p.y_fp32 ? static_cast<const float*>(p.y)[at]
                         : __bfloat162float(static_cast<const __nv_bfloat16*>(p.y)[at]);
        }
      }
    }
  }

  if (p.splits > 1) {
    // Store this split's partial tile (coalesced: element j of every thread is contiguous).
    const int64_t tile_floats = int64_t{L::kAccumulators} * kConsumers;
    float* mine = p.partials + (int64_t{split} * gridDim.y + tile) * tile_floats;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        __stcg(mine + (m * (kRows / 2) + i) * kConsumers + threadIdx.x, d[m][i]);
      }
    }
    // Published by one release after the barrier, not a fence in every thread
    // (split_arrival.cuh).
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
    if (threadIdx.x == 0) is_last_split = ArriveAtSplitCounter(p.counters + tile, p.splits);
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
    if (!is_last_split) return;
    // Sum every split's partial in split order, all read back from the workspace (this split's
    // too, so the accumulators can hold the sum). kAtOnce splits' loads are in flight together
    // (all of o's and down's four where the registers allow), then added in order; a loop over
    // splits per element would pay one L2 latency a load.
    constexpr int kAtOnce = L::kAccumulators <= 16 ? 4 : L::kAccumulators <= 32 ? 2 : 1;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) d[m][i] = 0.f;
    }
    for (int s0 = 0; s0 < p.splits; s0 += kAtOnce) {
      float part[kAtOnce][kM][kRows / 2];
#pragma unroll
      for (int j = 0; j < kAtOnce; ++j) {
        const float* src = p.partials + (int64_t{s0 + j} * gridDim.y + tile) * tile_floats;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int i = 0; i < kRows / 2; ++i) {
            part[j][m][i] = s0 + j < p.splits
                                ? __ldcg(src + (m * (kRows / 2) + i) * kConsumers + threadIdx.x)
                                : 0.f;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kAtOnce; ++j) {
        if (s0 + j >= p.splits) break;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int i = 0; i < kRows / 2; ++i) d[m][i] += part[j][m][i];
        }
      }
    }
  }

  if constexpr (kQkvRope) {
    static_assert(kM == 2, "the QKV form's tile is one head of 128 features");
    // Thread element i holds dims f and f + 64 of head `tile` for row r: a rotation pair.
    // Each is rounded to bf16 first, the value the unfused path stores in its QKV output,
    // then rotated in fp32 with the table's cos/sin exactly as RopeKvAppend does.
    const RopeKvAppendArgs& a = p.rope;
    constexpr int kHeadDim = 2 * kTileM, kKvBlock = 16;
    const int64_t last = a.rope.max_positions - 1;
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const int r = AccRow(lane, i), f = AccFeature(warp, lane, i);
      if (r >= p.rows) continue;
      const float x1 = RoundToBf16(d[0][i]), x2 = RoundToBf16(d[1][i]);
      // Dims f and f + 64 of `dst`, rotated to `pos` (clamped to the table's last row).
      auto store_rotated = [&](__nv_bfloat16* dst, int64_t pos) {
        pos = min(pos, last);
        const float c = a.rope.cos[pos * kTileM + f], s = a.rope.sin[pos * kTileM + f];
        dst[f] = __float2bfloat16_rn(x1 * c - x2 * s);
        dst[f + kTileM] = __float2bfloat16_rn(x1 * s + x2 * c);
      };
      if (tile < a.num_heads) {  // q: rotated to its global position
        store_rotated(a.q_out + (int64_t{r} * a.num_heads + tile) * kHeadDim,
                      int64_t{a.local_positions[r]} + a.deltas[r]);
        continue;
      }
      const int64_t slot = a.slots[r];
      if (slot < 0) continue;  // padding: no K/V write
      const int kv = tile - a.num_heads;
      const int h = kv < a.num_kv_heads ? kv : kv - a.num_kv_heads;
      const int64_t at =
          ((slot / kKvBlock * a.num_kv_heads + h) * kKvBlock + slot % kKvBlock) * kHeadDim;
      if (kv < a.num_kv_heads) {  // k: rotated to its segment-local position
        store_rotated(a.k_pool + at, a.local_positions[r]);
      } else {  // v: as computed
        a.v_pool[at + f] = __float2bfloat16_rn(x1);
        a.v_pool[at + f + kTileM] = __float2bfloat16_rn(x2);
      }
    }
    return;
  }
  if (p.swiglu_inter > 0) {
    if constexpr (kM == 2) {
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        const int r = AccRow(lane, i), n = n0 + AccFeature(warp, lane, i);
        if (r >= p.rows || n >= p.out) continue;
        // Gate and up rounded to bf16 first, as SwiGluCuda reads them after a bf16 product:
        // the same rounding points as the cuBLASLt path. (Kept in fp32, one SmolLM2 golden
        // prompt's first-step cosine to the fp32 CPU model fell to 0.99892, against 0.99947
        // this way and 0.99985 on cuBLASLt: that model amplifies any change of rounding;
        // docs/kernels.md.)
        const float gate = RoundToBf16(d[0][i]), up = RoundToBf16(d[1][i]);
        static_cast<__nv_bfloat16*>(p.y)[static_cast<int64_t>(r) * p.out + n] =
            __float2bfloat16_rn(gate / (1.f + expf(-gate)) * up);
      }
    }
    return;
  }

  // Epilogue: y (+)= the tile. All loads of y first, then all stores: interleaved, every load
  // would wait for the store before it (the compiler cannot prove they differ), one memory
  // latency per element.
  if (add_y) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int i = 0; i < kRows / 2; ++i) {
        if constexpr (kEarlyY) {
          d[m][i] += y_early[m][i];  // zero outside y
        } else {
          const int64_t at = y_index(m, i);
          if (at < 0) continue;
          d[m][i] += p.y_fp32 ? static_cast<const float*>(p.y)[at]
                              : __bfloat162float(static_cast<const __nv_bfloat16*>(p.y)[at]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) {
      const int64_t at = y_index(m, i);
      if (at < 0) continue;
      if (p.y_fp32) {
        static_cast<float*>(p.y)[at] = d[m][i];
      } else {
        static_cast<__nv_bfloat16*>(p.y)[at] = __float2bfloat16_rn(d[m][i]);
      }
    }
  }
}

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D bf16 tensor map over a row-major [rows][cols] matrix, boxes of box_rows x 64 columns,
// 128-byte swizzle; reads past the matrix fill zeros.
absl::Status MakeMap(CUtensorMap* map, const void* ptr, int64_t rows, int64_t cols,
                     int box_rows) {
  auto encode = EncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is unavailable");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr),
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: ", int(r)));
  }
  return absl::OkStatus();
}

int SmCount() {
  static const int count = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n;
  }();
  return count;
}

// Opts the kernel instance into its shared memory (once) and reports how many of its CTAs an SM
// holds (0 when the attribute could not be set).
template <int kRows, int kM, bool kQkvRope = false>
int CtasPerSmOf() {
  static const int ctas = [] {
    using L = Layout<kRows, kM>;
    int n = 0;
    if (cudaFuncSetAttribute(SkinnyWgmmaKernel<kRows, kM, kQkvRope>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             L::kBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, SkinnyWgmmaKernel<kRows, kM, kQkvRope>,
                                                      kThreads,
                                                      L::kBytes) != cudaSuccess) {
      return 0;
    }
    return n;
  }();
  return ctas;
}

template <int kRows, int kM, bool kQkvRope = false>
absl::Status Launch(const CUtensorMap& map_w, const CUtensorMap& map_x, const Params& p,
                    cudaStream_t stream) {
  using L = Layout<kRows, kM>;
  if (CtasPerSmOf<kRows, kM, kQkvRope>() == 0) {
    return absl::InternalError("skinny wgmma linear: the kernel's shared memory does not fit");
  }
  // The SwiGLU form's tile is 64 features (their gate and up rows fill the 128-row A tile).
  const int tile_features = p.swiglu_inter > 0 ? kTileM : L::kFeatures;
  const dim3 grid(p.splits, (p.out + tile_features - 1) / tile_features);
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(SkinnyWgmmaKernel<kRows, kM, kQkvRope>, grid,
                                        dim3(kThreads), L::kBytes, stream, map_w, map_x, p));
  return absl::OkStatus();
}

template <int kRows>
absl::Status LaunchRows(int m, bool qkv_rope, const CUtensorMap& map_w, const CUtensorMap& map_x,
                        const Params& p, cudaStream_t stream) {
  if (qkv_rope) return Launch<kRows, 2, true>(map_w, map_x, p, stream);
  switch (m) {
    case 1:
      return Launch<kRows, 1>(map_w, map_x, p, stream);
    case 2:
      return Launch<kRows, 2>(map_w, map_x, p, stream);
    default:
      return Launch<kRows, 4>(map_w, map_x, p, stream);
  }
}

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// The K splits a tile width allows: at least 4 K blocks per split on average, and partial tiles
// that fit the workspace.
int MaxSplits(int m, int row_tile, int64_t in, int64_t out) {
  const int tiles = CeilDiv(out, kTileM * m);
  const int64_t tile_floats = int64_t{kTileM} * m * row_tile;
  const int64_t by_space = kPartialFloats / (tile_floats * tiles);
  return static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(CeilDiv(in, kTileK) / 4, by_space), 1, kMaxSplits));
}

template <int kRows>
int CtasPerSmRows(int m) {
  return m == 1   ? CtasPerSmOf<kRows, 1>()
         : m == 2 ? CtasPerSmOf<kRows, 2>()
                  : CtasPerSmOf<kRows, 4>();
}

// CTAs of one configuration an SM holds, from the device (at least 1 for the arithmetic).
int CtasPerSm(int m, int row_tile) {
  const int n = row_tile == 8    ? CtasPerSmRows<8>(m)
                : row_tile == 16 ? CtasPerSmRows<16>(m)
                : row_tile == 32 ? CtasPerSmRows<32>(m)
                                 : CtasPerSmRows<64>(m);
  return std::max(n, 1);
}

// Tile width and K splits for a product (the caller's where it gave them): 64-feature tiles
// with as many K splits as fill every CTA slot once, or, where the 64-feature tiles alone
// outnumber the slots (gate_up, the LM head), 128-feature tiles unsplit. Timing every cut of
// the llama3-8b products at 1-64 rows on the H200 put this choice within 0-6 % of the best cut
// (docs/kernels.md). Without a workspace (`can_split` false) the kernel's own choice never
// splits.
SkinnyWgmmaConfig Choose(int row_tile, int64_t in, int64_t out, SkinnyWgmmaConfig config,
                         bool can_split) {
  int features = config.tile_features;
  if (features == 0) {
    features = CeilDiv(out, kTileM) > SmCount() * CtasPerSm(1, row_tile) ? 2 * kTileM : kTileM;
  }
  const int m = features / kTileM;
  const int tiles = CeilDiv(out, features);
  const int max_splits = MaxSplits(m, row_tile, in, out);
  int splits = 1;
  if (config.splits > 0) {
    splits = std::min(config.splits, max_splits);
  } else if (can_split) {
    splits = std::clamp(SmCount() * CtasPerSm(m, row_tile) / tiles, 1, max_splits);
  }
  return {.tile_features = features, .splits = splits};
}

}  // namespace

SkinnyWgmmaWorkspace::~SkinnyWgmmaWorkspace() {
  if (counters_ != nullptr) cudaFree(counters_);
  if (partials_ != nullptr) cudaFree(partials_);
}

absl::Status SkinnyWgmmaWorkspace::Init() {
  if (partials_ == nullptr) {
    RETURN_IF_CUDA_ERROR(cudaMalloc(&partials_, kPartialFloats * sizeof(float)));
  }
  if (counters_ == nullptr) {
    int* counters = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&counters, kMaxTiles * sizeof(int)));
    // cudaMemset may return before the zeros land, and a kernel on a non-blocking stream need
    // not wait for it: synchronize, so the counters are zero before any call can use them.
    cudaError_t e = cudaMemset(counters, 0, kMaxTiles * sizeof(int));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      cudaFree(counters);
      RETURN_IF_CUDA_ERROR(e);
    }
    counters_ = counters;  // published only once zeroed: a retry starts over
  }
  return absl::OkStatus();
}

bool SkinnyWgmmaLinearSupports(int64_t rows, int64_t in, int64_t out, const void* x,
                               const void* w, const void* y) {
  static const bool hopper = [] {
    int device = 0, major = 0, minor = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
               cudaSuccess &&
           major == 9 && minor == 0;
  }();
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  // Sizes are checked as int64 before anything narrows them to int.
  return hopper && rows >= 1 && rows <= 64 && in >= kTileK && in % 8 == 0 &&
         in <= (int64_t{1} << 30) && out >= 1 &&
         out <= int64_t{SkinnyWgmmaWorkspace::kMaxTiles} * kTileM && aligned(x) && aligned(w) &&
         aligned(y);
}

namespace {

int RowTile(int64_t rows) { return rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64; }

// Both forms: `out` output features of y, or with swiglu_inter > 0 the SwiGLU form's inter
// features from 2 * inter weight rows (its tiles are always 128 weight rows).
absl::Status Run(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows, int64_t in,
                 int64_t out, void* y, GemmOutputType y_type, bool accumulate, int64_t swiglu_inter,
                 const RopeKvAppendArgs* rope, const SkinnyWgmmaWorkspace& workspace,
                 cudaStream_t stream, SkinnyWgmmaConfig config, const __nv_bfloat16* w_packed) {
  if (w_packed != nullptr && reinterpret_cast<uintptr_t>(w_packed) % 16 != 0) {
    return absl::InvalidArgumentError("skinny wgmma linear: packed weights must be 16-byte aligned");
  }
  if (w_packed != nullptr && swiglu_inter % kTileM != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: packed gate/up weights need inter a multiple of 64, not ",
        swiglu_inter));
  }
  if (config.tile_features != 0 && config.tile_features != 64 && config.tile_features != 128 &&
      config.tile_features != 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: tile_features must be 64, 128 or 256, not ", config.tile_features));
  }
  if (config.splits < 0 || config.splits > kMaxSplits) {
    return absl::InvalidArgumentError(absl::StrCat("skinny wgmma linear: splits must be 0 to ",
                                                   kMaxSplits, ", not ", config.splits));
  }
  const int row_tile = RowTile(rows);
  const bool can_split = workspace.counters() != nullptr && workspace.partials() != nullptr;
  const SkinnyWgmmaConfig chosen = Choose(row_tile, in, out, config, can_split);
  if (chosen.splits > 1 && !can_split) {
    return absl::FailedPreconditionError(
        "skinny wgmma linear: config.splits > 1 needs an initialized workspace");
  }
  const int m = chosen.tile_features / kTileM;
  CUtensorMap map_w, map_x;
  RETURN_IF_ERROR(MakeMap(&map_w, w, out, in, swiglu_inter > 0 ? kTileM : chosen.tile_features));
  RETURN_IF_ERROR(MakeMap(&map_x, x, rows, in, row_tile));
  const Params p{.y = y,
                 .rows = static_cast<int>(rows),
                 .in = static_cast<int>(in),
                 .out = static_cast<int>(swiglu_inter > 0 ? swiglu_inter : out),
                 .k_blocks = CeilDiv(in, kTileK),
                 .splits = chosen.splits,
                 .swiglu_inter = static_cast<int>(swiglu_inter),
                 .rope = rope != nullptr ? *rope : RopeKvAppendArgs{},
                 .y_fp32 = y_type == GemmOutputType::kFp32,
                 .accumulate = accumulate,
                 .counters = workspace.counters(),
                 .partials = workspace.partials(),
                 .packed_w = w_packed};
  switch (row_tile) {
    case 8:
      return LaunchRows<8>(m, rope != nullptr, map_w, map_x, p, stream);
    case 16:
      return LaunchRows<16>(m, rope != nullptr, map_w, map_x, p, stream);
    case 32:
      return LaunchRows<32>(m, rope != nullptr, map_w, map_x, p, stream);
    default:
      return LaunchRows<64>(m, rope != nullptr, map_w, map_x, p, stream);
  }
}

}  // namespace

absl::Status SkinnyWgmmaLinearCuda(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows,
                                   int64_t in, int64_t out, void* y, GemmOutputType y_type,
                                   bool accumulate, const SkinnyWgmmaWorkspace& workspace,
                                   cudaStream_t stream, SkinnyWgmmaConfig config,
                                   const __nv_bfloat16* w_packed) {
  if (!SkinnyWgmmaLinearSupports(rows, in, out, x, w, y)) {
    return absl::InvalidArgumentError(absl::StrCat("skinny wgmma linear: unsupported product ",
                                                   rows, "x", in, " * ", out, "x", in, "^T"));
  }
  return Run(x, w, rows, in, out, y, y_type, accumulate, /*swiglu_inter=*/0, /*rope=*/nullptr,
             workspace, stream, config, w_packed);
}

absl::Status SkinnyWgmmaLinearSwiGluCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                                         int64_t rows, int64_t in, int64_t inter,
                                         __nv_bfloat16* act, const SkinnyWgmmaWorkspace& workspace,
                                         cudaStream_t stream, int splits,
                                         const __nv_bfloat16* w_packed) {
  if (inter < 1 || !SkinnyWgmmaLinearSupports(rows, in, 2 * inter, x, w_gate_up, act)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: unsupported SwiGLU product ", rows, "x", in, " * ", 2 * inter, "x",
        in, "^T"));
  }
  return Run(x, w_gate_up, rows, in, 2 * inter, act, GemmOutputType::kBf16,
             /*accumulate=*/false, inter, /*rope=*/nullptr, workspace, stream,
             {.tile_features = 2 * kTileM, .splits = splits}, w_packed);
}

bool SkinnyWgmmaQkvRopeSupports(int64_t rows, int64_t in, const RopeKvAppendArgs& a,
                                const void* x, const void* w_qkv) {
  return a.head_dim == 2 * kTileM && a.rope.head_dim == a.head_dim && a.rope.cos != nullptr &&
         a.rope.sin != nullptr && a.rope.max_positions > 0 && a.num_heads > 0 &&
         a.num_kv_heads > 0 && a.num_tokens == rows && a.local_positions != nullptr &&
         a.deltas != nullptr && a.slots != nullptr && a.k_pool != nullptr &&
         a.v_pool != nullptr &&
         SkinnyWgmmaLinearSupports(rows, in,
                                   int64_t{a.num_heads + 2 * a.num_kv_heads} * a.head_dim, x,
                                   w_qkv, a.q_out);
}

absl::Status SkinnyWgmmaLinearQkvRopeCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_qkv,
                                          int64_t rows, int64_t in, const RopeKvAppendArgs& rope,
                                          const SkinnyWgmmaWorkspace& workspace,
                                          cudaStream_t stream, SkinnyWgmmaConfig config,
                                          const __nv_bfloat16* w_packed) {
  if (!SkinnyWgmmaQkvRopeSupports(rows, in, rope, x, w_qkv)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: unsupported QKV + RoPE product: ", rows, " rows, in ", in,
        ", heads ", rope.num_heads, "/", rope.num_kv_heads, ", head_dim ", rope.head_dim,
        " (needs head_dim 128 and a complete RopeKvAppendArgs)"));
  }
  if (config.tile_features != 0 && config.tile_features != 2 * kTileM) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skinny wgmma linear: the QKV + RoPE form's tiles are one head (128 features), not ",
        config.tile_features));
  }
  const int64_t out = int64_t{rope.num_heads + 2 * rope.num_kv_heads} * rope.head_dim;
  return Run(x, w_qkv, rows, in, out, rope.q_out, GemmOutputType::kBf16, /*accumulate=*/false,
             /*swiglu_inter=*/0, &rope, workspace, stream,
             {.tile_features = 2 * kTileM, .splits = config.splits}, w_packed);
}

namespace {

// Element (n, k) of W goes to block (n / 64, k / 64), row n % 64 of 128 bytes, 16-byte chunk
// (k % 64) / 8 XOR (n % 8): the smem image TMA's 128-byte swizzle gives a 64 x 64 box whose base
// is 1024-byte aligned. Zeros past out or in, as TMA's out-of-bounds fill.
__global__ void PackWeightsKernel(const __nv_bfloat16* __restrict__ w, int64_t out, int64_t in,
                                  int64_t k_blocks, int64_t total,
                                  __nv_bfloat16* __restrict__ packed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t block = i / (kTileM * kTileK);
    const int within = static_cast<int>(i % (kTileM * kTileK));
    const int r = within / kTileK, slot = within % kTileK;  // slot: position in the smem row
    const int chunk = (slot / 8) ^ (r % 8), e = slot % 8;     // the chunk's source position
    const int64_t n = block / k_blocks * kTileM + r;
    const int64_t k = block % k_blocks * kTileK + chunk * 8 + e;
    packed[i] = n < out && k < in ? w[n * in + k] : __float2bfloat16_rn(0.f);
  }
}

}  // namespace

// Groups of 64 rows, padded to whole 256-row tiles: the widest tile's copies stay inside.
int64_t PackedGroups(int64_t out) { return (out + 4 * kTileM - 1) / (4 * kTileM) * 4; }

int64_t PackedWeightsElements(int64_t out, int64_t in) {
  return PackedGroups(out) * ((in + kTileK - 1) / kTileK) * kTileM * kTileK;
}

absl::Status PackWeightsForWgmma(const __nv_bfloat16* w, int64_t out, int64_t in,
                                 __nv_bfloat16* packed, cudaStream_t stream) {
  if (w == nullptr || packed == nullptr || out < 1 || in < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack weights for wgmma: out ", out, ", in ", in, ", pointers required"));
  }
  const int64_t blocks = std::min<int64_t>((PackedWeightsElements(out, in) + 255) / 256, 65536);
  PackWeightsKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      w, out, in, (in + kTileK - 1) / kTileK, PackedWeightsElements(out, in), packed);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

SkinnyWgmmaConfig SkinnyWgmmaChosenConfig(int64_t rows, int64_t in, int64_t out,
                                          SkinnyWgmmaConfig config) {
  return Choose(RowTile(rows), in, out, config, /*can_split=*/true);
}

}  // namespace lazyattn
