// Paged prefill attention, FlashAttention-2 style on mma.sync m16n8k16 (bf16 in, fp32 accumulate).
//
// CTA = 4 warps = 128 query rows (row = token * group + head-of-group, one KV head); each warp owns
// 32 rows (two m16 tiles) so every K/V fragment read from shared memory feeds two MMAs. K/V tiles
// are 64 keys = 4 table entries, gathered with cp.async (zero-filled past an entry's valid slots),
// double-buffered; the entries of the next-but-one tile ride along with the current copy so the
// gather addresses never wait on a global load. Q, K and V live in XOR-swizzled shared memory
// (16-byte chunk c of row r stored at chunk c ^ (r & 7)): ldmatrix and cp.async are conflict-free.
// Online softmax in the exp2 domain, O rescaled only when a row maximum moved; a split-KV
// schedule plus a merge kernel keeps the chip busy when there are few query tiles.
//
// Deferred rotation (kRotateQ, the kept form): a warp's Q rows in shared memory are q' =
// R_{-delta} q for the delta of the entries being processed, rebuilt from the original q when the
// delta changes. A tile is processed in one pass per distinct delta among its 4 entries (entries
// of other deltas masked), so only tiles that straddle a segment boundary take more than one.
// kRotateK instead rotates each K tile in shared memory before Q K^T; it costs 30-40% (see
// docs/kernels.md) and is kept for the measurement.
//
// This file also holds the plan, the launcher and the merge, which the wgmma kernel
// (paged_prefill_wgmma.cu, PrefillKernel::kWgmma) shares unchanged.
#include "kernels/cuda/paged_prefill_attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_prefill_internal.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"

