#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling_cluster.cuh"

#include <cooperative_groups.h>

namespace lazyattn {
namespace {

using namespace sampling_internal;  // NOLINT: the kernel's own building blocks

constexpr int kMaxSliceBytes = 200 * 1024;
constexpr int kGroup = kSamplingGroup;
constexpr int kLoadBatch = 4;  // 16-byte loads in flight per thread while loading a slice
constexpr int kLanesPerGroup = 4;  // lanes that share a draw group in the draw pass
constexpr int kGroupsPerWarp = 32 / kLanesPerGroup;
constexpr int kFloat4PerLane = kGroup / 4 / kLanesPerGroup;
static_assert(kGroup == 4 * 32, "a draw group is one warp's float4s");

// Three CTAs an SM (40 registers, 3 x 69 KB of shared memory with the carveout at its maximum):
// with two, 30 clusters fit the H200 at once and a 32-row step took two waves.
__global__ void __launch_bounds__(kThreads, 3)
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
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const bool greedy = SamplingIsGreedy(p);
  const bool want_logprob = (p.flags & kSampleLogprob) && args.out_logprobs != nullptr;
  const float inv_t = greedy ? 1.f : 1.f / p.temperature;
  // A sampled row without log-probabilities keeps its scaled logits y = SamplingScaled(x, inv_t)
  // in shared memory (NaN as -inf, clamped), converted once while loading, and its slice is
  // padded to whole draw groups with -inf (weight 0, ranked after every id). Other rows keep
  // the raw logits (greedy: the raw order; log-probabilities: the T = 1 values) and scale on
  // use; `scale` is what turns a stored value into y either way.
  const bool prescaled = !greedy && !want_logprob;
  const float scale = prescaled ? 1.f : inv_t;
  auto stored = [&](float raw) { return prescaled ? ScaledNoBranch(raw, inv_t) : raw; };

