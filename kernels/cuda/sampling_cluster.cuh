// The cluster-wide building blocks of the sampling kernel (kernels/cuda/sampling.cu): one
// thread-block cluster per logits row, each CTA holding a slice in shared memory. Reductions of
// (max, sums) and of draw results over the cluster in a fixed order, and top-k's radix select.
// Included by sampling.cu only.
#ifndef LAZYATTN_KERNELS_CUDA_SAMPLING_CLUSTER_CUH_
#define LAZYATTN_KERNELS_CUDA_SAMPLING_CLUSTER_CUH_

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/include/sampling.h"

namespace lazyattn {
namespace sampling_internal {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 8;

__device__ __forceinline__ uint32_t OrderKey(float x) {
  return SamplingOrderKey(x, __float_as_uint(x));
}
__device__ __forceinline__ uint64_t Rank(float y, int i) {
  return (uint64_t(OrderKey(y)) << 32) | uint32_t(~uint32_t(i));
}

// What each CTA publishes to its cluster in one phase (double-buffered by phase parity: a CTA
// writes phase p + 1's copy only after the barrier that ends phase p, which every CTA passes
// only after it has read phase p - 1's copy).
struct Partial {
  uint64_t key;  // a max
  float a, b;    // sums or maxima
  float c, d;    // (DrawReduce: the T = 1 softmax sum)
  uint32_t hist[256];
};

struct Shared {
  Partial part[2];
  uint64_t warp_key[kWarps];
  float warp_a[kWarps], warp_b[kWarps], warp_c[kWarps], warp_d[kWarps];
  uint32_t local_hist[256];
  uint64_t key;  // broadcast of a cluster result
  float a, b, c, d;
  uint32_t u32;
  int flag;
  // The draw inside the winning group (its own fields: the reductions' broadcasts may still be
  // read when the pick is written).
  uint32_t pick_id;
  float pick_y;
};

// e^x in one SFU instruction (ex2.approx.ftz: results below 2^-126 flush to 0, which no sum of
// weights relative to their maximum notices; __expf's non-ftz form adds denormal fix-ups).
__device__ __forceinline__ float Exp(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.44269504f));
  return r;
}

enum class Op { kMax, kSum };
__device__ __forceinline__ float Combine(Op op, float x, float y) {
  return op == Op::kMax ? fmaxf(x, y) : x + y;
}