namespace lazyattn {
namespace {

// Shared with the wgmma kernel (paged_prefill_internal.cuh).
using prefill_internal::CpAsync16;
using prefill_internal::CpAsyncWaitAll;
using prefill_internal::Exp2;
using prefill_internal::kBlockM;  // query rows per CTA
using prefill_internal::kBlockN;  // keys per K/V tile
using prefill_internal::kCombineWords;
using prefill_internal::kEntriesPerTile;
using prefill_internal::kEntryWords;
using prefill_internal::kKvBlock;  // slots per KV block
using prefill_internal::kSeqWords;
using prefill_internal::kWorkWords;
using prefill_internal::Ldmatrix4;
using prefill_internal::LoadWorkItem;
using prefill_internal::Params;
using prefill_internal::Swz;
using prefill_internal::UnpackBf16;
using prefill_internal::WorkItem;

constexpr int kThreads = 128;
constexpr int kRowsPerWarp = 32;
constexpr int kCtasPerSm = prefill_internal::kMmaSyncCtasPerSm;
constexpr int kMinTilesPerSplit = 4;
constexpr int kMaxSplits = 64;  // the merge kernel holds two weights per lane

template <int D, PrefillRotation kRot>
struct Smem {
  static constexpr int kRowBytes = D * 2;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kTileBytes = kBlockN * kRowBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;                      // [2 stages]
  static constexpr int kV = kK + 2 * kTileBytes;               // [2 stages]
  static constexpr int kEnt = kV + 2 * kTileBytes;             // int4 [3 slots][4 entries]
  static constexpr int kCs = kEnt + 3 * kEntriesPerTile * 16;  // fp32 [2][4][cos,sin][D/2]
  static constexpr int kCsBytes =
      kRot == PrefillRotation::kRotateK ? 2 * kEntriesPerTile * 2 * (D / 2) * 4 : 0;
  static constexpr int kBytes = kCs + kCsBytes;
};

__device__ __forceinline__ void Ldmatrix4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Rotates 8 pairs (x1[i], x2[i]) by angles with cos c[i], sin s[i] times `sign`.
__device__ __forceinline__ void Rotate8(uint4& x1, uint4& x2, const float4& c0, const float4& c1,
                                        const float4& s0, const float4& s1, float sign) {
  const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
  uint32_t* a = reinterpret_cast<uint32_t*>(&x1);
  uint32_t* b = reinterpret_cast<uint32_t*>(&x2);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 xa = UnpackBf16(a[k]), xb = UnpackBf16(b[k]);
    const float sa = sign * s[2 * k], sb = sign * s[2 * k + 1];
    a[k] = PackBf16(xa.x * c[2 * k] - xb.x * sa, xa.y * c[2 * k + 1] - xb.y * sb);
    b[k] = PackBf16(xa.x * sa + xb.x * c[2 * k], xa.y * sb + xb.y * c[2 * k + 1]);
  }
}

template <int D, PrefillRotation kRot>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) PagedPrefillKernel(const Params p) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  using S = Smem<D, kRot>;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kHalfChunks = D / 16;
  constexpr int kDTiles = D / 8;  // n8 tiles of the output
  extern __shared__ __align__(128) uint8_t smem[];
  int4* s_ent = reinterpret_cast<int4*>(smem + S::kEnt);
  float* s_cs = reinterpret_cast<float*>(smem + S::kCs);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.y;
  const WorkItem item = LoadWorkItem(p, blockIdx.x);
  const int m_tok0 = item.m_tok0, n_tok = item.n_tok;
  const int t_begin = item.t_begin, t_end = item.t_end, partial = item.partial;
  const int q_start = item.q_start, entry_start = item.entry_start;
  const int num_entries = item.num_entries, fqi = item.first_query_index;
  const int group = p.group;
  const int64_t kv_off = static_cast<int64_t>(kvh) * kKvBlock * D;

  auto q_row_ptr = [&](int tok, int h) {
    return p.q + (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * group + h) * D;
  };

  // Entries of tile `t` -> slot.
  auto issue_entries = [&](int t, int slot) {
    if (tid < kEntriesPerTile) {
      const int e = t * kEntriesPerTile + tid;
      const bool ok = e < num_entries;
      CpAsync16(SmemAddr(s_ent + slot * kEntriesPerTile + tid),
                p.entries + (ok ? entry_start + e : 0), ok);
    }
  };
  // K/V (and, for kRotateK, the cos/sin rows of its deltas) of the tile whose entries are in
  // `slot` -> `stage`.
  auto issue_kv = [&](int slot, int stage) {
    const int4* ent = s_ent + slot * kEntriesPerTile;
    constexpr int kRowsPerIter = kThreads / kChunks;
    const uint32_t k_base = SmemAddr(smem + S::kK + stage * S::kTileBytes);
    const uint32_t v_base = SmemAddr(smem + S::kV + stage * S::kTileBytes);
#pragma unroll
    for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
      const int row = tid / kChunks + i * kRowsPerIter;
      const int c = tid % kChunks;
      const int4 en = ent[(i * kRowsPerIter) / kKvBlock];
      const int slot_in_block = row & (kKvBlock - 1);
      const bool ok = slot_in_block < en.z;
      const int64_t off = static_cast<int64_t>(static_cast<uint32_t>(en.x)) * p.block_stride +
                          kv_off + slot_in_block * D + c * 8;
      CpAsync16(k_base + Swz<D>(row, c), ok ? p.k_pool + off : p.k_pool, ok);
      CpAsync16(v_base + Swz<D>(row, c), ok ? p.v_pool + off : p.v_pool, ok);
    }
    if constexpr (kRot == PrefillRotation::kRotateK) {
      // 4 entries x {cos, sin} x D/2 floats = D chunks of 16 bytes.
      if (tid < D) {
        const int e = tid / (D / 4), r = tid % (D / 4);
        const int which = r / (D / 8), c = r % (D / 8);
        const int4 en = ent[e];
        const bool ok = en.z > 0 && en.y != 0;
        const float* table = which ? p.rope_sin : p.rope_cos;
        float* dst = s_cs + ((stage * kEntriesPerTile + e) * 2 + which) * (D / 2) + c * 4;
        CpAsync16(SmemAddr(dst), ok ? table + static_cast<int64_t>(en.y) * (D / 2) + c * 4 : table,
                  ok);
      }
    }
  };

  // Rows this thread's accumulator fragments belong to: (mi, r2) -> row.
  int q_index[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      const int row = warp * kRowsPerWarp + mi * 16 + (lane >> 2) + r2 * 8;
      const int tok = row / group;
      q_index[mi][r2] = tok < n_tok ? fqi + m_tok0 + tok : -1;
    }
  }
  const int min_q_index = fqi + m_tok0;

  float o[2][kDTiles][4];
  float m_run[2][2], l_run[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
#pragma unroll
      for (int k = 0; k < 4; ++k) o[mi][dt][k] = 0.f;
    }
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      m_run[mi][r2] = -INFINITY;
      l_run[mi][r2] = 0.f;
    }
  }

  const uint32_t q_smem = SmemAddr(smem + S::kQ);
  // ldmatrix addresses. In all three access patterns row & 7 == lane & 7 and the chunk is
  // 2 * step + (one lane bit), so the swizzled byte offset of chunk 2j+b is
  // (j / 4) * 128 + ((32 * (j % 4)) ^ lane_xor) with lane_xor = ((b ^ (lane & 7)) << 4).
  const uint32_t a_base = q_smem + (warp * kRowsPerWarp + (lane & 15)) * S::kRowBytes;
  const uint32_t a_xor = ((lane >> 4) ^ (lane & 7)) << 4;
  const uint32_t k_row_off = ((lane & 7) + ((lane >> 4) << 3)) * S::kRowBytes;
  const uint32_t k_xor = (((lane >> 3) & 1) ^ (lane & 7)) << 4;
  const uint32_t v_row_off = ((lane & 7) + (((lane >> 3) & 1) << 3)) * S::kRowBytes;
  const uint32_t v_xor = ((lane >> 4) ^ (lane & 7)) << 4;
  auto chunk_off = [](int j, uint32_t lane_xor) -> uint32_t {
    return (j / 4) * 128 + ((32u * (j % 4)) ^ lane_xor);
  };

  if (t_begin < t_end) {
    issue_entries(t_begin, 0);
    CpAsyncCommit();
    CpAsyncWaitAll();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBlockM * kChunks / kThreads; ++i) {
      const int id = tid + i * kThreads;
      const int row = id / kChunks, c = id % kChunks;
      const int tok = row / group, h = row - tok * group;
      const bool ok = tok < n_tok;
      CpAsync16(q_smem + Swz<D>(row, c), ok ? q_row_ptr(tok, h) + c * 8 : p.q, ok);
    }
    issue_kv(0, 0);
    if (t_begin + 1 < t_end) issue_entries(t_begin + 1, 1);
    CpAsyncCommit();
  }

  // kRotateQ: the delta this warp's Q rows in shared memory are rotated by, and whether they
  // still hold the original q the prologue loaded (rotated by 0).
  int cur_delta = 0;
  bool q_original = true;

  // Rewrites this warp's 32 Q rows in shared memory as q' = R_{-delta} q. The source is always
  // the original q: read in place while the rows still hold it (a CTA's first rotation), else
  // from global memory; never the previous q', so rounding cannot accumulate across documents.
  // The loads are issued four chunk pairs at a time to overlap their latency.
  auto rotate_q = [&](int delta) {
    constexpr int kBatch = kHalfChunks < 4 ? kHalfChunks : 4;
    __syncwarp();
    const int c = lane % kHalfChunks;  // the same chunk pair in every row this lane touches
    const float4* c4 =
        reinterpret_cast<const float4*>(p.rope_cos + static_cast<int64_t>(delta) * (D / 2)) + 2 * c;
    const float4* s4 =
        reinterpret_cast<const float4*>(p.rope_sin + static_cast<int64_t>(delta) * (D / 2)) + 2 * c;
    const float4 ca = __ldg(c4), cb = __ldg(c4 + 1), sa = __ldg(s4), sb = __ldg(s4 + 1);
#pragma unroll 1
    for (int i0 = 0; i0 < kHalfChunks; i0 += kBatch) {
      uint4 x1[kBatch], x2[kBatch];
      int rows[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        rows[b] = warp * kRowsPerWarp + (lane + (i0 + b) * 32) / kHalfChunks;
        uint8_t* lo = smem + S::kQ + Swz<D>(rows[b], c);
        uint8_t* hi = smem + S::kQ + Swz<D>(rows[b], c + kHalfChunks);
        if (q_original) {  // padding rows hold zeros, which rotate to zeros
          x1[b] = *reinterpret_cast<const uint4*>(lo);
          x2[b] = *reinterpret_cast<const uint4*>(hi);
        } else {
          const int tok = rows[b] / group, h = rows[b] - tok * group;
          x1[b] = x2[b] = make_uint4(0, 0, 0, 0);
          if (tok < n_tok) {
            const uint4* src = reinterpret_cast<const uint4*>(q_row_ptr(tok, h));
            x1[b] = __ldg(src + c);
            x2[b] = __ldg(src + c + kHalfChunks);
          }
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        Rotate8(x1[b], x2[b], ca, cb, sa, sb, -1.f);
        *reinterpret_cast<uint4*>(smem + S::kQ + Swz<D>(rows[b], c)) = x1[b];
        *reinterpret_cast<uint4*>(smem + S::kQ + Swz<D>(rows[b], c + kHalfChunks)) = x2[b];
      }
    }
    __syncwarp();
    cur_delta = delta;
    q_original = false;
  };

  int stage = 0, slot = 0;
  for (int t = t_begin; t < t_end; ++t) {
    CpAsyncWaitAll();
    __syncthreads();
    {
      const int next_slot = slot == 2 ? 0 : slot + 1;
      if (t + 1 < t_end) {
        issue_kv(next_slot, stage ^ 1);
        if (t + 2 < t_end) issue_entries(t + 2, next_slot == 2 ? 0 : next_slot + 1);
      }
      CpAsyncCommit();
    }
    const int4* ent = s_ent + slot * kEntriesPerTile;
    const int4 e0 = ent[0], e1 = ent[1], e2 = ent[2], e3 = ent[3];
    const uint32_t k_smem = SmemAddr(smem + S::kK + stage * S::kTileBytes);
    const uint32_t v_smem = SmemAddr(smem + S::kV + stage * S::kTileBytes);

    if constexpr (kRot == PrefillRotation::kRotateK) {
      if ((e0.y | e1.y | e2.y | e3.y) != 0) {
        uint8_t* k_tile = smem + S::kK + stage * S::kTileBytes;
#pragma unroll
        for (int i = 0; i < kBlockN * kHalfChunks / kThreads; ++i) {
          const int u = tid + i * kThreads;
          const int row = u / kHalfChunks, c = u % kHalfChunks;
          const int e = row / kKvBlock;
          const int delta = ent[e].y;
          if (delta != 0) {
            uint4* p1 = reinterpret_cast<uint4*>(k_tile + Swz<D>(row, c));
            uint4* p2 = reinterpret_cast<uint4*>(k_tile + Swz<D>(row, c + kHalfChunks));
            uint4 x1 = *p1, x2 = *p2;
            const float4* c4 = reinterpret_cast<const float4*>(
                                   s_cs + ((stage * kEntriesPerTile + e) * 2) * (D / 2)) +
                               2 * c;
            const float4* s4 = c4 + D / 8;
            Rotate8(x1, x2, c4[0], c4[1], s4[0], s4[1], 1.f);
            *p1 = x1;
            *p2 = x2;
          }
        }
        __syncthreads();
      }
    }

    // One pass per distinct delta among the tile's entries: a pass computes the whole tile and
    // masks the entries of other deltas. Tiles inside one segment (all but the few that
    // straddle a segment boundary) take one pass; kRotateK and kNone always take one.
    int todo = (e0.z > 0 ? 1 : 0) | (e1.z > 0 ? 2 : 0) | (e2.z > 0 ? 4 : 0) | (e3.z > 0 ? 8 : 0);
    do {
      int active = todo;
      if constexpr (kRot == PrefillRotation::kRotateQ) {
        const int first = __ffs(todo) - 1;
        const int d = first == 0 ? e0.y : first == 1 ? e1.y : first == 2 ? e2.y : e3.y;
        active &=
            (e0.y == d ? 1 : 0) | (e1.y == d ? 2 : 0) | (e2.y == d ? 4 : 0) | (e3.y == d ? 8 : 0);
        if (d != cur_delta) rotate_q(d);
      }
      todo &= ~active;

      float s[2][8][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) s[mi][nt][k] = 0.f;
        }
      }

      // S = Q K^T.
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          Ldmatrix4(a[mi], a_base + mi * 16 * S::kRowBytes + chunk_off(ks, a_xor));
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          Ldmatrix4(b, k_smem + k_row_off + np * 16 * S::kRowBytes + chunk_off(ks, k_xor));
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            Mma16816(s[mi][2 * np], a[mi], b[0], b[1]);
            Mma16816(s[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }

      // Mask invalid slots and keys past each row's own index.
      const bool full =
          e0.z == kKvBlock && e1.z == kKvBlock && e2.z == kKvBlock && e3.z == kKvBlock;
      if (!full || active != 0xF || e3.w + kKvBlock - 1 > min_q_index) {
        const int ks_[4] = {e0.w, e1.w, e2.w, e3.w};
        // Slots of inactive entries count as invalid.
        const int nv_[4] = {(active & 1) ? e0.z : 0, (active & 2) ? e1.z : 0,
                            (active & 4) ? e2.z : 0, (active & 8) ? e3.z : 0};
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int slot_in_block = (nt & 1) * 8 + 2 * (lane & 3) + (k & 1);
            const int key = ks_[nt >> 1] + slot_in_block;
            const bool valid = slot_in_block < nv_[nt >> 1];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
              if (!valid || key > q_index[mi][k >> 1]) s[mi][nt][k] = -INFINITY;
            }
          }
        }
      }

      // Online softmax (exp2 domain). O is rescaled only when some row of the warp got a new
      // maximum (alpha == 1 exactly otherwise): after the first tiles that is rare.
      float alpha[2][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            mx = fmaxf(mx, fmaxf(s[mi][nt][2 * r2], s[mi][nt][2 * r2 + 1]));
          }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m_run[mi][r2], mx);
          const float m_scaled = m_new == -INFINITY ? 0.f : m_new * p.scale_log2;
          alpha[mi][r2] = Exp2(m_run[mi][r2] * p.scale_log2 - m_scaled);
          m_run[mi][r2] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float pr = Exp2(fmaf(s[mi][nt][2 * r2 + c], p.scale_log2, -m_scaled));
              s[mi][nt][2 * r2 + c] = pr;
              sum += pr;
            }
          }
          l_run[mi][r2] = l_run[mi][r2] * alpha[mi][r2] + sum;
        }
      }
      if (__any_sync(0xffffffffu, alpha[0][0] != 1.f || alpha[0][1] != 1.f || alpha[1][0] != 1.f ||
                                      alpha[1][1] != 1.f)) {
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o[mi][dt][0] *= alpha[mi][0];
            o[mi][dt][1] *= alpha[mi][0];
            o[mi][dt][2] *= alpha[mi][1];
            o[mi][dt][3] *= alpha[mi][1];
          }
        }
      }

      // O += P V.
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        uint32_t pa[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          pa[mi][0] = PackBf16(s[mi][2 * ks][0], s[mi][2 * ks][1]);
          pa[mi][1] = PackBf16(s[mi][2 * ks][2], s[mi][2 * ks][3]);
          pa[mi][2] = PackBf16(s[mi][2 * ks + 1][0], s[mi][2 * ks + 1][1]);
          pa[mi][3] = PackBf16(s[mi][2 * ks + 1][2], s[mi][2 * ks + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          Ldmatrix4Trans(b, v_smem + v_row_off + ks * 16 * S::kRowBytes + chunk_off(dp, v_xor));
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            Mma16816(o[mi][2 * dp], pa[mi], b[0], b[1]);
            Mma16816(o[mi][2 * dp + 1], pa[mi], b[2], b[3]);
          }
        }
      }

    } while (todo != 0);

    stage ^= 1;
    slot = slot == 2 ? 0 : slot + 1;
  }

  // Epilogue: normalize and store (bf16 to out, or fp32 + log-sum-exp to the split workspace).
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      float l = l_run[mi][r2];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = warp * kRowsPerWarp + mi * 16 + (lane >> 2) + r2 * 8;
      const int tok = row / group, h = row - tok * group;
      if (tok >= n_tok) continue;
      if (partial < 0) {
        __nv_bfloat16* dst =
            p.out +
            (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * group + h) * D +
            2 * (lane & 3);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(dst + dt * 8) =
              PackBf16(o[mi][dt][2 * r2] * inv, o[mi][dt][2 * r2 + 1] * inv);
        }
      } else {
        const int64_t prow = (static_cast<int64_t>(partial) * p.num_kv_heads + kvh) * kBlockM + row;
        float* dst = p.part_o + prow * D + 2 * (lane & 3);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          *reinterpret_cast<float2*>(dst + dt * 8) =
              make_float2(o[mi][dt][2 * r2] * inv, o[mi][dt][2 * r2 + 1] * inv);
        }
        if ((lane & 3) == 0) {
          p.part_lse[prow] = l > 0.f ? m_run[mi][r2] * p.scale_log2 + __log2f(l) : -INFINITY;
        }
      }
    }
  }
}