  // Load the slice with 16-byte loads, kLoadBatch in flight per thread.
  const bool vec = args.row_stride % 4 == 0 && reinterpret_cast<uintptr_t>(args.logits) % 16 == 0;
  const int n4 = vec ? n / 4 : 0;
  for (int q0 = threadIdx.x; q0 < n4; q0 += kThreads * kLoadBatch) {
    float4 v[kLoadBatch];
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const int q = q0 + k * kThreads;
      if (q < n4) v[k] = __ldg(reinterpret_cast<const float4*>(x) + q);
    }
    if (prescaled) {
#pragma unroll
      for (int k = 0; k < kLoadBatch; ++k) {
        v[k] = make_float4(ScaledNoBranch(v[k].x, inv_t), ScaledNoBranch(v[k].y, inv_t),
                           ScaledNoBranch(v[k].z, inv_t), ScaledNoBranch(v[k].w, inv_t));
      }
    }
#pragma unroll
    for (int k = 0; k < kLoadBatch; ++k) {
      const int q = q0 + k * kThreads;
      if (q < n4) reinterpret_cast<float4*>(xs)[q] = v[k];
    }
  }
  for (int j = 4 * n4 + threadIdx.x; j < n; j += kThreads) xs[j] = stored(x[j]);
  const int padded = (n + kGroup - 1) / kGroup * kGroup;
  if (prescaled) {
    for (int j = n + threadIdx.x; j < padded; j += kThreads) xs[j] = -INFINITY;
  }
  __syncthreads();
  // Bias and penalties, on this CTA's ids, from the raw logits (global memory: the stored values
  // may be scaled already).
  if (AdjustsLogits(p)) {
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
        xs[pe.id - begin] = stored(PenalizedLogit(x[pe.id - begin], p, pe, extra));
      }
    }
    seen = __syncthreads_or(seen);
    if (threadIdx.x == 0 && input >= 0 && !seen && input >= begin && input < begin + n) {
      xs[input - begin] = stored(PenalizedLogit(x[input - begin], p, PenaltyEntry{.id = input}, 1));
    }
    __syncthreads();
  }

  const bool top_k = p.top_k > 0 && p.top_k < V;
  int phase = 0;

  // The max pass: the top of the row's order (greedy: raw values, NaN lowest; sampled: y, the
  // fallback after kMaxSamplingRounds), the max y, the max value at T = 1 (raw rows only).
  // Sampled rows need it only for min-p's threshold; their draw pass finds its own maxima.
  int argmax = 0;
  float m = -INFINITY, m1 = -INFINITY;
  bool have_max = false;
  auto max_pass = [&] {
    uint64_t best = 0;
    float mm = -INFINITY, mm1 = -INFINITY;
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float v = xs[j];
      const float y = SamplingScaled(v, scale);
      const uint64_t k = Rank(greedy ? v : y, begin + j);
      best = k > best ? k : best;
      mm = fmaxf(mm, y);
      if (!prescaled) mm1 = fmaxf(mm1, SamplingScaled(v, 1.f));
    }
    const Reduced r1 = ClusterReduce(cluster, sh, phase, best, mm, Op::kMax, mm1, Op::kMax);
    argmax = int(~uint32_t(r1.key));
    m = r1.a;
    m1 = r1.b;
    have_max = true;
  };
  if (greedy || p.min_p > 0.f) max_pass();
  int chosen = argmax;
  float z1 = 0;  // sum of exp(x - m1) (logprobs)
  bool have_z1 = false;

  if (!greedy && (!have_max || m > -INFINITY)) {
    const uint64_t t_k = top_k ? TopKThreshold(cluster, sh, phase, xs, n, begin, scale, p.top_k)
                               : 0;
    const float min_y = p.min_p > 0.f ? m + logf(p.min_p) : -INFINITY;
    // Membership of the current set: top-k, min-p, and ranked above the last rejected draw.
    uint64_t lower = 0;
    float y_low = INFINITY;  // the last rejected draw (c_low) and its y
    int c_low = 0;
    auto member = [&](float y, int id) {
      const uint64_t rk = Rank(y, id);
      return rk >= t_k && rk > lower && y >= min_y;
    };
    const int groups = (n + kGroup - 1) / kGroup;
    const int first_group = begin / kGroup;
    float z_k = 0;
    chosen = -1;
    for (uint32_t round = 0; round < uint32_t(kMaxSamplingRounds); ++round) {
      const bool first = round == 0;
      // Round 0 also sums the top-k mass (the current set itself unless min-p cuts it; else
      // relative to the known maximum) and the T = 1 softmax (logprobs).
      const bool sum_k_apart = first && p.top_p < 1.f && p.min_p > 0.f;
      const bool sum_1 = first && want_logprob;
      // Without top-k and min-p the set is "ranked before the last rejected draw" (everything in
      // round 0, padding -inf included: weight 0): a compare of stored values, no ranks.
      const bool plain = prescaled && !top_k && !(p.min_p > 0.f);
      // Draw by groups (see the file comment): per group of 128 ids, its log-sum-exp over the
      // set plus one Gumbel noise; the largest wins. Four lanes take a group (32 ids each, a
      // warp 8 groups at once), so the per-group work (Philox, logarithms, the key) runs on 8
      // lanes in parallel instead of once per warp, and the quad's reductions are 2 shuffles.
      // A lane reads its float4s rotated by the group's slot, so the 8 groups of a warp's load
      // fall on distinct banks.
      DrawResult mine;
      float k_apart = 0;
      const int sub = lane % kLanesPerGroup, slot = lane / kLanesPerGroup;
      for (int g0 = warp * kGroupsPerWarp; g0 < groups; g0 += kWarps * kGroupsPerWarp) {
        const int g = g0 + slot;
        const bool active = g < groups;  // lanes past the last group still shuffle
        const float4* group4 = reinterpret_cast<const float4*>(xs) + g * (kGroup / 4);
        // The k-th float4 of this lane: its position in the group, and the values.
        auto at = [&](int k) { return (4 * k + sub + 4 * slot) % (kGroup / 4); };
        auto load = [&](int k) {
          return active ? group4[at(k)] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        };
        // Stored value -> (y, in the set); `valid` ids are inside the slice.
        auto classify = [&](float v, int local, float& y) {
          if (plain) {
            y = v;
            return first || v > y_low || (v == y_low && begin + local < c_low);
          }
          y = SamplingScaled(v, scale);
          return local < n && member(y, begin + local);
        };
        float gm = -INFINITY, g1 = -INFINITY;
        float s = 0, s1 = 0;
        if (plain && first) {
          // Round 0 of a plain row: every stored value is in the set (padding -inf).
#pragma unroll
          for (int k = 0; k < kFloat4PerLane; ++k) {
            const float4 v4 = load(k);
            gm = fmaxf(gm, fmaxf(fmaxf(v4.x, v4.y), fmaxf(v4.z, v4.w)));
          }
          gm = QuadMax(gm);
          const float ref = gm > -INFINITY ? gm : 0.f;
#pragma unroll
          for (int k = 0; k < kFloat4PerLane; ++k) {
            const float4 v4 = load(k);
            s += (Exp(v4.x - ref) + Exp(v4.y - ref)) + (Exp(v4.z - ref) + Exp(v4.w - ref));
          }
          s = QuadSum(s);
        } else if (plain) {
          // A later round of a plain row: the ids ranked before the last rejected draw.
          auto kept = [&](float v, int local) {
            return v > y_low || (v == y_low && begin + local < c_low) ? v : -INFINITY;
          };
#pragma unroll
          for (int k = 0; k < kFloat4PerLane; ++k) {
            const float4 v4 = load(k);
            const int local = g * kGroup + 4 * at(k);
            gm = fmaxf(gm, fmaxf(fmaxf(kept(v4.x, local), kept(v4.y, local + 1)),
                                 fmaxf(kept(v4.z, local + 2), kept(v4.w, local + 3))));
          }
          gm = QuadMax(gm);
          const float ref = gm > -INFINITY ? gm : 0.f;
#pragma unroll
          for (int k = 0; k < kFloat4PerLane; ++k) {
            const float4 v4 = load(k);
            const int local = g * kGroup + 4 * at(k);
            s += (Exp(kept(v4.x, local) - ref) + Exp(kept(v4.y, local + 1) - ref)) +
                 (Exp(kept(v4.z, local + 2) - ref) + Exp(kept(v4.w, local + 3) - ref));
          }
          s = QuadSum(s);
        } else {
#pragma unroll 4
        for (int k = 0; k < kFloat4PerLane; ++k) {
          const float4 v4 = load(k);
          const float v[4] = {v4.x, v4.y, v4.z, v4.w};
          const int local = g * kGroup + 4 * at(k);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float y;
            if (classify(v[j], local + j, y)) gm = fmaxf(gm, y);
            if (!plain && active && local + j < n) {
              if (sum_1) g1 = fmaxf(g1, SamplingScaled(v[j], 1.f));
              if (sum_k_apart && Rank(y, begin + local + j) >= t_k) k_apart += Exp(y - m);
            }
          }
        }
        gm = QuadMax(gm);
        if (sum_1) g1 = QuadMax(g1);
#pragma unroll 4
        for (int k = 0; k < kFloat4PerLane; ++k) {
          const float4 v4 = load(k);
          const float v[4] = {v4.x, v4.y, v4.z, v4.w};
          const int local = g * kGroup + 4 * at(k);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float y;
            if (classify(v[j], local + j, y) && gm > -INFINITY) s += Exp(y - gm);
            if (sum_1 && active && local + j < n && g1 > -INFINITY) {
              s1 += Exp(SamplingScaled(v[j], 1.f) - g1);
            }
          }
        }
        s = QuadSum(s);
        if (sum_1) s1 = QuadSum(s1);
        }
        if (active && sub == 0 && gm > -INFINITY) {
          const int group = first_group + g;
          const Philox4 bits = SamplingBits(p.seed, p.step, round, uint32_t(group));
          const uint64_t key = Rank(SamplingGroupKey(gm, s, bits.v[0]), group);
          mine.key = key > mine.key ? key : mine.key;
          if (first) mine.k = Merge(mine.k, SoftSum{gm, s});
        }
        if (sum_1 && active && sub == 0 && g1 > -INFINITY) {
          mine.one = Merge(mine.one, SoftSum{g1, s1});
        }
      }
      // The quads' first lanes carry the groups' results; k_apart is a per-lane sum.
      if (sum_k_apart) {
        const float warp_k = WarpSum(k_apart);
        mine.k = lane == 0 ? SoftSum{m, warp_k} : SoftSum{};
      }
      const DrawResult rd = DrawReduce(cluster, sh, phase, mine);
      if (first) {
        if (!sum_k_apart) m = rd.k.m;  // the largest scaled value of the set (top-k keeps it)
        z_k = rd.k.z;
        if (sum_1) m1 = rd.one.m, z1 = rd.one.z, have_z1 = true;
      }
      if (rd.key == 0) break;  // nothing left (cannot happen while the top token is in the set)
      // The draw inside the winning group: every CTA computes it from the owner's shared
      // memory (the same values, the same order), so no further exchange is needed.
      const int group = int(~uint32_t(rd.key));
      if (warp == 0) {
        const int start = group * kGroup, owner = start / slice;
        const int owner_n = min(slice, V - owner * slice);
        const int local = start - owner * slice + 4 * lane;
        const float4 v4 =
            reinterpret_cast<const float4*>(cluster.map_shared_rank(xs, owner))[local / 4];
        const float v[4] = {v4.x, v4.y, v4.z, v4.w};
        float y[4], w[4];
        bool in[4];
        float gm = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          y[j] = SamplingScaled(v[j], scale);
          in[j] = local + j < owner_n && member(y[j], start + 4 * lane + j);
          if (in[j]) gm = fmaxf(gm, y[j]);
        }
        gm = WarpMax(gm);
        float mine_sum = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) mine_sum += w[j] = in[j] ? Exp(y[j] - gm) : 0.f;
        float inclusive = mine_sum;
        for (int o = 1; o < 32; o <<= 1) {
          const float t = __shfl_up_sync(0xffffffffu, inclusive, o);
          if (lane >= o) inclusive += t;
        }
        const float total = __shfl_sync(0xffffffffu, inclusive, 31);
        const Philox4 bits = SamplingBits(p.seed, p.step, round, uint32_t(group));
        const float target = SamplingUniform(bits.v[1]) * total;
        // The first id whose running sum passes the target; if rounding leaves none, the last
        // id with weight (every id with weight is in the set).
        float cum = inclusive - mine_sum;
        int pick = -1, last = -1;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (w[j] > 0.f) {
            cum += w[j];
            last = j;
            if (pick < 0 && cum > target) pick = j;
          }
        }
        const uint32_t picked = __ballot_sync(0xffffffffu, pick >= 0);
        const uint32_t any = __ballot_sync(0xffffffffu, last >= 0);
        // (`any` is never empty: the group's maximum has weight 1.)
        const int from = picked ? __ffs(picked) - 1 : any ? 31 - __clz(any) : 0;
        const int j = max(0, __shfl_sync(0xffffffffu, picked ? pick : last, from));
        if (lane == from) {
          sh.pick_id = uint32_t(start + 4 * from + j);
          sh.pick_y = j == 0 ? y[0] : j == 1 ? y[1] : j == 2 ? y[2] : y[3];  // no local array
        }
      }
      __syncthreads();
      const int c = int(sh.pick_id);
      const float y_c = sh.pick_y;
      if (!(p.top_p < 1.f)) {
        chosen = c;
        break;
      }
      // Top-p: accept c when the top-k mass ranked before it is below top_p of the top-k mass.
      // Ranked before c: a larger y, or an equal one with a lower id (y is never NaN).
      float mass = 0;
      if (prescaled && !top_k) {
        for (int q = threadIdx.x; q < padded / 4; q += kThreads) {
          const float4 v4 = reinterpret_cast<const float4*>(xs)[q];
          const float v[4] = {v4.x, v4.y, v4.z, v4.w};
          // Ids below c (ties at y_c count for them only): the first `below` of this float4.
          const int below = c - (begin + 4 * q);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float e = Exp(v[j] - m);
            mass += v[j] > y_c ? e : 0.f;
            mass += v[j] == y_c && j < below ? e : 0.f;
          }
        }
      } else {
        const uint64_t rc = Rank(y_c, c);
        for (int j = threadIdx.x; j < n; j += kThreads) {
          const float y = SamplingScaled(xs[j], scale);
          const uint64_t rk = Rank(y, begin + j);
          if (rk >= t_k && rk > rc) mass += Exp(y - m);
        }
      }
      Reduced rm = ClusterReduce(cluster, sh, phase, 0, mass, Op::kSum, 0.f, Op::kSum);
      if (rm.a < p.top_p * z_k) {
        chosen = c;
        break;
      }
      lower = Rank(y_c, c);
      y_low = y_c, c_low = c;
    }
    if (chosen < 0) {  // uniform over the cluster: every value above is a cluster result
      if (!have_max) max_pass();
      chosen = argmax;
    }
  }
  if (want_logprob && !have_z1) {
    if (!have_max) max_pass();
    float z = 0;
    for (int j = threadIdx.x; j < n; j += kThreads) z += Exp(SamplingScaled(xs[j], 1.f) - m1);
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

}  // namespace