// Block then cluster reduction of (key: max, a: op_a, b: op_b), in a fixed order. Every thread
// of every CTA returns the cluster's result. `phase` selects the Partial copy. The warps' and
// the CTAs' partials are each folded by one warp's shuffle tree (lane i holds partial i), which
// keeps the serial chain short; every CTA folds in the same order, so all get the same result.
struct Reduced {
  uint64_t key;
  float a, b;
};
__device__ __forceinline__ float Identity(Op op) { return op == Op::kMax ? -INFINITY : 0.f; }
__device__ __forceinline__ void FoldLanes(uint64_t& key, float& a, Op op_a, float& b, Op op_b,
                                          int width) {
  for (int o = width / 2; o > 0; o >>= 1) {
    const uint64_t k = __shfl_xor_sync(0xffffffffu, key, o);
    key = k > key ? k : key;
    a = Combine(op_a, a, __shfl_xor_sync(0xffffffffu, a, o));
    b = Combine(op_b, b, __shfl_xor_sync(0xffffffffu, b, o));
  }
}
inline __device__ Reduced ClusterReduce(cg::cluster_group& cluster, Shared& sh, int& phase, uint64_t key,
                                 float a, Op op_a, float b, Op op_b) {
  FoldLanes(key, a, op_a, b, op_b, 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp_key[warp] = key, sh.warp_a[warp] = a, sh.warp_b[warp] = b;
  __syncthreads();
  Partial& mine = sh.part[phase & 1];
  if (warp == 0) {
    uint64_t k = lane < kWarps ? sh.warp_key[lane] : 0;
    float x = lane < kWarps ? sh.warp_a[lane] : Identity(op_a);
    float y = lane < kWarps ? sh.warp_b[lane] : Identity(op_b);
    FoldLanes(k, x, op_a, y, op_b, kWarps);
    if (lane == 0) mine.key = k, mine.a = x, mine.b = y;
  }
  cluster.sync();
  if (warp == 0) {
    uint64_t k = 0;
    float x = Identity(op_a), y = Identity(op_b);
    if (lane < int(cluster.num_blocks())) {
      const Partial* p = cluster.map_shared_rank(&mine, lane);
      k = p->key, x = p->a, y = p->b;
    }
    FoldLanes(k, x, op_a, y, op_b, kMaxCluster);
    if (lane == 0) sh.key = k, sh.a = x, sh.b = y;
  }
  __syncthreads();
  ++phase;
  return Reduced{sh.key, sh.a, sh.b};
}

// A softmax denominator relative to its own maximum: the sum of exp(y - m) over a set.
struct SoftSum {
  float m = -INFINITY, z = 0.f;
};
__device__ __forceinline__ SoftSum Merge(SoftSum a, SoftSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return SoftSum{};
  return SoftSum{m, a.z * Exp(a.m - m) + b.z * Exp(b.m - m)};
}

// What one draw pass reduces: the winning group's rank, the set's scaled softmax sum and the
// row's T = 1 softmax sum (each relative to its maximum, so no max pass has to come first).
struct DrawResult {
  uint64_t key = 0;
  SoftSum k, one;
};
__device__ __forceinline__ DrawResult Merge(DrawResult x, DrawResult y) {
  return DrawResult{y.key > x.key ? y.key : x.key, Merge(x.k, y.k), Merge(x.one, y.one)};
}
__device__ __forceinline__ DrawResult FoldLanes(DrawResult v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) {
    DrawResult w;
    w.key = __shfl_xor_sync(0xffffffffu, v.key, o);
    w.k.m = __shfl_xor_sync(0xffffffffu, v.k.m, o);
    w.k.z = __shfl_xor_sync(0xffffffffu, v.k.z, o);
    w.one.m = __shfl_xor_sync(0xffffffffu, v.one.m, o);
    w.one.z = __shfl_xor_sync(0xffffffffu, v.one.z, o);
    v = Merge(v, w);
  }
  return v;
}