// Merges the splits of one query tile: out = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M).
// One warp per query row (grid.z walks the tile's rows, 4 per CTA); lane s holds split s's
// weight. The partial rows of up to kMergeBatch splits are loaded at once, the first batch before
// the weights are known: a 16-split merge now waits on memory about twice, where it used to wait
// for the log-sum-exps and then once per 4 splits (measured: 8.9-9.7 against 9.8-10.0 us at q64).
constexpr int kMergeBatch = 16;

template <int D>
__global__ void __launch_bounds__(kThreads) PagedPrefillCombineKernel(const Params p) {
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  constexpr int kPerLane = D / 32;  // 4 or 2 floats: one 16- or 8-byte load per partial row
  using Vec = std::conditional_t<kPerLane == 4, float4, float2>;
  static_assert(sizeof(Vec) == kPerLane * sizeof(float));
  const int* c = p.combine + static_cast<int64_t>(blockIdx.x) * kCombineWords;
  const int seq = c[0], m_tok0 = c[1], n_tok = c[2], base = c[3], splits = c[4];
  const int kvh = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.z * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= n_tok * p.group) return;
  const int q_start = p.seqs[seq * kSeqWords];
  auto prow = [&](int s) {
    return (static_cast<int64_t>(base + s) * p.num_kv_heads + kvh) * kBlockM + row;
  };
  Vec v[kMergeBatch];
  auto load_batch = [&](int s0) {
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const int s = s0 + j;
      v[j] = s < splits ? *reinterpret_cast<const Vec*>(p.part_o + prow(s) * D + lane * kPerLane)
                        : Vec{};
    }
  };
  load_batch(0);
  float lse[kMaxSplits / 32];
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    lse[k] = s < splits ? p.part_lse[prow(s)] : -INFINITY;
  }
  float mx = fmaxf(lse[0], lse[1]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float wgt[kMaxSplits / 32], wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxSplits / 32; ++k) {
    wgt[k] = mx == -INFINITY ? 0.f : Exp2(lse[k] - mx);
    wsum += wgt[k];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
  float acc[kPerLane] = {};
  for (int s0 = 0;;) {
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const int s = s0 + j;
      const float w = __shfl_sync(0xffffffffu, (s & 32) ? wgt[1] : wgt[0], s & 31);
      // A split with weight 0 (no visible key, or past `splits`) adds nothing, whatever its row
      // holds: selected away rather than multiplied, as 0 x NaN would not vanish.
      if (s < splits && w != 0.f) {
        const float* x = reinterpret_cast<const float*>(&v[j]);
#pragma unroll
        for (int k = 0; k < kPerLane; ++k) acc[k] += w * x[k];
      }
    }
    s0 += kMergeBatch;
    if (s0 >= splits) break;
    load_batch(s0);
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  const int tok = row / p.group, h = row - tok * p.group;
  __nv_bfloat16* dst =
      p.out + (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * p.group + h) * D +
      lane * kPerLane;
#pragma unroll
  for (int k = 0; k < kPerLane; k += 2) {
    *reinterpret_cast<uint32_t*>(dst + k) = PackBf16(acc[k] * inv, acc[k + 1] * inv);
  }
}

