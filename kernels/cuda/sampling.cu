#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

#include <cooperative_groups.h>

namespace lazyattn {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCluster = 8;
constexpr int kMaxSliceBytes = 200 * 1024;

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
};

enum class Op { kMax, kSum };
__device__ __forceinline__ float Combine(Op op, float x, float y) {
  return op == Op::kMax ? fmaxf(x, y) : x + y;
}

// Block then cluster reduction of (key: max, a: op_a, b: op_b), in a fixed order. Every thread
// of every CTA returns the cluster's result. `phase` selects the Partial copy.
struct Reduced {
  uint64_t key;
  float a, b;
};
__device__ Reduced ClusterReduce(cg::cluster_group& cluster, Shared& sh, int& phase, uint64_t key,
                                 float a, Op op_a, float b, Op op_b) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t k = __shfl_xor_sync(0xffffffffu, key, o);
    key = k > key ? k : key;
    a = Combine(op_a, a, __shfl_xor_sync(0xffffffffu, a, o));
    b = Combine(op_b, b, __shfl_xor_sync(0xffffffffu, b, o));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp_key[warp] = key, sh.warp_a[warp] = a, sh.warp_b[warp] = b;
  __syncthreads();
  Partial& mine = sh.part[phase & 1];
  if (threadIdx.x == 0) {
    uint64_t k = sh.warp_key[0];
    float x = sh.warp_a[0], y = sh.warp_b[0];
    for (int w = 1; w < kWarps; ++w) {
      k = sh.warp_key[w] > k ? sh.warp_key[w] : k;
      x = Combine(op_a, x, sh.warp_a[w]);
      y = Combine(op_b, y, sh.warp_b[w]);
    }
    mine.key = k, mine.a = x, mine.b = y;
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    uint64_t k = 0;
    float x = 0, y = 0;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
      const Partial* p = cluster.map_shared_rank(&mine, r);
      if (r == 0) {
        k = p->key, x = p->a, y = p->b;
      } else {
        k = p->key > k ? p->key : k;
        x = Combine(op_a, x, p->a);
        y = Combine(op_b, y, p->b);
      }
    }
    sh.key = k, sh.a = x, sh.b = y;
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
  return SoftSum{m, a.z * __expf(a.m - m) + b.z * __expf(b.m - m)};
}

// What one draw pass reduces: the Gumbel winner's rank, the set's scaled softmax sum and the
// row's T = 1 softmax sum (each relative to its maximum, so no max pass has to come first).
struct DrawResult {
  uint64_t key = 0;
  SoftSum k, one;
};
__device__ __forceinline__ DrawResult Merge(DrawResult x, DrawResult y) {
  return DrawResult{y.key > x.key ? y.key : x.key, Merge(x.k, y.k), Merge(x.one, y.one)};
}

// As ClusterReduce, for DrawResults (a fixed merge order: the same result on every run).
__device__ DrawResult DrawReduce(cg::cluster_group& cluster, Shared& sh, int& phase,
                                 DrawResult v) {
  for (int o = 16; o > 0; o >>= 1) {
    DrawResult w;
    w.key = __shfl_xor_sync(0xffffffffu, v.key, o);
    w.k.m = __shfl_xor_sync(0xffffffffu, v.k.m, o);
    w.k.z = __shfl_xor_sync(0xffffffffu, v.k.z, o);
    w.one.m = __shfl_xor_sync(0xffffffffu, v.one.m, o);
    w.one.z = __shfl_xor_sync(0xffffffffu, v.one.z, o);
    v = Merge(v, w);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh.warp_key[warp] = v.key;
    sh.warp_a[warp] = v.k.m, sh.warp_b[warp] = v.k.z;
    sh.warp_c[warp] = v.one.m, sh.warp_d[warp] = v.one.z;
  }
  __syncthreads();
  Partial& mine = sh.part[phase & 1];
  if (threadIdx.x == 0) {
    DrawResult t;
    for (int w = 0; w < kWarps; ++w) {
      t = Merge(t, DrawResult{sh.warp_key[w], {sh.warp_a[w], sh.warp_b[w]},
                              {sh.warp_c[w], sh.warp_d[w]}});
    }
    mine.key = t.key, mine.a = t.k.m, mine.b = t.k.z, mine.c = t.one.m, mine.d = t.one.z;
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    DrawResult t;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) {
      const Partial* q = cluster.map_shared_rank(&mine, r);
      t = Merge(t, DrawResult{q->key, {q->a, q->b}, {q->c, q->d}});
    }
    sh.key = t.key, sh.a = t.k.m, sh.b = t.k.z, sh.c = t.one.m, sh.d = t.one.z;
  }
  __syncthreads();
  ++phase;
  return DrawResult{sh.key, {sh.a, sh.b}, {sh.c, sh.d}};
}

