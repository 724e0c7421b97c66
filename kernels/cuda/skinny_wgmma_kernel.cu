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
//
// This file holds the kernel and its instances; the host side (checks, the tile and split
// choice, tensor maps) is skinny_wgmma_linear.cu and the weight packing skinny_wgmma_pack.cu.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/skinny_wgmma_internal.cuh"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "kernels/cuda/split_arrival.cuh"
#include "kernels/cuda/wgmma_primitives.cuh"

namespace lazyattn::skinny_wgmma_internal {
namespace {

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
  // First output feature of the tile (the SwiGLU form's tile holds the gate and up rows of
  // 32 kM features: its first kM / 2 64-row blocks are gate rows, the others up rows).
  constexpr int kSwiGluFeatures = L::kFeatures / 2;
  const int n0 = tile * (p.swiglu_inter > 0 ? kSwiGluFeatures : L::kFeatures);
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
      // The weight row of 64-row block m of the tile: the SwiGLU form's gate rows at n0 +
      // 64 m, its up rows at inter + n0 + 64 (m - kM / 2). (Past inter, in a partial last
      // tile, a gate block reads up rows and an up block the padding or zeros: their
      // features are not stored.)
      auto block_row = [&](int m) {
        if (p.swiglu_inter == 0) return n0 + m * kTileM;
        return m < kM / 2 ? n0 + m * kTileM : p.swiglu_inter + n0 + (m - kM / 2) * kTileM;
      };
      // The SwiGLU form's map has 64-row boxes, one per block.
      auto load_weights = [&](int s, int i) {
        const int k = (kb_begin + i) * kTileK;
        if (p.packed_w != nullptr) {
          // Block (64-row group g, K block kb) lies at (g * k_blocks + kb) * 8 KB, already in
          // the 128-byte-swizzled order TMA would write: a plain copy per 64-row group.
          for (int m = 0; m < kM; ++m) {
            const int64_t block = int64_t{block_row(m) / kTileM} * p.k_blocks + kb_begin + i;
            BulkLoad(a_tile(s) + m * kTileM * 128, p.packed_w + block * kTileM * kTileK,
                     kTileM * 128, full(s), weights_policy);
          }
        } else if (p.swiglu_inter > 0) {
          for (int m = 0; m < kM; ++m) {
            TmaLoad2d(a_tile(s) + m * kTileM * 128, &map_w, k, block_row(m), full(s),
                      weights_policy);
          }
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

  // Consumers. The 64-row instances keep one wgmma group in flight across stages (a stage is
  // released a step later, so the producer runs kStages - 1 ahead): timed alone on the H200 it
  // was faster at 64 rows (qkv 19.7 against 21.5 us, gate/up 72.4 against 77.0, LM head 330
  // against 368) but slower at 32 (qkv 21.0 against 19.7, o 17.3 against 15.5).
  constexpr bool kOneGroupInFlight = kRows == 64;
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
    if constexpr (kOneGroupInFlight) {
      WgmmaWait<1>();  // this stage's group may still run: release the previous stage
      if (i > 0 && lane == 0) MbarArrive(empty((i - 1) % kStages));
    } else {
      WgmmaWait<0>();
      if (lane == 0) MbarArrive(empty(s));
    }
  }
  if constexpr (kOneGroupInFlight) WgmmaWait<0>();
  // Every group is done; the epilogue's reads of d stay after the wait.
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int i = 0; i < kRows / 2; ++i) WgmmaFenceOperand(d[m][i]);
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
    if constexpr (kM >= 2) {
#pragma unroll
      for (int h = 0; h < kM / 2; ++h) {  // gate block h pairs with up block kM / 2 + h
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) {
          const int r = AccRow(lane, i), n = n0 + h * kTileM + AccFeature(warp, lane, i);
          if (r >= p.rows || n >= p.out) continue;
          // Gate and up rounded to bf16 first, as SwiGluCuda reads them after a bf16 product:
          // the same rounding points as the cuBLASLt path. (Kept in fp32, one SmolLM2 golden
          // prompt's first-step cosine to the fp32 CPU model fell to 0.99892, against 0.99947
          // this way and 0.99985 on cuBLASLt: that model amplifies any change of rounding;
          // docs/kernels.md.)
          const float gate = RoundToBf16(d[h][i]), up = RoundToBf16(d[kM / 2 + h][i]);
          static_cast<__nv_bfloat16*>(p.y)[static_cast<int64_t>(r) * p.out + n] =
              __float2bfloat16_rn(gate / (1.f + expf(-gate)) * up);
        }
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
  // The SwiGLU form's tile is half as many features (their gate and up rows fill the A tile).
  const int tile_features = p.swiglu_inter > 0 ? L::kFeatures / 2 : L::kFeatures;
  const dim3 grid(p.splits, (p.out + tile_features - 1) / tile_features);
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(SkinnyWgmmaKernel<kRows, kM, kQkvRope>, grid,
                                        dim3(kThreads), L::kBytes, stream, map_w, map_x, p));
  return absl::OkStatus();
}

template <int kRows>
int CtasPerSmRows(int m) {
  return m == 1   ? CtasPerSmOf<kRows, 1>()
         : m == 2 ? CtasPerSmOf<kRows, 2>()
                  : CtasPerSmOf<kRows, 4>();
}

}  // namespace

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

template absl::Status LaunchRows<8>(int, bool, const CUtensorMap&, const CUtensorMap&,
                                    const Params&, cudaStream_t);
template absl::Status LaunchRows<16>(int, bool, const CUtensorMap&, const CUtensorMap&,
                                     const Params&, cudaStream_t);
template absl::Status LaunchRows<32>(int, bool, const CUtensorMap&, const CUtensorMap&,
                                     const Params&, cudaStream_t);
template absl::Status LaunchRows<64>(int, bool, const CUtensorMap&, const CUtensorMap&,
                                     const Params&, cudaStream_t);

int CtasPerSm(int m, int row_tile) {
  const int n = row_tile == 8    ? CtasPerSmRows<8>(m)
                : row_tile == 16 ? CtasPerSmRows<16>(m)
                : row_tile == 32 ? CtasPerSmRows<32>(m)
                                 : CtasPerSmRows<64>(m);
  return std::max(n, 1);
}

}  // namespace lazyattn::skinny_wgmma_internal