template <int D, PrefillRotation kRot>
absl::Status LaunchMmaSync(const PagedPrefillPlan& plan, const Params& params,
                           cudaStream_t stream) {
  constexpr int kSmem = Smem<D, kRot>::kBytes;
  static absl::Status attr_status = [] {
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(PagedPrefillKernel<D, kRot>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(PagedPrefillKernel<D, kRot>,
                                              cudaFuncAttributePreferredSharedMemoryCarveout,
                                              cudaSharedmemCarveoutMaxShared));
    return absl::OkStatus();
  }();
  if (!attr_status.ok()) return attr_status;
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(PagedPrefillKernel<D, kRot>,
                                        dim3(plan.num_work_items(), plan.shape().num_kv_heads),
                                        dim3(kThreads), kSmem, stream, params));
  return absl::OkStatus();
}

// The attention kernel (`wgmma`: the sm_90a one, only for the instances it covers), then the
// merge of the split-KV partials when the plan splits.
template <int D, PrefillRotation kRot>
absl::Status Launch(const PagedPrefillPlan& plan, const Params& params, bool wgmma,
                    cudaStream_t stream) {
  const int kv_heads = plan.shape().num_kv_heads;
  if (plan.num_work_items() > 0) {
    constexpr bool kWgmmaCovers = D == 128 && kRot != PrefillRotation::kRotateK;
    if (kWgmmaCovers && wgmma) {
      RETURN_IF_ERROR(prefill_internal::LaunchWgmmaAttention(plan, params, kRot, stream));
    } else {
      RETURN_IF_ERROR((LaunchMmaSync<D, kRot>(plan, params, stream)));
    }
  }
  if (plan.num_split_groups() > 0) {
    RETURN_IF_CUDA_ERROR(LaunchOverlapped(
        PagedPrefillCombineKernel<D>,
        dim3(plan.num_split_groups(), kv_heads, kBlockM / (kThreads / 32)), dim3(kThreads), 0,
        stream, params));
  }
  return absl::OkStatus();
}