// SamplingGumbel(bits) from the fast intrinsics, within 1e-4 of it (the accurate logf is what
// makes the noise expensive); used only to skip the accurate noise of elements that cannot win.
// E = -ln u: near u = 1 its series in v = 1 - u (v exact in float; error < 1e-6 relative), else
// __logf (absolute error 2^-21.4 on [0.5, 2], 3 ulp elsewhere: < 3e-5 relative to E >= 2^-6);
// then -__logf(E) adds < 6e-6.
__device__ __forceinline__ float FastGumbel(uint32_t bits) {
  const uint32_t b = bits >> 8;
  float e;
  if (b >= (1u << 24) - (1u << 18)) {  // v <= 2^-6
    const float v = (float((1u << 24) - b) - 0.5f) * 5.9604645e-8f;
    e = v * (1.f + v * (0.5f + v * (1.f / 3.f)));
  } else {
    e = -__logf((float(b) + 0.5f) * 5.9604645e-8f);
  }
  return -__logf(e);
}
// Above every SamplingGumbel value (u <= 1 - 2^-25 gives at most 17.33).
constexpr float kGumbelMax = 17.5f;
// How far below an element's accurate key its FastGumbel key may sit: the estimate's error and
// the rounding of y + g at the key's magnitude, with a wide margin.
__device__ __forceinline__ float GumbelSlack(float key) { return 1e-3f + 1e-6f * fabsf(key); }

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The value at global id `id` of the row, from whichever CTA of the cluster holds it.
__device__ float RemoteValue(cg::cluster_group& cluster, float* xs, int slice, int id) {
  const int owner = id / slice;
  return cluster.map_shared_rank(xs, owner)[id - owner * slice];
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(SampleRowsArgs args, int slice) {
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ __align__(16) float xs[];
  __shared__ Shared sh;
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = blockIdx.x / static_cast<int>(cluster.num_blocks());
  const int V = args.vocab;
  const int begin = rank * slice;
  const int n = max(0, min(slice, V - begin));
  const SamplingRowParams p = args.params[row];
  const float* x = args.logits + int64_t(row) * args.row_stride + begin;

  // Load the slice (16-byte loads where aligned).
  const bool vec = args.row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(args.logits) % 16 == 0;
  if (vec) {
    for (int q = threadIdx.x; 4 * q < n; q += kThreads) {
      if (4 * q + 3 < n) {
        reinterpret_cast<float4*>(xs)[q] = __ldg(reinterpret_cast<const float4*>(x) + q);
      } else {
        for (int j = 4 * q; j < n; ++j) xs[j] = x[j];
      }
    }
  } else {
    for (int j = threadIdx.x; j < n; j += kThreads) xs[j] = x[j];
  }
  __syncthreads();
  // Penalties, on this CTA's ids.
  if (HasPenalties(p)) {
    const PenaltyEntry* e = args.penalties + p.penalty_begin;
    const bool count_input = (p.flags & kCountInputToken) && args.input_tokens != nullptr;
    int input = -1;
    if (count_input) {
      input = args.input_tokens[args.input_token_rows ? args.input_token_rows[row] : row];
      if (input < 0 || input >= V) input = -1;
    }
    int seen = 0;
    for (int k = threadIdx.x; k < p.penalty_count; k += kThreads) {
      const PenaltyEntry pe = e[k];
      if (pe.id < 0 || pe.id >= V) continue;
      const int extra = pe.id == input ? 1 : 0;
      seen |= extra;
      if (pe.id >= begin && pe.id < begin + n) {
        xs[pe.id - begin] =
            PenalizedLogit(xs[pe.id - begin], p, pe.output_count + extra, pe.in_prompt != 0);
      }
    }
    seen = __syncthreads_or(seen);
    if (threadIdx.x == 0 && input >= 0 && !seen && input >= begin && input < begin + n) {
      xs[input - begin] = PenalizedLogit(xs[input - begin], p, 1, false);
    }
    __syncthreads();
  }

  const bool greedy = !(p.temperature > 0.f) || p.top_k == 1;
  const bool want_logprob = (p.flags & kSampleLogprob) && args.out_logprobs != nullptr;
  const float inv_t = greedy ? 1.f : 1.f / p.temperature;
  // A sampled row without top-k or min-p needs no maximum before its first draw: that pass sums
  // the softmax relative to each thread's own maximum and merges the sums (SoftSum), so the
  // separate max pass and its cluster reduction go away.
  const bool fused = !greedy && !(p.top_k > 0 && p.top_k < V) && !(p.min_p > 0.f);
  int phase = 0;

  // The max pass: the greedy key (raw values, NaN lowest), max scaled value, max value at T = 1.
  int argmax = 0;
  float m = -INFINITY, m1 = -INFINITY;
  auto max_pass = [&] {
    uint64_t best = 0;
    float mm = -INFINITY, mm1 = -INFINITY;
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float v = xs[j];
      const uint64_t k = Rank(v, begin + j);
      best = k > best ? k : best;
      mm = fmaxf(mm, SamplingScaled(v, inv_t));
      mm1 = fmaxf(mm1, SamplingScaled(v, 1.f));
    }
    const Reduced r1 = ClusterReduce(cluster, sh, phase, best, mm, Op::kMax, mm1, Op::kMax);
    argmax = int(~uint32_t(r1.key));
    m = r1.a;
    m1 = r1.b;
  };
  if (!fused) max_pass();
  int chosen = argmax;
  float z1 = 0;  // sum of exp(x - m1) (logprobs)
  bool have_z1 = false;

  if (fused || (!greedy && m > -INFINITY)) {
    // Top-k: the k-th largest order key by a 4-pass radix select over the cluster, then the
    // lowest ids among ties at it. Kept iff Rank(y, i) >= t_k.
    uint64_t t_k = 0;
    if (p.top_k > 0 && p.top_k < V) {
      uint32_t prefix = 0, mask = 0;
      uint32_t target = uint32_t(p.top_k), above = 0, at = 0, digit = 0;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kThreads) sh.local_hist[b] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += kThreads) {
          const uint32_t k = OrderKey(SamplingScaled(xs[j], inv_t));
          if ((k & mask) == prefix) atomicAdd(&sh.local_hist[(k >> shift) & 255u], 1u);
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
      t_k = uint64_t(prefix) << 32;  // every tie kept
      const uint32_t need = target - above;
      if (need < at) {
        // Ties at the cut, lowest ids first: the CTAs hold ascending id ranges, so the cut is in
        // the first CTA whose running tie count reaches `need` (its count is its last-pass
        // histogram bin, still in its Partial).
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
        t_k = (uint64_t(prefix) << 32) | uint32_t(~uint32_t(rc.key));
      }
    }
    const float min_y = p.min_p > 0.f ? m + logf(p.min_p) : -INFINITY;
    float z_k = 0;
    uint64_t lower = 0;  // candidates rank above it
    chosen = -1;
    const int nq = (n + 3) / 4;
    for (uint32_t round = 0; round < uint32_t(kMaxSamplingRounds); ++round) {
      // Draw: Gumbel-max over the current set; round 0 also sums the top-k mass and z1.
      const bool first = round == 0;
      // Exponent references: the maxima when known, else (fused round 0) each thread's own.
      float ref = m, ref1 = m1;
      if (first && fused) {
        for (int q = threadIdx.x; 4 * q < n; q += kThreads) {
          for (int j = 0; j < 4 && 4 * q + j < n; ++j) {
            const float v = xs[4 * q + j];
            ref = fmaxf(ref, SamplingScaled(v, inv_t));
            if (want_logprob) ref1 = fmaxf(ref1, SamplingScaled(v, 1.f));
          }
        }
      }
      const bool sum_k = first && p.top_p < 1.f && ref > -INFINITY;
      const bool sum_1 = first && want_logprob && ref1 > -INFINITY;
      DrawResult mine;
      mine.k.m = ref;
      mine.one.m = ref1;
      // Only the largest key matters, so an element whose key cannot reach `bar` (the best
      // accurate key of its warp so far) skips the accurate noise: first by the noise's bound
      // (on peaked logits nearly every element, and before its Philox call), then by the
      // FastGumbel estimate (on flat logits all but a few per warp). The winner, and so the
      // draw, is the one the full computation gives.
      float best_val = -INFINITY, warp_best = -INFINITY;
      for (int base = 0; base < nq; base += kThreads) {  // uniform trip count (WarpMax)
        const int q = base + int(threadIdx.x);
        Philox4 bits{};
        bool drawn = false;
        for (int j = 0; j < 4 && 4 * q + j < n; ++j) {
          const int local = 4 * q + j, id = begin + local;
          const float y = SamplingScaled(xs[local], inv_t);
          const uint64_t rk = Rank(y, id);
          if (sum_1) mine.one.z += __expf(SamplingScaled(xs[local], 1.f) - ref1);
          if (rk < t_k) continue;
          if (sum_k) mine.k.z += __expf(y - ref);
          if (rk <= lower || !(y >= min_y)) continue;
          const float bar = fmaxf(warp_best, best_val);
          const float cut = bar - GumbelSlack(bar);
          if (y + kGumbelMax < cut) continue;
          if (!drawn) {
            bits = SamplingBits(p.seed, p.step, round, uint32_t((begin >> 2) + q));
            drawn = true;
          }
          if (bar > -INFINITY && y + FastGumbel(bits.v[j]) < cut) continue;
          const float key = y + SamplingGumbel(bits.v[j]);
          const uint64_t kr = Rank(key, id);
          if (kr > mine.key) {
            mine.key = kr;
            best_val = key;
          }
        }
        warp_best = WarpMax(best_val);
      }
      const DrawResult rd = DrawReduce(cluster, sh, phase, mine);
      if (first) {
        m = rd.k.m;  // unchanged unless fused
        m1 = rd.one.m;
        z_k = rd.k.z;
        z1 = rd.one.z;
        have_z1 = want_logprob;
        if (!(m > -INFINITY)) break;  // no finite logit (fused only): the argmax below
      }
      if (rd.key == 0) break;  // nothing left (cannot happen while the top token is in the set)
      const int c = int(~uint32_t(rd.key));
      if (!(p.top_p < 1.f)) {
        chosen = c;
        break;
      }
      const uint64_t rc = Rank(SamplingScaled(RemoteValue(cluster, xs, slice, c), inv_t), c);
      float mass = 0;
      for (int j = threadIdx.x; j < n; j += kThreads) {
        const float y = SamplingScaled(xs[j], inv_t);
        const uint64_t rk = Rank(y, begin + j);
        if (rk >= t_k && rk > rc) mass += __expf(y - m);
      }
      Reduced rm = ClusterReduce(cluster, sh, phase, 0, mass, Op::kSum, 0.f, Op::kSum);
      if (rm.a < p.top_p * z_k) {
        chosen = c;
        break;
      }
      lower = rc;
    }
    if (chosen < 0) {  // uniform over the cluster: every value above is a cluster result
      if (fused) max_pass();
      chosen = argmax;
    }
  }
  if (want_logprob && !have_z1) {
    float z = 0;
    for (int j = threadIdx.x; j < n; j += kThreads) z += __expf(SamplingScaled(xs[j], 1.f) - m1);
    z1 = ClusterReduce(cluster, sh, phase, 0, z, Op::kSum, 0.f, Op::kSum).a;
  }
  if (rank == 0 && threadIdx.x == 0) {
    args.out_ids[row] = chosen;
    if (want_logprob) {
      args.out_logprobs[row] =
          SamplingScaled(RemoteValue(cluster, xs, slice, chosen), 1.f) - m1 - logf(z1);
    }
  }
  cluster.sync();  // no CTA leaves while another may read its shared memory
}