int SamplingClusterSize(int vocab) {
  int c = 1;
  while (c < kMaxCluster && (int64_t(vocab) + c - 1) / c * 4 > 16 * 1024) c *= 2;
  return c;
}

namespace {

// Shared memory of one CTA of the sampler for `vocab` ids: its slice, whole draw groups so that
// no group straddles two CTAs.
int64_t SliceBytes(int64_t vocab) {
  const int cluster = SamplingClusterSize(static_cast<int>(std::min<int64_t>(vocab, INT32_MAX)));
  const int64_t slice = ((vocab + cluster - 1) / cluster + kGroup - 1) / kGroup * kGroup;
  return slice * static_cast<int64_t>(sizeof(float));
}

}  // namespace

bool SampleRowsCudaSupports(int64_t vocab) {
  return vocab > 0 && vocab <= INT32_MAX && SliceBytes(vocab) <= kMaxSliceBytes;
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
  if (!SampleRowsCudaSupports(a.vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling: vocabulary of ", a.vocab, " ids is past what ", kMaxCluster,
                     " CTAs' shared memory holds"));
  }
  const size_t smem = static_cast<size_t>(SliceBytes(a.vocab));
  const int slice = static_cast<int>(smem / sizeof(float));
  // Raised once per device and size (a replayed graph's capture then sets nothing).
  static std::atomic<int> raised[64];
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  if (device < 0 || device >= 64 || raised[device].load() < int(smem)) {
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(
        SampleRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    // The largest shared-memory carveout: the default picked 168 KB an SM, two CTAs.
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(SampleRowsKernel,
                                              cudaFuncAttributePreferredSharedMemoryCarveout,
                                              int(cudaSharedmemCarveoutMaxShared)));
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