// As ClusterReduce, for DrawResults.
inline __device__ DrawResult DrawReduce(cg::cluster_group& cluster, Shared& sh, int& phase,
                                 DrawResult v) {
  v = FoldLanes(v, 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh.warp_key[warp] = v.key;
    sh.warp_a[warp] = v.k.m, sh.warp_b[warp] = v.k.z;
    sh.warp_c[warp] = v.one.m, sh.warp_d[warp] = v.one.z;
  }
  __syncthreads();
  Partial& mine = sh.part[phase & 1];
  if (warp == 0) {
    DrawResult t;
    if (lane < kWarps) {
      t = DrawResult{sh.warp_key[lane], {sh.warp_a[lane], sh.warp_b[lane]},
                     {sh.warp_c[lane], sh.warp_d[lane]}};
    }
    t = FoldLanes(t, kWarps);
    if (lane == 0) {
      mine.key = t.key, mine.a = t.k.m, mine.b = t.k.z, mine.c = t.one.m, mine.d = t.one.z;
    }
  }
  cluster.sync();
  if (warp == 0) {
    DrawResult t;
    if (lane < int(cluster.num_blocks())) {
      const Partial* q = cluster.map_shared_rank(&mine, lane);
      t = DrawResult{q->key, {q->a, q->b}, {q->c, q->d}};
    }
    t = FoldLanes(t, kMaxCluster);
    if (lane == 0) sh.key = t.key, sh.a = t.k.m, sh.b = t.k.z, sh.c = t.one.m, sh.d = t.one.z;
  }
  __syncthreads();
  ++phase;
  return DrawResult{sh.key, {sh.a, sh.b}, {sh.c, sh.d}};
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// SamplingScaled without branches (the same value; the shared form's early return made the
// compiler branch per element).
__device__ __forceinline__ float ScaledNoBranch(float x, float inv_t) {
  const float y = fminf(x * inv_t, 3.4028235e38f);
  return x == x ? y : -INFINITY;
}

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The value at global id `id` of the row, from whichever CTA of the cluster holds it.
inline __device__ float RemoteValue(cg::cluster_group& cluster, float* xs, int slice, int id) {
  const int owner = id / slice;
  return cluster.map_shared_rank(xs, owner)[id - owner * slice];
}

// Top-k's cut: the k-th largest Rank of the scaled row, by a 4-pass radix select over the
// cluster's 8-bit histograms of order keys, then the lowest ids among ties at it (the CTAs hold
// ascending id ranges, so the cut is in the first CTA whose running tie count reaches what is
// still needed; its count is its last-pass histogram bin, still in its Partial). An id is kept
// iff Rank(y, id) >= the result. Cluster-collective.
inline __device__ uint64_t TopKThreshold(cg::cluster_group& cluster, Shared& sh, int& phase,
                                  const float* xs, int n, int begin, float inv_t, int k) {
  const int rank = static_cast<int>(cluster.block_rank());
  uint32_t prefix = 0, mask = 0;
  uint32_t target = uint32_t(k), above = 0, at = 0, digit = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.local_hist[b] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const uint32_t key = OrderKey(SamplingScaled(xs[j], inv_t));
      if ((key & mask) == prefix) atomicAdd(&sh.local_hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    Partial& mine = sh.part[phase & 1];
    for (int b = threadIdx.x; b < 256; b += kThreads) mine.hist[b] = sh.local_hist[b];
    cluster.sync();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      uint32_t total = 0;
      for (unsigned q = 0; q < cluster.num_blocks(); ++q) {
        total += cluster.map_shared_rank(&mine, q)->hist[b];
      }
      sh.local_hist[b] = total;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t acc = above;
      int d = 255;
      for (; d > 0; --d) {
        if (acc + sh.local_hist[d] >= target) break;
        acc += sh.local_hist[d];
      }
      sh.u32 = uint32_t(d);
      sh.a = __uint_as_float(acc);
      sh.b = __uint_as_float(sh.local_hist[d]);
    }
    __syncthreads();
    digit = sh.u32;
    above = __float_as_uint(sh.a);
    at = __float_as_uint(sh.b);
    prefix |= digit << shift;
    mask |= 255u << shift;
    ++phase;
    __syncthreads();
  }
  const uint32_t need = target - above;
  if (need >= at) return uint64_t(prefix) << 32;  // every tie kept
  const Partial& last = sh.part[(phase - 1) & 1];
  uint32_t before = 0;
  int owner = 0;
  for (unsigned q = 0; q < cluster.num_blocks(); ++q) {
    const uint32_t c = cluster.map_shared_rank(&last, q)->hist[digit];
    if (before + c >= need) {
      owner = int(q);
      break;
    }
    before += c;
  }
  uint32_t cut_id = 0;
  if (rank == owner) {
    uint32_t want = need - before, seen_ties = 0;
    for (int base = 0; base < n; base += kThreads) {
      const int j = base + threadIdx.x;
      const bool tie = j < n && OrderKey(SamplingScaled(xs[j], inv_t)) == prefix;
      const uint32_t ballot_count = __syncthreads_count(tie);
      if (seen_ties + ballot_count >= want) {
        // The (want - seen_ties)-th tie of this chunk, in id order.
        if (threadIdx.x == 0) sh.u32 = 0;
        __syncthreads();
        const uint32_t lane_mask = __ballot_sync(0xffffffffu, tie);
        if (threadIdx.x % 32 == 0) sh.warp_key[threadIdx.x / 32] = __popc(lane_mask);
        __syncthreads();
        uint32_t prior = seen_ties;
        for (int w = 0; w < int(threadIdx.x / 32); ++w) prior += uint32_t(sh.warp_key[w]);
        prior += __popc(lane_mask & ((1u << (threadIdx.x % 32)) - 1u));
        if (tie && prior + 1 == want) sh.u32 = uint32_t(begin + j);
        __syncthreads();
        break;
      }
      seen_ties += ballot_count;
    }
    cut_id = sh.u32;
  }
  Reduced rc = ClusterReduce(cluster, sh, phase, rank == owner ? uint64_t(cut_id) : 0, 0.f,
                             Op::kSum, 0.f, Op::kSum);
  return (uint64_t(prefix) << 32) | uint32_t(~uint32_t(rc.key));
}

}  // namespace sampling_internal
}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SAMPLING_CLUSTER_CUH_