// Grid (slices, rows); each thread folds float4s of its slice, then warp and CTA maxima, then
// one atomicMax per CTA.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerCta = 4096;  // logits a CTA reads: 4 float4 per thread

__global__ void __launch_bounds__(kArgmaxThreads)
    GreedyArgmaxKernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                       unsigned long long* __restrict__ packed) {
  const float* x = logits + int64_t(blockIdx.y) * row_stride;
  const int first = blockIdx.x * kArgmaxPerCta;
  const int end = min(vocab, first + kArgmaxPerCta);
  uint64_t best = 0;
  auto fold = [&](float v, int i) {
    const uint64_t key = (uint64_t(OrderKey(v)) << 32) | uint32_t(~uint32_t(i));
    best = key > best ? key : best;
  };
  const bool vec = row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (vec) {
#pragma unroll
    for (int u = 0; u < kArgmaxPerCta / (4 * kArgmaxThreads); ++u) {
      const int i = first + 4 * (threadIdx.x + u * kArgmaxThreads);
      if (i + 3 < end) {
        const float4 v = *reinterpret_cast<const float4*>(x + i);
        fold(v.x, i), fold(v.y, i + 1), fold(v.z, i + 2), fold(v.w, i + 3);
      } else {
        for (int j = i; j < end; ++j) fold(x[j], j);
      }
    }
  } else {
    for (int i = first + threadIdx.x; i < end; i += kArgmaxThreads) fold(x[i], i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t v = __shfl_xor_sync(0xffffffffu, best, o);
    best = v > best ? v : best;
  }
  __shared__ uint64_t warp_best[kArgmaxThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    atomicMax(packed + blockIdx.y, static_cast<unsigned long long>(best));
  }
}

}  // namespace

