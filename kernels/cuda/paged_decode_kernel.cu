// The paged decode attention kernel (paged_decode_attention.h has the contract; the tiling is in
// paged_decode_internal.cuh, docs/kernels.md "Decode attention" has the design): its device
// helpers, the kernel with its in-launch merge of the splits, and its instances. Apart from the
// host side (paged_decode_attention.cu) so that this file holds only what runs on the GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/paged_decode_internal.cuh"
#include "kernels/cuda/split_arrival.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"

namespace lazyattn::decode_internal {
namespace {

template <int D>
struct Traits {
  static constexpr int kChunks = D / 8;              // 16-byte chunks per K/V row
  static constexpr int kTileBytes = kBlockSize * D * 2;
  static constexpr int kRopeBytes = D * 4;           // cos[D/2] and sin[D/2], fp32
  static constexpr int kStageBytes = 2 * kTileBytes + kRopeBytes;
  static constexpr int kSmemBytes = kWarps * kStages * kStageBytes;
  static constexpr int kKSteps = D / 16;
  static constexpr int kQChunks = D / 32;            // chunks of one q row held per lane
  static constexpr int kNTiles = D / 8;              // n-tiles of O = P V
  static constexpr int kMinCtasPerSm = D <= 64 ? 4 : 2;
  static constexpr int kEpilogueStride = D + 4;      // floats per row of the epilogue buffer
};

// 16-byte async copy; src_bytes 0 fills the destination with zeros (slots past `valid`).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// The same with an L2 eviction policy. K/V are streamed once per launch: evicting them first keeps
// the block tables and the cos/sin rows in L2 across launches (measured on the H200, B=1 16K
// without rotation: 26.9 -> 25.5 us; docs/kernels.md).
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t src_bytes,
                                          uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes), "l"(policy));
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float Bf16Lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Q fragments (mma A operand, rows = query heads). Lane (g = lane/4, t = lane%4) owns, of rows g
// and g+8, the dims 32i + 8t + [0, 8) for i < D/32: chunk i feeds k-steps 2i (words 0, 1) and
// 2i+1 (words 2, 3). K's B fragments use the same dim permutation, so the products are exact.
template <int D>
__device__ __forceinline__ void QFragsFromWords(const uint4 (&qw)[2][D / 32],
                                                uint32_t (&qa)[D / 16][4]) {
#pragma unroll
  for (int i = 0; i < D / 32; ++i) {
    qa[2 * i][0] = qw[0][i].x;
    qa[2 * i][1] = qw[1][i].x;
    qa[2 * i][2] = qw[0][i].y;
    qa[2 * i][3] = qw[1][i].y;
    qa[2 * i + 1][0] = qw[0][i].z;
    qa[2 * i + 1][1] = qw[1][i].z;
    qa[2 * i + 1][2] = qw[0][i].w;
    qa[2 * i + 1][3] = qw[1][i].w;
  }
}

// q' = R_{-delta} q from the ORIGINAL q words. cs/sn hold cos/sin of frequencies
// 32i + 8t + e (i < D/64, e < 8): exactly the first-half dims this lane owns; dim x pairs with
// x + D/2, i.e. chunk i with chunk i + D/64 of the same lane.
// Row g+8 is rotated only when the tile has more than 8 query heads (`two_rows`, warp-uniform);
// otherwise it is padding (zeros) and is passed through, which halves the work for GQA <= 8.
template <int D>
__device__ __forceinline__ void RotateQ(const uint4 (&qo)[2][D / 32], const float (&cs)[D / 8],
                                        const float (&sn)[D / 8], bool two_rows,
                                        uint32_t (&qa)[D / 16][4]) {
  constexpr int kHalf = D / 64;
  uint4 qw[2][D / 32];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r == 1 && !two_rows) {
#pragma unroll
      for (int i = 0; i < D / 32; ++i) qw[1][i] = qo[1][i];
      break;
    }
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      uint32_t lo[4], hi[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t a = Word(qo[r][i], w), b = Word(qo[r][i + kHalf], w);
        const float c0 = cs[i * 8 + 2 * w], s0 = sn[i * 8 + 2 * w];
        const float c1 = cs[i * 8 + 2 * w + 1], s1 = sn[i * 8 + 2 * w + 1];
        const float x1a = Bf16Lo(a), x2a = Bf16Lo(b), x1b = Bf16Hi(a), x2b = Bf16Hi(b);
        // Backward rotation: x1' = x1 c + x2 s, x2' = x2 c - x1 s.
        lo[w] = PackBf16(fmaf(x1a, c0, x2a * s0), fmaf(x1b, c1, x2b * s1));
        hi[w] = PackBf16(fmaf(x2a, c0, -x1a * s0), fmaf(x2b, c1, -x1b * s1));
      }
      qw[r][i] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
      qw[r][i + kHalf] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
  }
  QFragsFromWords<D>(qw, qa);
}

