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
// The plan (paged_prefill_plan.cc), the launcher and the merge (paged_prefill_attention.cu) are
// shared unchanged with the wgmma kernel (paged_prefill_wgmma_ws.cu, PrefillKernel::kWgmmaWs).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/paged_prefill_internal.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"

namespace lazyattn::prefill_internal {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerWarp = 32;
constexpr int kCtasPerSm = prefill_internal::kMmaSyncCtasPerSm;

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

}  // namespace

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

template absl::Status LaunchMmaSync<64, PrefillRotation::kRotateQ>(const PagedPrefillPlan&,
                                                                   const Params&, cudaStream_t);
template absl::Status LaunchMmaSync<64, PrefillRotation::kRotateK>(const PagedPrefillPlan&,
                                                                   const Params&, cudaStream_t);
template absl::Status LaunchMmaSync<64, PrefillRotation::kNone>(const PagedPrefillPlan&,
                                                                const Params&, cudaStream_t);
template absl::Status LaunchMmaSync<128, PrefillRotation::kRotateQ>(const PagedPrefillPlan&,
                                                                    const Params&, cudaStream_t);
template absl::Status LaunchMmaSync<128, PrefillRotation::kRotateK>(const PagedPrefillPlan&,
                                                                    const Params&, cudaStream_t);
template absl::Status LaunchMmaSync<128, PrefillRotation::kNone>(const PagedPrefillPlan&,
                                                                 const Params&, cudaStream_t);

}  // namespace lazyattn::prefill_internal