absl::Status GreedyArgmaxCuda(const float* logits, int64_t row_stride, int rows, int vocab,
                              uint64_t* packed, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || row_stride < vocab) {
    return absl::InvalidArgumentError(absl::StrCat("greedy argmax: rows ", rows, ", vocab ",
                                                   vocab, ", row_stride ", row_stride));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || packed == nullptr) {
    return absl::InvalidArgumentError("greedy argmax: a required pointer is null");
  }
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(packed, 0, size_t(rows) * sizeof(uint64_t), stream));
  constexpr int kMaxGridRows = 65535;  // gridDim.y
  for (int first = 0; first < rows; first += kMaxGridRows) {
    const dim3 grid((vocab + kArgmaxPerCta - 1) / kArgmaxPerCta,
                    std::min(kMaxGridRows, rows - first));
    GreedyArgmaxKernel<<<grid, kArgmaxThreads, 0, stream>>>(
        logits + int64_t(first) * row_stride, row_stride, vocab,
        reinterpret_cast<unsigned long long*>(packed + first));
  }
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

namespace {
__global__ void GreedyIdsToTokensKernel(const uint64_t* __restrict__ packed,
                                        const int32_t* __restrict__ source_rows, int rows,
                                        int32_t* __restrict__ tokens) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows) tokens[i] = static_cast<int32_t>(~static_cast<uint32_t>(packed[source_rows[i]]));
}
}  // namespace