template <int D>
absl::Status DispatchRotation(const PagedPrefillPlan& plan, const Params& params,
                              PrefillRotation rotation, bool wgmma, cudaStream_t stream) {
  switch (rotation) {
    case PrefillRotation::kRotateQ:
      return Launch<D, PrefillRotation::kRotateQ>(plan, params, wgmma, stream);
    case PrefillRotation::kRotateK:
      return Launch<D, PrefillRotation::kRotateK>(plan, params, wgmma, stream);
    case PrefillRotation::kNone:
      return Launch<D, PrefillRotation::kNone>(plan, params, wgmma, stream);
  }
  return absl::InvalidArgumentError("unknown PrefillRotation");
}

// Split-KV boundaries of one query tile's key range [0, tiles): at most `max_splits` ranges of at
// most `max_len` tiles each. kRotateQ rotates a CTA's Q rows in place for the first delta of its
// range (cheap), but rebuilds them from global memory at every later change of delta (measured
// ~1 tile of work each). So a range costs its tiles plus one per change of delta after its first
// entry, and the ranges minimize the largest cost: where the tile budget allows, a range starts
// at a segment start instead of just before it. change_inner[j] counts the changes between the
// entries of tile j, change_start[j] is 1 when tile j's first entry starts a new segment. Greedy
// partition (optimal for a given cost bound) plus a binary search on the bound. Returns the
// first tile of each range.
std::vector<int> SplitRanges(const std::vector<int>& change_inner,
                             const std::vector<int>& change_start, int tiles, int max_splits,
                             int max_len) {
  auto partition = [&](int64_t bound) {
    std::vector<int> begins = {0};
    int64_t cost = 1 + change_inner[0];
    for (int j = 1; j < tiles; ++j) {
      const int64_t c = 1 + change_inner[j] + change_start[j];
      if (j - begins.back() >= max_len || cost + c > bound) {
        begins.push_back(j);
        cost = 1 + change_inner[j];
      } else {
        cost += c;
      }
    }
    return begins;
  };
  int64_t lo = 1, hi = max_len;
  for (int j = 0; j < tiles; ++j) {
    lo = std::max<int64_t>(lo, 1 + change_inner[j]);
    hi += change_inner[j] + change_start[j];
  }
  // hi is feasible: with it only max_len binds, which gives ceil(tiles / max_len) <= max_splits.
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int>(partition(mid).size()) <= max_splits) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return partition(hi);
}

}  // namespace

