#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

// One CTA per row. The k-th value (top-k) and the nucleus boundary (top-p) are found by radix
// select over order-preserving 32-bit keys of the scaled logits (4 passes of 8 bits; counts for
// top-k, fixed-point probability mass for top-p); ties at a boundary are resolved by a second
// radix select over the ids, so the kept set is exactly the CPU twin's prefix of the order
// (logit desc, id asc). The draw walks the kept tokens in a fixed order (thread-major), which
// samples the same distribution as walking them sorted.
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t OrderKey(float x) {
  if (x != x) return 0u;  // NaN ranks lowest
  if (x == 0.f) x = 0.f;  // -0 == +0
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyValue(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ uint64_t Mix64(uint64_t z) {  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct RowState {
  const float* x;
  int vocab;
  float inv_t;
  float xmax;
  // Kept set: key > k_cut, or key == k_cut and id <= id_cut (top-k), intersected likewise with
  // the top-p cut.
  uint32_t k_cut, k_id_cut, p_cut, p_id_cut;
};

__device__ __forceinline__ uint32_t KeyAt(const RowState& s, int i) {
  return OrderKey(s.x[i] * s.inv_t);
}
__device__ __forceinline__ uint64_t MassOfKey(const RowState& s, uint32_t key) {
  const float p = expf(KeyValue(key) - s.xmax);  // <= 1
  return static_cast<uint64_t>(p * 4294967296.0f);
}
__device__ __forceinline__ bool InTopK(const RowState& s, uint32_t key, int i) {
  return key > s.k_cut || (key == s.k_cut && uint32_t(i) <= s.k_id_cut);
}
__device__ __forceinline__ bool Kept(const RowState& s, uint32_t key, int i) {
  return InTopK(s, key, i) && (key > s.p_cut || (key == s.p_cut && uint32_t(i) <= s.p_id_cut));
}

__device__ uint64_t BlockSum64(uint64_t v, uint64_t* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

struct Selected {
  uint32_t key;     // the boundary key
  uint64_t above;   // weight of keys > key
  uint64_t at;      // weight of keys == key
};

// Radix select, descending: the key K with weight(> K) < target <= weight(>= K) among elements
// where filter(i, key) holds. `key_of(i)` gives the 32-bit key, `weight(i, key)` its weight.
// Precondition: 1 <= target <= total weight.
template <typename KeyOf, typename Filter, typename Weight>
__device__ Selected RadixSelectDesc(int n, uint64_t target, KeyOf key_of, Filter filter,
                                    Weight weight, uint64_t* hist, uint64_t* scratch) {
  uint32_t prefix = 0, hi_mask = 0;
  uint64_t above = 0, at = 0;
  __shared__ uint32_t s_digit;
  __shared__ uint64_t s_above, s_at;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint32_t k = key_of(i);
      if ((k & hi_mask) == prefix && filter(i, k)) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&hist[(k >> shift) & 255u]),
                  static_cast<unsigned long long>(weight(i, k)));
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L owns bins 255-8L down to 248-8L; an exclusive scan of lane sums from lane 0.
      const int lane = threadIdx.x;
      uint64_t local = 0;
      for (int j = 0; j < 8; ++j) local += hist[255 - 8 * lane - j];
      uint64_t incl = local;
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      uint64_t before = above + incl - local;
      int found = -1;
      uint64_t found_before = 0, found_at = 0;
      for (int j = 0; j < 8 && found < 0; ++j) {
        const int b = 255 - 8 * lane - j;
        if (before + hist[b] >= target) {
          found = b;
          found_before = before;
          found_at = hist[b];
        }
        before += hist[b];
      }
      const uint32_t has = __ballot_sync(0xffffffffu, found >= 0);
      const int winner = has ? __ffs(has) - 1 : 31;
      if (lane == winner) {
        // No bin reaches the target only if the precondition failed: take the lowest bin.
        s_digit = found >= 0 ? uint32_t(found) : 0u;
        s_above = found >= 0 ? found_before : before - hist[0];
        s_at = found >= 0 ? found_at : hist[0];
      }
    }
    __syncthreads();
    prefix |= s_digit << shift;
    hi_mask |= 255u << shift;
    above = s_above;
    at = s_at;
    __syncthreads();
  }
  (void)scratch;
  return Selected{prefix, above, at};
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* logits, int64_t row_stride, int vocab,
                 const SamplingRowParams* params, int32_t* out_ids) {
  __shared__ uint64_t hist[256];
  __shared__ uint64_t scratch[kWarps];
  __shared__ uint64_t s_best;
  const SamplingRowParams sp = params[blockIdx.x];
  RowState s;
  s.x = logits + blockIdx.x * row_stride;
  s.vocab = vocab;
  const bool greedy = !(sp.temperature > 0.f);
  s.inv_t = greedy ? 1.f : 1.0f / sp.temperature;

  // Argmax of the (scaled) logits: max of (key << 32 | ~id), so ties go to the lowest id.
  uint64_t best = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint64_t packed = (uint64_t(KeyAt(s, i)) << 32) | uint32_t(~uint32_t(i));
    best = packed > best ? packed : best;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t v = __shfl_xor_sync(0xffffffffu, best, o);
    best = v > best ? v : best;
  }
  if (threadIdx.x == 0) s_best = 0;
  __syncthreads();
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<unsigned long long*>(&s_best), best);
  __syncthreads();
  best = s_best;
  const int32_t argmax = int32_t(~uint32_t(best));
  if (greedy || sp.top_k == 1) {
    if (threadIdx.x == 0) out_ids[blockIdx.x] = argmax;
    return;
  }
  s.xmax = KeyValue(uint32_t(best >> 32));
  s.k_cut = 0;
  s.k_id_cut = 0xffffffffu;
  s.p_cut = 0;
  s.p_id_cut = 0xffffffffu;

  auto key_of = [&](int i) { return KeyAt(s, i); };
  auto id_key = [&](int i) { return ~uint32_t(i); };  // descending ~id == ascending id
  auto one = [](int, uint32_t) { return uint64_t{1}; };

  if (sp.top_k > 0 && sp.top_k < vocab) {
    const Selected sel = RadixSelectDesc(
        vocab, uint64_t(sp.top_k), key_of, [](int, uint32_t) { return true; }, one, hist,
        scratch);
    s.k_cut = sel.key;
    const uint64_t need = uint64_t(sp.top_k) - sel.above;  // ties to keep, lowest ids first
    if (need < sel.at) {
      const uint32_t cut = sel.key;
      const Selected ids = RadixSelectDesc(
          vocab, need, id_key, [&](int i, uint32_t) { return KeyAt(s, i) == cut; }, one, hist,
          scratch);
      s.k_id_cut = ~ids.key;
    }
  }

  if (sp.top_p < 1.f) {
    uint64_t z = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t k = KeyAt(s, i);
      if (InTopK(s, k, i)) z += MassOfKey(s, k);
    }
    z = BlockSum64(z, scratch);
    double t = ceil(double(sp.top_p) * double(z));
    uint64_t target = t < 1.0 ? 1 : (t > double(z) ? z : uint64_t(t));
    const Selected sel = RadixSelectDesc(
        vocab, target, key_of, [&](int i, uint32_t k) { return InTopK(s, k, i); },
        [&](int, uint32_t k) { return MassOfKey(s, k); }, hist, scratch);
    s.p_cut = sel.key;
    const uint64_t each = MassOfKey(s, sel.key);
    if (each > 0) {
      const uint64_t need_mass = target - sel.above;
      const uint64_t need = (need_mass + each - 1) / each;
      const uint64_t ties = sel.at / each;
      if (need < ties) {
        const uint32_t cut = sel.key;
        const Selected ids = RadixSelectDesc(
            vocab, need, id_key,
            [&](int i, uint32_t) {
              const uint32_t k = KeyAt(s, i);
              return k == cut && InTopK(s, k, i);
            },
            one, hist, scratch);
        s.p_id_cut = ~ids.key;
      }
    }
  }

  // Draw: thread-major order over the interleaved ids; exclusive scan of the thread sums.
  uint64_t mine = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const uint32_t k = KeyAt(s, i);
    if (Kept(s, k, i)) mine += MassOfKey(s, k);
  }
  uint64_t incl = mine;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  __shared__ uint64_t warp_total[kWarps];
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  uint64_t warp_before = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) warp_before += warp_total[w];
    total += warp_total[w];
  }
  const uint64_t before = warp_before + incl - mine;
  const uint64_t u = Mix64(sp.seed ^ Mix64(sp.offset + 0x9e3779b97f4a7c15ull));
  const uint64_t r = __umul64hi(u, total);  // uniform in [0, total)
  if (threadIdx.x == 0) s_best = uint64_t(uint32_t(argmax));  // fallback (total == 0)
  __syncthreads();
  if (mine > 0 && before <= r && r < before + mine) {
    uint64_t acc = before;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t k = KeyAt(s, i);
      if (!Kept(s, k, i)) continue;
      acc += MassOfKey(s, k);
      if (r < acc) {
        s_best = uint64_t(uint32_t(i));
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) out_ids[blockIdx.x] = int32_t(uint32_t(s_best));
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

absl::Status SampleTokensCuda(const float* logits, int64_t row_stride, int rows, int vocab,
                              const SamplingRowParams* params, int32_t* out_ids,
                              cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || row_stride < vocab) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: rows ", rows, ", vocab ", vocab,
                                                   ", row_stride ", row_stride));
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || params == nullptr || out_ids == nullptr) {
    return absl::InvalidArgumentError("sampling: a required pointer is null");
  }
  SampleKernel<<<rows, kThreads, 0, stream>>>(logits, row_stride, vocab, params, out_ids);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