// cos/sin of the frequencies 32i + 8t + [0, 8), i < D/64, from rows in global or shared memory.
template <int D>
__device__ __forceinline__ void LoadCosSin(const float* cos_row, const float* sin_row, int t,
                                           float (&cs)[D / 8], float (&sn)[D / 8]) {
#pragma unroll
  for (int i = 0; i < D / 64; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 c4 = *reinterpret_cast<const float4*>(cos_row + 32 * i + 8 * t + 4 * h);
      const float4 s4 = *reinterpret_cast<const float4*>(sin_row + 32 * i + 8 * t + 4 * h);
      cs[i * 8 + 4 * h + 0] = c4.x, cs[i * 8 + 4 * h + 1] = c4.y;
      cs[i * 8 + 4 * h + 2] = c4.z, cs[i * 8 + 4 * h + 3] = c4.w;
      sn[i * 8 + 4 * h + 0] = s4.x, sn[i * 8 + 4 * h + 1] = s4.y;
      sn[i * 8 + 4 * h + 2] = s4.z, sn[i * 8 + 4 * h + 3] = s4.w;
    }
  }
}

template <int D, bool kRotate>
__global__ void __launch_bounds__(kThreads, Traits<D>::kMinCtasPerSm)
    PagedDecodeKernel(const KernelParams p) {
  // Launched overlapped (launch_overlap.cuh): wait for the kernel before, then let the next one
  // launch. With early_kv_loads a warp first issues the copies of its first blocks when none of
  // them is its sequence's last block (the only one the kernel before may be writing).
  bool waited = false;
  auto wait_for_prerequisite = [&] {
    if (waited) return;
    waited = true;
    WaitForPrerequisiteGrid();
    AllowDependentLaunch();  // the o projection may then load its weights during the merge
  };
  if (!p.early_kv_loads) wait_for_prerequisite();
  using T = Traits<D>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int seq = blockIdx.z;
  const int kv_head = blockIdx.y / p.head_tiles, tile = blockIdx.y % p.head_tiles;
  const int split = blockIdx.x;

  const int nb = min(max(p.num_blocks[seq], 0), p.max_blocks);
  const int seq_splits = max(1, (nb + p.blocks_per_split - 1) / p.blocks_per_split);
  if (split >= seq_splits) {
    wait_for_prerequisite();  // so this grid never completes before the kernel it follows
    return;
  }
  const int blk_begin = split * p.blocks_per_split;
  const int blk_end = min(nb, blk_begin + p.blocks_per_split);
  const int rows = min(kRowsPerTile, p.group - tile * kRowsPerTile);
  const bool two_rows = rows > 8;
  const int head0 = kv_head * p.group + tile * kRowsPerTile;

  // Original q (bf16 words), rows g and g+8 of the tile; zero for rows past the group. Read
  // after the wait below: the kernel before writes it, so with a coherent load (ld.global.cg),
  // not the read-only path: an `ld.global.nc` promises data that stays unchanged for the whole
  // launch, which q, written by the overlapped kernel before, is not, and the compiler may then
  // schedule it ahead of the wait (runner tests read a stale q when the load directly followed
  // the wait).
  uint4 qo[2][T::kQChunks];
  auto load_q = [&] {
    const __nv_bfloat16* qb = p.q + (int64_t(seq) * p.num_heads + head0) * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
#pragma unroll
      for (int i = 0; i < T::kQChunks; ++i) {
        qo[r][i] = row < rows
                       ? __ldcg(reinterpret_cast<const uint4*>(qb + row * D + 32 * i + 8 * t))
                       : make_uint4(0, 0, 0, 0);
      }
    }
  };
  uint32_t qa[T::kKSteps][4];

  float o[T::kNTiles][4];