absl::Status PagedPrefillPlan::Build(const PagedPrefillShape& shape,
                                     const PagedPrefillSequence* seqs, int num_seqs,
                                     const PagedPrefillPlanOptions& options) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged prefill: head_dim ", shape.head_dim, " unsupported (64 or 128)"));
  }
  if (shape.block_size != kKvBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged prefill: block_size ", shape.block_size, " unsupported (16)"));
  }
  if (shape.num_kv_heads <= 0 || shape.num_heads <= 0 ||
      shape.num_heads % shape.num_kv_heads != 0 || shape.num_heads / shape.num_kv_heads > kBlockM) {
    return absl::InvalidArgumentError(absl::StrCat("paged prefill: ", shape.num_heads,
                                                   " query heads over ", shape.num_kv_heads,
                                                   " KV heads unsupported"));
  }
  if (num_seqs < 0 || (num_seqs > 0 && seqs == nullptr)) {
    return absl::InvalidArgumentError("paged prefill: no sequences");
  }
  if (options.ctas_per_sm < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged prefill: ctas_per_sm ", options.ctas_per_sm, " (must be >= 1)"));
  }
  shape_ = shape;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int tokens_per_cta = kBlockM / group;

  struct Tile {
    int seq, m_tok0, n_tok, tiles;
  };
  std::vector<Tile> tiles;
  std::vector<int64_t> key_start;
  // Per sequence and K tile: changes of delta inside the tile, and whether it starts a segment.
  std::vector<std::vector<int>> change_inner(num_seqs), change_start(num_seqs);
  int64_t total_entries = 0, total_break_words = 0, q_total = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const PagedPrefillSequence& sq = seqs[s];
    if (sq.num_queries < 0 || sq.num_blocks < 0 || sq.first_query_index < 0 ||
        (sq.num_blocks > 0 && sq.block_table == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " malformed"));
    }
    total_entries += sq.num_blocks;
    total_break_words += (sq.num_blocks + kEntriesPerTile - 1) / kEntriesPerTile + 2;
    q_total += sq.num_queries;
  }
  if (q_total > INT32_MAX / 2 || total_entries > INT32_MAX / 8) {
    return absl::InvalidArgumentError("paged prefill: batch too large");
  }

  layout_.seqs = 0;
  layout_.entries = (static_cast<int64_t>(num_seqs) * kSeqWords + 3) / 4 * 4;
  layout_.breaks = layout_.entries + total_entries * kEntryWords;
  layout_.work = layout_.breaks + total_break_words;
  words_.assign(layout_.work, 0);
  // Per sequence: whether its K tile j is uniform at delta 0 (then a range starting at j, where
  // the kernel's q' starts unrotated, begins with a plain tile).
  std::vector<std::vector<char>> uniform_zero(num_seqs);

  int64_t q_start = 0, entry_start = 0, break_start = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const PagedPrefillSequence& sq = seqs[s];
    key_start.assign(sq.num_blocks, 0);
    int64_t keys = 0;
    for (int b = 0; b < sq.num_blocks; ++b) {
      const KvBlockEntry e = sq.block_table[b];
      const uint32_t valid = KvEntryValid(e);
      if (valid < 1 || valid > static_cast<uint32_t>(kKvBlock)) {
        return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " block ", b,
                                                       " has ", valid, " valid slots (1..16)"));
      }
      if (KvEntryDelta(e) >= options.rope_max_positions) {
        return absl::InvalidArgumentError(
            absl::StrCat("paged prefill: sequence ", s, " block ", b, " delta ", KvEntryDelta(e),
                         " outside the RoPE table (", options.rope_max_positions, " positions)"));
      }
      if (shape.num_pool_blocks > 0 && KvEntryBlock(e) >= shape.num_pool_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " block ", b,
                                                       " is physical block ", KvEntryBlock(e),
                                                       " past the pool"));
      }
      int32_t* w = &words_[layout_.entries + (entry_start + b) * kEntryWords];
      w[0] = static_cast<int32_t>(KvEntryBlock(e));
      w[1] = static_cast<int32_t>(KvEntryDelta(e));
      w[2] = static_cast<int32_t>(valid);
      w[3] = static_cast<int32_t>(keys);
      key_start[b] = keys;
      keys += valid;
      if (b % kEntriesPerTile == 0) {
        change_inner[s].push_back(0);
        change_start[s].push_back(0);
      }
      if (b > 0 && KvEntryDelta(e) != KvEntryDelta(sq.block_table[b - 1])) {
        (b % kEntriesPerTile == 0 ? change_start[s] : change_inner[s]).back() += 1;
      }
    }
    if (keys + sq.first_query_index + sq.num_queries > INT32_MAX / 2) {
      return absl::InvalidArgumentError(absl::StrCat("paged prefill: sequence ", s, " too long"));
    }
    // Plain tiles and break points (kRotateQ of the wgmma kernel; see the header). Tile j is
    // uniform when its entries share one delta; after a tile, the kernel's q' sits at the delta
    // of the tile's last pass, i.e. of the distinct delta that appears last for the first time
    // (passes go in order of first appearance); tile j >= 1 is plain when it is uniform at the
    // delta its predecessor leaves. breaks[j] = the first tile >= j that is not plain (tile 0
    // counts as not plain), breaks[tiles] = breaks[tiles + 1] = tiles (sentinels: the kernel
    // reads breaks[j + 1] after a break at any tile j it runs, the last one included).
    const int seq_tiles = (sq.num_blocks + kEntriesPerTile - 1) / kEntriesPerTile;
    int32_t* breaks = &words_[layout_.breaks + break_start];
    breaks[seq_tiles] = breaks[seq_tiles + 1] = seq_tiles;
    uniform_zero[s].assign(seq_tiles, 0);
    std::vector<int64_t> after(seq_tiles), uniform_delta(seq_tiles);  // -1: not uniform
    for (int j = 0; j < seq_tiles; ++j) {
      const int b0 = j * kEntriesPerTile, b1 = std::min(b0 + kEntriesPerTile, sq.num_blocks);
      int64_t seen[kEntriesPerTile];
      int num_seen = 0;
      for (int b = b0; b < b1; ++b) {
        const int64_t d = static_cast<int64_t>(KvEntryDelta(sq.block_table[b]));
        if (std::find(seen, seen + num_seen, d) == seen + num_seen) seen[num_seen++] = d;
      }
      after[j] = seen[num_seen - 1];
      uniform_delta[j] = num_seen == 1 ? seen[0] : -1;
      uniform_zero[s][j] = uniform_delta[j] == 0 ? 1 : 0;
    }
    for (int j = seq_tiles - 1; j >= 0; --j) {
      const bool plain = j > 0 && uniform_delta[j] >= 0 && uniform_delta[j] == after[j - 1];
      breaks[j] = plain ? breaks[j + 1] : j;
    }
    // The sequence's words, read back by prefill_internal::LoadWorkItem.
    int32_t* w = &words_[layout_.seqs + static_cast<int64_t>(s) * kSeqWords];
    w[0] = static_cast<int32_t>(q_start);
    w[1] = sq.num_queries;
    w[2] = static_cast<int32_t>(entry_start);
    w[3] = sq.num_blocks;
    w[4] = static_cast<int32_t>(sq.first_query_index);
    w[5] = static_cast<int32_t>(break_start);
    for (int m = 0; m < sq.num_queries; m += tokens_per_cta) {
      const int n = std::min(tokens_per_cta, sq.num_queries - m);
      const int64_t last_q = sq.first_query_index + m + n - 1;
      // Entries whose first key is visible to the tile's last query.
      const int64_t needed =
          std::upper_bound(key_start.begin(), key_start.end(), last_q) - key_start.begin();
      tiles.push_back(
          {s, m, n, static_cast<int>((needed + kEntriesPerTile - 1) / kEntriesPerTile)});
    }
    q_start += sq.num_queries;
    entry_start += sq.num_blocks;
    break_start += seq_tiles + 2;
  }
  total_queries_ = q_total;

  // Split KV when the query tiles alone would leave most of the chip idle.
  int splits_target = 1;
  const int64_t base_ctas = static_cast<int64_t>(tiles.size()) * shape.num_kv_heads;
  if (options.sm_count > 0 && options.max_splits > 1 && base_ctas > 0) {
    const int64_t slots = static_cast<int64_t>(options.sm_count) * options.ctas_per_sm;
    splits_target = static_cast<int>(
        std::clamp<int64_t>(slots / base_ctas, 1, std::min(options.max_splits, kMaxSplits)));
  }
  struct Work {
    int seq, m_tok0, n_tok, t_begin, t_end, partial;
  };
  std::vector<Work> work;
  std::vector<int32_t> combine;
  num_partials_ = 0;
  for (const Tile& t : tiles) {
    int splits = std::min(splits_target, std::max(1, t.tiles / kMinTilesPerSplit));
    const int per_split = splits > 1 ? (t.tiles + splits - 1) / splits : t.tiles;
    if (splits > 1) splits = (t.tiles + per_split - 1) / per_split;
    if (splits <= 1) {
      work.push_back({t.seq, t.m_tok0, t.n_tok, 0, t.tiles, -1});
      continue;
    }
    // No range longer than the even split's, so the rotation-free kernel never loses.
    const std::vector<int> begins =
        SplitRanges(change_inner[t.seq], change_start[t.seq], t.tiles, splits, per_split);
    splits = static_cast<int>(begins.size());
    if (splits <= 1) {
      work.push_back({t.seq, t.m_tok0, t.n_tok, 0, t.tiles, -1});
      continue;
    }
    const int base = num_partials_;
    num_partials_ += splits;
    for (int k = 0; k < splits; ++k) {
      work.push_back({t.seq, t.m_tok0, t.n_tok, begins[k], k + 1 < splits ? begins[k + 1] : t.tiles,
                      base + k});
    }
    combine.insert(combine.end(), {t.seq, t.m_tok0, t.n_tok, base, splits, 0, 0, 0});
  }
  // Heaviest first, so the long causal tiles do not trail at the end of the grid.
  std::stable_sort(work.begin(), work.end(), [](const Work& a, const Work& b) {
    return a.t_end - a.t_begin > b.t_end - b.t_begin;
  });
  num_work_ = static_cast<int>(work.size());
  num_combine_ = static_cast<int>(combine.size() / kCombineWords);
  layout_.combine = layout_.work + static_cast<int64_t>(num_work_) * kWorkWords;
  words_.resize(layout_.combine + combine.size(), 0);
  for (int i = 0; i < num_work_; ++i) {
    // The work item's words, read back by prefill_internal::LoadWorkItem.
    int32_t* w = &words_[layout_.work + static_cast<int64_t>(i) * kWorkWords];
    const Work& x = work[i];
    w[0] = x.seq;
    w[1] = x.m_tok0;
    w[2] = x.n_tok;
    w[3] = x.t_begin;
    w[4] = x.t_end;
    w[5] = x.partial;
    // The first tile of the range that is not plain, the range starting at q' = q (delta 0).
    const int32_t* breaks =
        &words_[layout_.breaks + words_[layout_.seqs + x.seq * kSeqWords + 5]];
    w[6] = x.t_begin < x.t_end && uniform_zero[x.seq][x.t_begin] ? breaks[x.t_begin + 1]
                                                                 : x.t_begin;
  }
  std::copy(combine.begin(), combine.end(), words_.begin() + layout_.combine);
  if (words_.empty()) words_.push_back(0);
  return absl::OkStatus();
}