absl::Status GreedyIdsToTokensCuda(const uint64_t* packed, const int32_t* source_rows, int rows,
                                   int32_t* tokens, cudaStream_t stream) {
  if (rows < 0) return absl::InvalidArgumentError(absl::StrCat("greedy ids: rows ", rows));
  if (rows == 0) return absl::OkStatus();
  if (packed == nullptr || source_rows == nullptr || tokens == nullptr) {
    return absl::InvalidArgumentError("greedy ids: a required pointer is null");
  }
  constexpr int kThreadsPerCta = 256;
  GreedyIdsToTokensKernel<<<(rows + kThreadsPerCta - 1) / kThreadsPerCta, kThreadsPerCta, 0,
                            stream>>>(packed, source_rows, rows, tokens);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

int SamplingClusterSize(int vocab) {
  int c = 1;
  while (c < kMaxCluster && (int64_t(vocab) + c - 1) / c * 4 > 16 * 1024) c *= 2;
  return c;
}

absl::Status SampleRowsCuda(const SampleRowsArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.vocab <= 0 || a.row_stride < a.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: rows ", a.rows, ", vocab ",
                                                   a.vocab, ", row_stride ", a.row_stride));
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.logits == nullptr || a.params == nullptr || a.out_ids == nullptr) {
    return absl::InvalidArgumentError("sampling: a required pointer is null");
  }
  const int cluster = SamplingClusterSize(a.vocab);
  const int slice = int((int64_t(a.vocab) + cluster - 1) / cluster + 3) / 4 * 4;
  const size_t smem = size_t(slice) * sizeof(float);
  if (smem > size_t(kMaxSliceBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: vocabulary of ", a.vocab, " ids is past what ", kMaxCluster,
                     " CTAs' shared memory holds"));
  }
  // Raised once per device and size (a replayed graph's capture then sets nothing).
  static std::atomic<int> raised[64];
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  if (device < 0 || device >= 64 || raised[device].load() < int(smem)) {
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(
        SampleRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    if (device >= 0 && device < 64) raised[device].store(int(smem));
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(a.rows) * unsigned(cluster));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  RETURN_IF_CUDA_ERROR(cudaLaunchKernelEx(&config, SampleRowsKernel, a, slice));
  return absl::OkStatus();
}

namespace {
__global__ void SampledIdsToTokensKernel(const int32_t* __restrict__ ids,
                                         const int32_t* __restrict__ source_rows, int rows,
                                         int32_t* __restrict__ tokens) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows) tokens[i] = ids[source_rows[i]];
}
}  // namespace

absl::Status SampledIdsToTokensCuda(const int32_t* ids, const int32_t* source_rows, int rows,
                                    int32_t* tokens, cudaStream_t stream) {
  if (rows < 0) return absl::InvalidArgumentError(absl::StrCat("sampled ids: rows ", rows));
  if (rows == 0) return absl::OkStatus();
  if (ids == nullptr || source_rows == nullptr || tokens == nullptr) {
    return absl::InvalidArgumentError("sampled ids: a required pointer is null");
  }
  SampledIdsToTokensKernel<<<(rows + 255) / 256, 256, 0, stream>>>(ids, source_rows, rows, tokens);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