#pragma unroll
  for (int n = 0; n < T::kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // This warp's blocks: blk_begin + warp + kWarps * k, k < nk.
  const int first = blk_begin + warp;
  const int nk = first < blk_end ? (blk_end - first + kWarps - 1) / kWarps : 0;
  const KvBlockEntry* table = p.tables + int64_t(seq) * p.max_blocks;
  uint8_t* ring = smem + warp * kStages * T::kStageBytes;
  const int64_t head_stride = int64_t(kBlockSize) * D;  // elements per (block, kv head) tile
  const int64_t block_stride = head_stride * p.num_kv_heads;

  // Block-table entries come 32 at a time (one coalesced load per warp), handed out by shuffles.
  uint64_t win_issue = 0, win_compute = 0;
  uint32_t issued_delta = kNoDelta, cur_delta = kNoDelta;
  int issue_stage = 0;
  const uint64_t kv_policy = EvictFirstPolicy();

  auto load_window = [&](int kk) {
    const int idx = kk + lane;
    win_issue = idx < nk ? __ldg(reinterpret_cast<const unsigned long long*>(table) + first +
                                 int64_t(kWarps) * idx)
                         : 0ull;
  };
  auto issue = [&](int kk) {
    if (kk < nk) {
      if ((kk & 31) == 0 && kk > 0) load_window(kk);  // the first window is loaded up front
      const uint64_t e = __shfl_sync(0xffffffffu, win_issue, kk & 31);
      const uint32_t valid = KvEntryValid(e);
      const int64_t off = int64_t(KvEntryBlock(e)) * block_stride + kv_head * head_stride;
      const uint8_t* ksrc = reinterpret_cast<const uint8_t*>(p.k_pool + off);
      const uint8_t* vsrc = reinterpret_cast<const uint8_t*>(p.v_pool + off);
      uint8_t* st = ring + issue_stage * T::kStageBytes;
      const uint32_t kdst = SmemAddr(st), vdst = kdst + T::kTileBytes;
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        const int lin = c * 32 + lane;
        const int row = lin / T::kChunks, chunk = lin % T::kChunks;
        const uint32_t bytes = row < int(valid) ? 16u : 0u;
        CpAsync16(kdst + row * (D * 2) + ((chunk ^ ((row & 1) << 2)) << 4), ksrc + lin * 16,
                  bytes, kv_policy);
        CpAsync16(vdst + row * (D * 2) + ((chunk ^ (((row >> 1) & 3) << 1)) << 4),
                  vsrc + lin * 16, bytes, kv_policy);
      }
      if (kRotate) {
        // A block whose delta differs from the previous one brings its cos/sin row along in the
        // same copy group (the first block's row is loaded before the first copies instead).
        const uint32_t delta = KvEntryDelta(e);
        if (delta != issued_delta) {
          issued_delta = delta;
          const int64_t pos = min(int64_t(delta), p.rope_max_positions - 1);
          // cos row then sin row, D/2 floats each: D/4 chunks. Delta 0 needs none (q' = q).
          if (kk > 0 && delta != 0 && lane < D / 4) {
            const float* src = lane < D / 8 ? p.rope_cos + pos * (D / 2) + lane * 4
                                            : p.rope_sin + pos * (D / 2) + (lane - D / 8) * 4;
            CpAsync16(vdst + T::kTileBytes + lane * 16, src, 16u);
          }
        }
      }
    }
    CpAsyncCommit();  // possibly empty: keeps the group count uniform for wait_group
    issue_stage = issue_stage + 1 == kStages ? 0 : issue_stage + 1;
  };

  // The first block's cos/sin row is requested as soon as its table entry is in, before the
  // first copies are issued, and the rotation follows them: it overlaps the first loads. A block
  // at delta 0 (the request's own tokens, a document at offset 0) needs no rotation: R_0 q = q.
  load_window(0);
  float cs0[D / 8], sn0[D / 8];
  if (kRotate && nk > 0) {
    cur_delta = KvEntryDelta(__shfl_sync(0xffffffffu, win_issue, 0));
    const int64_t pos = min(int64_t(cur_delta), p.rope_max_positions - 1);
    if (cur_delta != 0) {
      LoadCosSin<D>(p.rope_cos + pos * (D / 2), p.rope_sin + pos * (D / 2), t, cs0, sn0);
    }
  }
  // Blocks first + kWarps * s, s < kStages - 1, are the first copies; the last block of the
  // sequence is nb - 1. Without early copies q is requested first, so that its round trip runs
  // while the copies are issued and the first rotation can start sooner.
  const bool early = p.early_kv_loads && first + kWarps * (kStages - 2) < nb - 1;
  if (!early) {
    wait_for_prerequisite();
    load_q();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  if (early) {
    wait_for_prerequisite();
    load_q();
  }
  if (kRotate && nk > 0 && cur_delta != 0) {
    RotateQ<D>(qo, cs0, sn0, two_rows, qa);
  } else {
    QFragsFromWords<D>(qo, qa);
  }

  int stage = 0;
  for (int k = 0; k < nk; ++k) {
    issue(k + kStages - 1);
    CpAsyncWait<kStages - 1>();
    __syncwarp();
    if ((k & 31) == 0) win_compute = win_issue;
    const uint64_t e = __shfl_sync(0xffffffffu, win_compute, k & 31);
    const int valid = int(KvEntryValid(e));
    const uint8_t* st = ring + stage * T::kStageBytes;

    if (kRotate) {
      const uint32_t delta = KvEntryDelta(e);
      if (delta != cur_delta) {  // warp-uniform; once per document per warp
        cur_delta = delta;
        if (delta == 0) {
          QFragsFromWords<D>(qo, qa);  // no cos/sin row came with this block (see issue)
        } else {
          float cs[D / 8], sn[D / 8];
          const float* rc = reinterpret_cast<const float*>(st + 2 * T::kTileBytes);
          LoadCosSin<D>(rc, rc + D / 2, t, cs, sn);
          RotateQ<D>(qo, cs, sn, two_rows, qa);
        }
      }
    }

    // S = Q K^T: n-tile q covers tokens 8q + [0, 8); lane g reads token 8q + g.
    float s[2][4];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      s[q][0] = s[q][1] = s[q][2] = s[q][3] = 0.f;
      const int row = 8 * q + g;
#pragma unroll
      for (int i = 0; i < T::kQChunks; ++i) {
        const int chunk = 4 * i + t;
        const uint4 kv = *reinterpret_cast<const uint4*>(st + row * (D * 2) +
                                                         ((chunk ^ ((row & 1) << 2)) << 4));
        Mma16816(s[q], qa[2 * i], kv.x, kv.y);
        Mma16816(s[q], qa[2 * i + 1], kv.z, kv.w);
      }
    }

    // Online softmax (base 2). Lane holds tokens 2t, 2t+1 (n-tile 0) and 8+2t, 9+2t (n-tile 1)
    // of rows g (c = 0, 1) and g+8 (c = 2, 3).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int token = 8 * q + 2 * t + (c & 1);
        s[q][c] = token < valid ? s[q][c] * p.scale_log2 : -INFINITY;
        mx[c >> 1] = fmaxf(mx[c >> 1], s[q][c]);
      }
    }
    uint32_t pa[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (r == 1 && !two_rows) {
        pa[1] = pa[3] = 0u;
        break;
      }
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      const float ref = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m[r] - ref);
      m[r] = m_new;
      const float p00 = exp2f(s[0][2 * r] - ref), p01 = exp2f(s[0][2 * r + 1] - ref);
      const float p10 = exp2f(s[1][2 * r] - ref), p11 = exp2f(s[1][2 * r + 1] - ref);
      l[r] = l[r] * alpha + (p00 + p01) + (p10 + p11);