int64_t PagedPrefillPlan::workspace_bytes() const {
  return static_cast<int64_t>(num_partials_) * shape_.num_kv_heads * kBlockM *
         (shape_.head_dim + 1) * 4;
}

absl::Status PagedPrefillPlan::Upload(void* device_metadata, cudaStream_t stream) const {
  if (device_metadata == nullptr) {
    return absl::InvalidArgumentError("paged prefill: no device metadata buffer");
  }
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(device_metadata, words_.data(), metadata_bytes(),
                                       cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

bool PrefillWgmmaSupports(int head_dim, PrefillRotation rotation) {
  return head_dim == 128 &&
         (rotation == PrefillRotation::kRotateQ || rotation == PrefillRotation::kNone);
}

int PrefillCtasPerSm(PrefillKernel kernel, int head_dim, PrefillRotation rotation) {
  return kernel == PrefillKernel::kWgmma && PrefillWgmmaSupports(head_dim, rotation)
             ? prefill_internal::kWgmmaCtasPerSm
             : prefill_internal::kMmaSyncCtasPerSm;
}

absl::Status PagedPrefillAttention(const PagedPrefillPlan& plan, const PagedPrefillArgs& args,
                                   PrefillRotation rotation, cudaStream_t stream) {
  if (plan.num_work_items() == 0) return absl::OkStatus();
  if (args.q == nullptr || args.k_pool == nullptr || args.v_pool == nullptr ||
      args.out == nullptr || args.device_metadata == nullptr) {
    return absl::InvalidArgumentError("paged prefill: missing tensor or metadata pointer");
  }
  if (rotation != PrefillRotation::kNone &&
      (args.rope_cos == nullptr || args.rope_sin == nullptr)) {
    return absl::InvalidArgumentError("paged prefill: rotation needs the cos/sin tables");
  }
  if (plan.workspace_bytes() > 0 && args.workspace == nullptr) {
    return absl::InvalidArgumentError("paged prefill: the plan splits KV and needs a workspace");
  }
  const PagedPrefillShape& shape = plan.shape();
  const int* meta = static_cast<const int*>(args.device_metadata);
  const PagedPrefillPlan::Layout& layout = plan.layout();
  Params params;
  params.q = args.q;
  params.k_pool = args.k_pool;
  params.v_pool = args.v_pool;
  params.out = args.out;
  params.rope_cos = args.rope_cos;
  params.rope_sin = args.rope_sin;
  params.seqs = meta + layout.seqs;
  params.entries = reinterpret_cast<const int4*>(meta + layout.entries);
  params.breaks = meta + layout.breaks;
  params.work = meta + layout.work;
  params.combine = meta + layout.combine;
  float* ws = static_cast<float*>(args.workspace);
  const int64_t part_rows =
      static_cast<int64_t>(plan.num_partials()) * shape.num_kv_heads * kBlockM;
  params.part_o = ws;
  params.part_lse = ws == nullptr ? nullptr : ws + part_rows * shape.head_dim;
  params.block_stride = static_cast<int64_t>(shape.num_kv_heads) * kKvBlock * shape.head_dim;
  params.num_heads = shape.num_heads;
  params.num_kv_heads = shape.num_kv_heads;
  params.group = shape.num_heads / shape.num_kv_heads;
  params.scale_log2 = args.scale * 1.4426950408889634f;
  const bool wgmma =
      args.kernel == PrefillKernel::kWgmma && PrefillWgmmaSupports(shape.head_dim, rotation);
  switch (shape.head_dim) {
    case 64:
      return DispatchRotation<64>(plan, params, rotation, wgmma, stream);
    case 128:
      return DispatchRotation<128>(plan, params, rotation, wgmma, stream);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("paged prefill: head_dim ", shape.head_dim, " unsupported"));
}

}  // namespace lazyattn