#pragma unroll
      for (int n = 0; n < T::kNTiles; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
      pa[r] = PackBf16(p00, p01);      // tokens 2t, 2t+1
      pa[r + 2] = PackBf16(p10, p11);  // tokens 8+2t, 9+2t
    }

    // O += P V. B fragment of n-tile n: V[token][dim(n, g)] with dim(n, x) = 64(n/8) + 8x + n%8;
    // lane reads chunks g (+8) of tokens 2t, 2t+1 (+8) and interleaves pairs of tokens.
    const uint8_t* vs = st + T::kTileBytes;
    uint32_t bv[2][T::kNTiles];
#pragma unroll
    for (int tp = 0; tp < 2; ++tp) {
      const int r0 = 2 * t + 8 * tp;
      const int sw = ((r0 >> 1) & 3) << 1;
#pragma unroll
      for (int h = 0; h < D / 64; ++h) {
        const int phys = ((8 * h + g) ^ sw) << 4;
        const uint4 va = *reinterpret_cast<const uint4*>(vs + r0 * (D * 2) + phys);
        const uint4 vb = *reinterpret_cast<const uint4*>(vs + (r0 + 1) * (D * 2) + phys);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          bv[tp][8 * h + 2 * w] = __byte_perm(Word(va, w), Word(vb, w), 0x5410);
          bv[tp][8 * h + 2 * w + 1] = __byte_perm(Word(va, w), Word(vb, w), 0x7632);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < T::kNTiles; ++n) Mma16816(o[n], pa, bv[0][n], bv[1][n]);

    __syncwarp();  // every lane is done with this stage before it is refilled
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
  CpAsyncWait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }

  // Epilogue 1: combine the 4 warps through shared memory (the rings are free now).
  __syncthreads();
  float* eo = reinterpret_cast<float*>(smem);                    // [warp][16][stride]
  float* em = eo + kWarps * kRowsPerTile * T::kEpilogueStride;  // [warp][16]
  float* el = em + kWarps * kRowsPerTile;                        // [warp][16]
  {
    float* wo = eo + warp * kRowsPerTile * T::kEpilogueStride;
#pragma unroll
    for (int n = 0; n < T::kNTiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int row = g + 8 * (c >> 1);
        const int dim = 64 * (n / 8) + 16 * t + 8 * (c & 1) + (n % 8);
        wo[row * T::kEpilogueStride + dim] = o[n][c];
      }
    }
    if (t == 0) {
      em[warp * kRowsPerTile + g] = m[0];
      el[warp * kRowsPerTile + g] = l[0];
      em[warp * kRowsPerTile + g + 8] = two_rows ? m[1] : -INFINITY;
      el[warp * kRowsPerTile + g + 8] = two_rows ? l[1] : 0.f;
    }
  }
  __syncthreads();

  const int64_t group_id = int64_t(seq) * gridDim.y + blockIdx.y;
  const bool direct = seq_splits == 1;
  float* pout = p.partial_out + (group_id * p.num_splits + split) * (kRowsPerTile * kMaxHeadDim);
  float* plse = p.partial_lse + (group_id * p.num_splits + split) * kRowsPerTile;
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    const int row = idx / D, dim = idx % D;
    float mmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mmax = fmaxf(mmax, em[w * kRowsPerTile + row]);
    const float ref = mmax == -INFINITY ? 0.f : mmax;
    float lsum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(em[w * kRowsPerTile + row] - ref);
      lsum += el[w * kRowsPerTile + row] * f;
      acc += eo[(w * kRowsPerTile + row) * T::kEpilogueStride + dim] * f;
    }
    const float val = lsum > 0.f ? acc / lsum : 0.f;
    if (direct) {
      const int64_t oi = (int64_t(seq) * p.num_heads + head0 + row) * D + dim;
      if (p.out_fp32) {
        static_cast<float*>(p.out)[oi] = val;
      } else {
        static_cast<__nv_bfloat16*>(p.out)[oi] = __float2bfloat16_rn(val);
      }
    } else {
      pout[row * D + dim] = val;
      if (dim == 0) plse[row] = lsum > 0.f ? mmax + log2f(lsum) : -INFINITY;
    }
  }
  if (direct) return;

  // Epilogue 2: the last split of this group to arrive merges all partials.
  __shared__ int is_last;
  __syncthreads();  // then one release, not a fence in every thread (split_arrival.cuh)
  if (threadIdx.x == 0) is_last = ArriveAtSplitCounter(p.counters + group_id, seq_splits);
  __syncthreads();
  if (!is_last) return;
  float* wsplit = reinterpret_cast<float*>(smem);  // [row][split] merge weights
  const float* gl = p.partial_lse + group_id * p.num_splits * kRowsPerTile;
  const float* go = p.partial_out + group_id * p.num_splits * (kRowsPerTile * kMaxHeadDim);
  for (int row = warp; row < rows; row += kWarps) {
    float mmax = -INFINITY;
    for (int s2 = lane; s2 < seq_splits; s2 += 32) {
      mmax = fmaxf(mmax, __ldcg(gl + s2 * kRowsPerTile + row));
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) mmax = fmaxf(mmax, __shfl_xor_sync(0xffffffffu, mmax, x));
    const float ref = mmax == -INFINITY ? 0.f : mmax;
    float wsum = 0.f;
    for (int s2 = lane; s2 < seq_splits; s2 += 32) {
      const float w = exp2f(__ldcg(gl + s2 * kRowsPerTile + row) - ref);
      wsplit[row * kMaxSplits + s2] = w;
      wsum += w;
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, x);
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    __syncwarp();
    for (int s2 = lane; s2 < seq_splits; s2 += 32) wsplit[row * kMaxSplits + s2] *= inv;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * D; idx += kThreads) {
    const int row = idx / D, dim = idx % D;
    float acc = 0.f;
    const float* src = go + row * D + dim;
    int s2 = 0;
    for (; s2 + 4 <= seq_splits; s2 += 4) {
      const float a0 = __ldcg(src + (s2 + 0) * (kRowsPerTile * kMaxHeadDim));
      const float a1 = __ldcg(src + (s2 + 1) * (kRowsPerTile * kMaxHeadDim));
      const float a2 = __ldcg(src + (s2 + 2) * (kRowsPerTile * kMaxHeadDim));
      const float a3 = __ldcg(src + (s2 + 3) * (kRowsPerTile * kMaxHeadDim));
      acc += wsplit[row * kMaxSplits + s2] * a0 + wsplit[row * kMaxSplits + s2 + 1] * a1 +
             wsplit[row * kMaxSplits + s2 + 2] * a2 + wsplit[row * kMaxSplits + s2 + 3] * a3;
    }
    for (; s2 < seq_splits; ++s2) {
      acc += wsplit[row * kMaxSplits + s2] * __ldcg(src + s2 * (kRowsPerTile * kMaxHeadDim));
    }
    const int64_t oi = (int64_t(seq) * p.num_heads + head0 + row) * D + dim;
    if (p.out_fp32) {
      static_cast<float*>(p.out)[oi] = acc;
    } else {
      static_cast<__nv_bfloat16*>(p.out)[oi] = __float2bfloat16_rn(acc);
    }
  }
}

template <int D, bool kRotate>
const KernelInfo& GetKernel() {
  static const KernelInfo info = [] {
    KernelInfo k;
    k.fn = PagedDecodeKernel<D, kRotate>;
    k.smem_bytes = Traits<D>::kSmemBytes;
    static_assert(Traits<D>::kSmemBytes >=
                      (kWarps * Traits<D>::kEpilogueStride + 2 * kWarps) * kRowsPerTile * 4,
                  "epilogue buffer must fit in the rings");
    static_assert(Traits<D>::kSmemBytes >= kRowsPerTile * kMaxSplits * 4,
                  "merge weights must fit in the rings");
    k.error = cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   k.smem_bytes);
    if (k.error == cudaSuccess) {
      k.error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.ctas_per_sm, k.fn, kThreads,
                                                              k.smem_bytes);
    }
    return k;
  }();
  return info;
}

}  // namespace

const KernelInfo& SelectKernel(int head_dim, bool rotate) {
  if (head_dim == 64) return rotate ? GetKernel<64, true>() : GetKernel<64, false>();
  return rotate ? GetKernel<128, true>() : GetKernel<128, false>();
}

}  // namespace lazyattn::decode_internal
