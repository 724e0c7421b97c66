// Paged prefill attention on Hopper warpgroup MMA (wgmma, sm_90a), FlashAttention-3 style: the
// same function, plan, split-KV partials and merge as the mma.sync kernel
// (paged_prefill_attention.h has the contract; paged_prefill_plan.cc the plan). head_dim 128,
// kRotateQ and kNone only (head_dim 64 and kRotateK keep the mma.sync kernel).
//
// CTA = 2 consumer warpgroups (256 threads), one work item: 128 query rows (row = token * group +
// head of the group) of one KV head; warpgroup g owns rows 64g..64g+63, wgmma's M. Per K tile of
// 64 keys (4 table entries), per warpgroup:
//   S = Q K^T   8 x wgmma.m64n64k16, A = q (registers), B = K (shared memory, K-major)
//   O += P V    4 x wgmma.m64n128k16, A = P (registers), B = V (shared memory, MN-major)
// with fp32 accumulators (S 32, O 64 registers a thread). The two GEMMs overlap the softmax
// (FlashAttention-3's intra-warpgroup pipelining): a pass issues S of this tile, then P V of the
// previous pass, waits for S only, masks and exponentiates S while P V runs, then waits for P V
// and rescales O. Nothing is in flight across the CTA barrier at the top of a tile.
//
// Loads: no producer warp (a first version, which the design allows): all 256 threads gather K/V
// with cp.async, 16 bytes each (src-size 0 zero-fills slots past an entry's valid count, so pool
// garbage never reaches P V), 4 stages with tile t+2 issued at the top of tile t. Four, not three:
// while tile t is computed, the P V of tile t-1's last pass still reads stage t-1. Entries ride
// two tiles ahead of their K/V (tile t+4's with tile t+2's copy) so gather addresses never wait
// on a global load. cp.async writes through the generic proxy and wgmma reads through the async
// proxy, so every thread fences (fence.proxy.async) after its copies land, before the barrier.
//
// Q in registers (a deviation from the SS form, on purpose): S = Q K^T reads A from registers
// (the mma.sync A fragment, loaded with ldmatrix from Q in shared memory, which keeps the
// original q for the whole CTA). Why: an SS m64n64k16 reads 2 KB of A and 2 KB of B from shared
// memory per 32 tensor-core cycles, i.e. the full 128 B/cycle of an SM, and both warpgroups read
// the same K; with A in registers Q K^T needs half of that. It costs 32 registers a thread, and
// makes the deferred rotation register-only: q' = R_{-delta} q is computed from the original q
// in shared memory (never from an earlier q') straight into the A fragments, with no shared
// memory rewrite, no proxy fence and no barrier. A dimension i and its rotation partner i + 64
// sit in the same register of k16 steps ks and ks + 4, in the same thread.
//
// kRotateQ mirrors the mma.sync kernel: a tile whose 4 entries carry different deltas is done in
// one pass per distinct delta, entries of the other deltas masked; q' is rebuilt when the delta
// changes (once per document and CTA). n64 per pass (one plan tile) rather than two plan tiles
// (n128): a pass's mask and delta are per plan tile, and S stays 32 registers. Whether a tile is
// plain (every valid entry at the current delta: nearly all tiles) is decided a tile ahead, while
// the previous tile's wgmmas run, and a plain tile runs kNone's loop body: deciding it at the top
// of the tile, as the mma.sync kernel does, put a shared-memory load and a branch chain between
// the barrier and Q K^T of every tile (+5 % at encode4096, where every delta is 0). The decision
// is a compare against the plan's next break (the next tile that is not plain, which the host
// found: paged_prefill_attention.h), not a look at the tile's four entries: that look, eight
// shared-memory loads and their compares a tile, was most of what kRotateQ's steady tile
// executed beyond kNone's.
//
// Shared memory (bytes): Q 32,768 ([128 rows][256 B], the mma.sync kernel's XOR swizzle, read
// only by ldmatrix), K and V 4 stages x 16,384 each, entries 512; 164,352 + 1,024 for realigning
// the base to the 1024-byte swizzle atom. One CTA (8 warps) per SM.
//
// K and V tiles in the 128-byte-swizzle layout wgmma reads: [2 halves][64 keys][64 dims], half h
// holding dims 64h..64h+63, 128 bytes a key, 16-byte chunk c of key r at chunk c ^ (r & 7) of its
// row inside the 1024-byte 8-key atom. Descriptors (PTX ISA "Matrix Descriptor Format" and
// "Canonical Layouts"; CUTLASS cute/atom/mma_traits_sm90_gmma.hpp make_gmma_desc), in the
// canonical 128B-swizzle layouts with T = 8 bf16 per 16 bytes:
//   K-major  ((8,m),(T,2k)):((8T,SBO),(1,T)): 8 rows of 128 bytes form an atom, atoms repeat
//     along M/N every SBO bytes; the K extent of one instruction (16 elements = 32 bytes) lies
//     inside a row, so the leading byte offset is unused ("assumed 1"). K^T for S: N = 64 keys =
//     8 atoms 1024 bytes apart -> SBO = 1024, LBO = (1); k16 step ks starts at half ks / 4, byte
//     32 * (ks % 4) of the row.
//   MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): 64 contiguous MN elements (128 bytes) per
//     row, 8 K-rows form an atom; LBO is the distance between 64-element MN blocks, SBO between
//     8-row K groups (CUTLASS: stride_byte_offset = stride<1,1>, the K group stride;
//     leading_byte_offset = stride<0,1>, the MN block stride). V for P V: N = head dims, K = keys:
//     dims 64..127 live one half further -> LBO = 64 keys x 128 B = 8192; keys 8..15 one atom
//     further -> SBO = 1024; k16 step kk starts 16 keys = 2048 bytes further. imm-trans-b = 1
//     (N-major B; allowed for bf16 from shared memory).
//
// Fragments (thread t of the warpgroup, warp w = t / 32, lane l): accumulator element i of an
// m64nN tile is row 16w + l/4 + 8((i/2)%2), column 8(i/4) + 2(l%4) + i%2. The A fragment of an
// m64k16 step (4 registers of bf16 pairs, = CUTLASS ALayout_64x16 = CLayout_64x16) holds
// register j = rows 16w + l/4 + 8(j%2), columns 8(j/2) + 2(l%4) + {0,1}: exactly accumulator
// elements 2j, 2j+1 of an n16 slice. So P's k16 step kk (keys 16kk..16kk+15) is register
// jj = bf16x2(S[8kk + 2jj], S[8kk + 2jj + 1]), no shuffles; and Q's fragment is the mma.sync
// m16n8k16 A fragment of the warp's 16 rows (same layout), which ldmatrix.x4 produces.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/paged_prefill_internal.cuh"
#include "kernels/cuda/paged_prefill_wgmma_ops.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"
#include "kernels/cuda/wgmma_primitives.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "paged_prefill_wgmma.cu uses wgmma: compile it for sm_90a only (kernels/cuda/CMakeLists.txt)"
#endif

namespace lazyattn::prefill_internal {
namespace {

constexpr int kD = 128;
constexpr int kWarpgroups = 2;
constexpr int kWgThreads = 128;
constexpr int kThreads = kWarpgroups * kWgThreads;
constexpr int kRowsPerWg = kBlockM / kWarpgroups;  // 64: wgmma's M
constexpr int kStages = 4;                         // K/V stages
constexpr int kEntrySlots = 8;                     // entry records of tiles t..t+4 live at once
constexpr int kQkSteps = kD / 16;                  // k16 steps of Q K^T
constexpr int kPvSteps = kBlockN / 16;             // k16 steps of P V
static_assert(kThreads == kKvBlock * (kD / 8), "a K/V gather: one slot x one 16-byte chunk each");

struct WgSmem {
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kHalfBytes = kBlockN * 128;  // [64 keys][64 dims]
  static constexpr int kTileBytes = 2 * kHalfBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;                 // [kStages]
  static constexpr int kV = kK + kStages * kTileBytes;    // [kStages]
  static constexpr int kEnt = kV + kStages * kTileBytes;  // int4 [kEntrySlots][4]
  static constexpr int kBytes = kEnt + kEntrySlots * kEntriesPerTile * 16;
  static constexpr int kAlloc = kBytes + 1024;  // dynamic shared memory is only 16-byte aligned
  static_assert(kK % 1024 == 0 && kV % 1024 == 0 && kTileBytes % 1024 == 0,
                "swizzle atoms must start 1024-byte aligned");
};

// Byte offset of 16-byte chunk `chunk` (0..15) of key `row` in a [2][64][64] swizzled K/V tile.
__device__ __forceinline__ uint32_t Sw128(int row, int chunk) {
  return (chunk >> 3) * WgSmem::kHalfBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

template <PrefillRotation kRot>
__global__ void __launch_bounds__(kThreads, kWgmmaCtasPerSm)
    PagedPrefillWgmmaKernel(const Params p) {
  static_assert(kRot == PrefillRotation::kRotateQ || kRot == PrefillRotation::kNone);
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const uint32_t sbase = SmemAddr(smem);
  int4* s_ent = reinterpret_cast<int4*>(smem + WgSmem::kEnt);

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = tid / kWgThreads, warp_in_wg = (tid / 32) % 4;
  const int kvh = blockIdx.y;
  const WorkItem item = LoadWorkItem(p, blockIdx.x);
  const int m_tok0 = item.m_tok0, n_tok = item.n_tok;
  const int t_begin = item.t_begin, t_end = item.t_end, partial = item.partial;
  const int q_start = item.q_start, entry_start = item.entry_start;
  const int num_entries = item.num_entries, fqi = item.first_query_index;
  const int group = p.group;
  const int64_t kv_off = static_cast<int64_t>(kvh) * kKvBlock * kD;

  auto q_row_ptr = [&](int tok, int h) {
    return p.q +
           (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * group + h) * kD;
  };
  // Entry records of tile t (a ring of kEntrySlots tiles).
  auto entry_slot = [&](int t) {
    return s_ent + ((t - t_begin) & (kEntrySlots - 1)) * kEntriesPerTile;
  };
  auto issue_entries = [&](int t) {
    if (tid < kEntriesPerTile) {
      const int e = t * kEntriesPerTile + tid;
      const bool ok = e < num_entries;
      CpAsync16(SmemAddr(entry_slot(t) + tid), p.entries + (ok ? entry_start + e : 0), ok);
    }
  };
  // K/V of tile t (its entries already in shared memory) -> `stage`. Thread: slot tid / 16 of
  // each of the 4 entries, 16-byte chunk tid % 16 (16 threads copy one 256-byte key row).
  auto issue_kv = [&](int t, int stage) {
    const int4* ent = entry_slot(t);
    const int slot = tid / 16, c = tid % 16;
    const uint32_t k_base = sbase + WgSmem::kK + stage * WgSmem::kTileBytes;
    const uint32_t v_base = sbase + WgSmem::kV + stage * WgSmem::kTileBytes;
#pragma unroll
    for (int e = 0; e < kEntriesPerTile; ++e) {
      const int4 en = ent[e];
      const bool ok = slot < en.z;
      const int64_t off = static_cast<int64_t>(static_cast<uint32_t>(en.x)) * p.block_stride +
                          kv_off + slot * kD + c * 8;
      const uint32_t dst = Sw128(e * kKvBlock + slot, c);
      CpAsync16(k_base + dst, ok ? p.k_pool + off : p.k_pool, ok);
      CpAsync16(v_base + dst, ok ? p.v_pool + off : p.v_pool, ok);
    }
  };

  // This thread's accumulator rows: row0 and row0 + 8 (r2 = 0, 1) of the CTA's 128.
  const int row0 = wg * kRowsPerWg + warp_in_wg * 16 + lane / 4;
  int q_index[2];
#pragma unroll
  for (int r2 = 0; r2 < 2; ++r2) {
    const int tok = (row0 + 8 * r2) / group;
    q_index[r2] = tok < n_tok ? fqi + m_tok0 + tok : -1;
  }
  const int min_q_index = fqi + m_tok0;

  // Q fragments of k16 step ks from the original q in shared memory (the mma.sync kernel's
  // ldmatrix addressing: lanes 0-15 rows 0-15 at chunk 2ks, lanes 16-31 at chunk 2ks + 1).
  const uint32_t q_smem = sbase + WgSmem::kQ;
  const uint32_t a_base = q_smem + (wg * kRowsPerWg + warp_in_wg * 16 + (lane & 15)) * (kD * 2);
  const uint32_t a_xor = ((lane >> 4) ^ (lane & 7)) << 4;
  auto load_q = [&](int ks, uint32_t(&r)[4]) {
    Ldmatrix4(r, a_base + (ks / 4) * 128 + ((32u * (ks % 4)) ^ a_xor));
  };

  if (t_begin < t_end) {
    issue_entries(t_begin);
    if (t_begin + 1 < t_end) issue_entries(t_begin + 1);
    CpAsyncCommit();
    CpAsyncWaitAll();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBlockM * (kD / 8) / kThreads; ++i) {
      const int id = tid + i * kThreads;
      const int row = id / (kD / 8), c = id % (kD / 8);
      const int tok = row / group, h = row - tok * group;
      const bool ok = tok < n_tok;
      CpAsync16(q_smem + Swz<kD>(row, c), ok ? q_row_ptr(tok, h) + c * 8 : p.q, ok);
    }
    issue_kv(t_begin, 0);
    if (t_begin + 2 < t_end) issue_entries(t_begin + 2);
    CpAsyncCommit();  // group of tile t_begin (with Q)
    if (t_begin + 1 < t_end) {
      issue_kv(t_begin + 1, 1);
      if (t_begin + 3 < t_end) issue_entries(t_begin + 3);
    }
    CpAsyncCommit();  // group of tile t_begin + 1
  }

  float o[64], s[32];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;  // never read (the first k16 step has scale-d 0)
  uint32_t qa[kQkSteps][4], pa[kPvSteps][4];
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
    for (int j = 0; j < 4; ++j) pa[kk][j] = 0;
  }
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // kRotateQ: q' = R_{-delta} q into the A fragments, from the original q (dims i < 64 in k16
  // steps ks < 4, their partners i + 64 in the same registers of step ks + 4), with the table's
  // cos/sin in fp32 and one rounding to bf16, the arithmetic of the mma.sync kernel's Rotate8.
  int cur_delta = 0;
  auto rotate_q = [&](int delta) {
    const float* cs = p.rope_cos + static_cast<int64_t>(delta) * (kD / 2);
    const float* sn = p.rope_sin + static_cast<int64_t>(delta) * (kD / 2);
#pragma unroll
    for (int ks = 0; ks < kQkSteps / 2; ++ks) {
      uint32_t lo[4], hi[4];
      load_q(ks, lo);
      load_q(ks + kQkSteps / 2, hi);
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // columns 0-7 / 8-15 of the step: registers 2h, 2h + 1
        const int dim = 16 * ks + 8 * h + 2 * (lane & 3);
        const float2 c = __ldg(reinterpret_cast<const float2*>(cs + dim));
        const float2 sv = __ldg(reinterpret_cast<const float2*>(sn + dim));
        const float sa = -sv.x, sb = -sv.y;
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // rows +0 / +8
          const int j = 2 * h + r;
          const float2 xa = UnpackBf16(lo[j]), xb = UnpackBf16(hi[j]);
          qa[ks][j] = PackBf16(xa.x * c.x - xb.x * sa, xa.y * c.y - xb.y * sb);
          qa[ks + kQkSteps / 2][j] = PackBf16(xa.x * sa + xb.x * c.x, xa.y * sb + xb.y * c.y);
        }
      }
    }
    cur_delta = delta;
  };

  // The P V of the previous pass, issued behind the next pass's Q K^T: its V stage.
  bool pv_pending = false;
  uint32_t pv_v = 0;
  auto issue_pv = [&](uint32_t v_smem) {
    WgmmaFence();  // also behind Q K^T: ptxas puts a warpgroup.arrive here otherwise
    const uint64_t desc0 = WgmmaDesc128(v_smem, /*lbo=*/WgSmem::kHalfBytes, /*sbo=*/1024);
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) WgmmaPv(o, pa[kk], DescAdvance(desc0, kk * 16 * 128));
    WgmmaCommit();
  };

  // kRotateQ: whether a tile is plain (every valid entry carries cur_delta, so the tile is one
  // pass with q' as it is and runs kNone's loop body exactly) comes from the plan, which found
  // the tiles where that fails (the breaks, paged_prefill_attention.h): next_break is the first
  // such tile after the last one taken out of line, so a plain tile costs a compare, with no
  // look at its entries. A tile that is not plain loads the break after it (global memory, read
  // a tile later). The plan's breaks assume q' at the delta the previous tile's passes leave,
  // which holds inside a range; the range's first tile (q' = q) has its own (work word 6).
  const int* breaks = p.breaks + item.break_start;
  // Warms L1 with the cos/sin rows (256 B each) of tile t's deltas, found not plain a tile ahead:
  // its q' rebuild then reads L1 instead of waiting on L2 or HBM (K/V streaming evicts the table)
  // while the tensor cores idle. A thread a line: entry tid / 4, table (tid / 2) % 2, half tid % 2.
  auto prefetch_rope = [&](int t) {
    if (tid < kEntriesPerTile * 4 && t < t_end) {
      const int4 x = entry_slot(t)[tid / 4];
      const float* table = (tid & 2) ? p.rope_sin : p.rope_cos;
      if (x.z > 0) PrefetchL1(table + static_cast<int64_t>(x.y) * (kD / 2) + (tid & 1) * 32);
    }
  };
  bool next_plain = true;
  int next_break = 0;
  if constexpr (kRot == PrefillRotation::kRotateQ) {
    if (t_begin < t_end) {
      next_break = item.first_break;
      next_plain = t_begin < next_break;
      if (!next_plain) {
        prefetch_rope(t_begin);  // lands while Q and the first K/V tiles do
        next_break = LoadBreak(breaks, t_begin + 1);
      }
    }
  }

  for (int t = t_begin; t < t_end; ++t) {
    const int j = t - t_begin;
    CpAsyncWait<1>();  // this tile's group landed; the next one may still be in flight
    FenceProxyAsyncShared();
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) load_q(ks, qa[ks]);
    }
    if (t + 2 < t_end) {
      issue_kv(t + 2, (j + 2) % kStages);
      if (t + 4 < t_end) issue_entries(t + 4);
    }
    CpAsyncCommit();

    const int4* ent = entry_slot(t);
    const int4 e0 = ent[0], e1 = ent[1], e2 = ent[2], e3 = ent[3];
    const uint32_t k_smem = sbase + WgSmem::kK + (j % kStages) * WgSmem::kTileBytes;
    const uint32_t v_smem = sbase + WgSmem::kV + (j % kStages) * WgSmem::kTileBytes;

    // One pass over the tile's entries in `active` (the others masked). 0xF: every entry, which
    // masks only slots past an entry's valid count (0 for the zero-filled records past the table).
    // `plan`: this pass decides tile t + 1 (plan_next). Exactly one pass of a tile may: plan_next
    // consumes the break at t + 1 (next_break moves past it), so a second call on a tile of
    // several passes would find t + 1 < next_break and take the break for a plain tile.
    auto run_pass = [&](int active, bool plan) {
      // S = Q K^T; then the previous pass's P V, which runs while this pass's softmax does.
      FenceOperands(o);
      FenceOperands(qa);
      FenceOperands(pa);
      WgmmaFence();
      const uint64_t desc0 = WgmmaDescKMajor128(k_smem);
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) {
        const uint64_t desc = DescAdvance(desc0, (ks / 4) * WgSmem::kHalfBytes + (ks % 4) * 32);
        if (ks == 0) {
          WgmmaQk<false>(s, qa[ks], desc);
        } else {
          WgmmaQk<true>(s, qa[ks], desc);
        }
      }
      WgmmaCommit();
      // While the tensor cores run: whether the next tile is a plain pass (see next_break).
      auto plan_next = [&] {
        if constexpr (kRot == PrefillRotation::kRotateQ) {
          if (!plan) return;  // a later pass of a tile that is not plain: already decided
          // Not plain: t + 1 == next_break (next_break > t always); the break after it is
          // breaks[t + 2], at most the second sentinel where t + 1 is the sequence's last tile.
          next_plain = t + 1 < next_break;
          if (!next_plain) {
            prefetch_rope(t + 1);
            next_break = LoadBreak(breaks, next_break + 1);
          }
        }
      };
      if (pv_pending) {
        issue_pv(pv_v);
        plan_next();
        WgmmaWait<1>();
      } else {
        plan_next();
        WgmmaWait<0>();
      }
      FenceOperands(s);

      // Mask invalid slots, entries of other deltas and keys past each row's own index.
      const bool full =
          e0.z == kKvBlock && e1.z == kKvBlock && e2.z == kKvBlock && e3.z == kKvBlock;
      if (!full || active != 0xF || e3.w + kKvBlock - 1 > min_q_index) {
        const int key0[4] = {e0.w, e1.w, e2.w, e3.w};
        const int nv[4] = {(active & 1) ? e0.z : 0, (active & 2) ? e1.z : 0,
                           (active & 4) ? e2.z : 0, (active & 8) ? e3.z : 0};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          // Column 8(i/4) + 2(l%4) + i%2: entry i / 8, slot 8((i/4)%2) + 2(l%4) + i%2.
          const int slot = ((i >> 2) & 1) * 8 + 2 * (lane & 3) + (i & 1);
          const int e = i >> 3;
          if (slot >= nv[e] || key0[e] + slot > q_index[(i >> 1) & 1]) s[i] = -INFINITY;
        }
      }

      // Online softmax (exp2 domain), rows r2 = 0, 1: elements 4q + 2r2 + {0, 1}.
      float alpha[2];
#pragma unroll
      for (int r2 = 0; r2 < 2; ++r2) {
        float mx = -INFINITY;
#pragma unroll
        for (int q = 0; q < 8; ++q) mx = fmaxf(mx, fmaxf(s[4 * q + 2 * r2], s[4 * q + 2 * r2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[r2], mx);
        const float m_scaled = m_new == -INFINITY ? 0.f : m_new * p.scale_log2;
        alpha[r2] = Exp2(m_run[r2] * p.scale_log2 - m_scaled);
        m_run[r2] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float pr = Exp2(fmaf(s[4 * q + 2 * r2 + c], p.scale_log2, -m_scaled));
            s[4 * q + 2 * r2 + c] = pr;
            sum += pr;
          }
        }
        l_run[r2] = l_run[r2] * alpha[r2] + sum;
      }

      // Unconditional (nothing is in flight without a pending P V): ptxas does not correlate the
      // two pv_pending branches, and with a conditional wait it serializes every wgmma.
      WgmmaWait<0>();
      FenceOperands(o);
      FenceOperands(s);  // P is packed below, after the previous P V has finished reading pa
      // O is rescaled only when some row of the warp got a new maximum.
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          pa[kk][jj] = PackBf16(s[8 * kk + 2 * jj], s[8 * kk + 2 * jj + 1]);
        }
      }
      pv_v = v_smem;
      pv_pending = true;
    };

    if (kRot == PrefillRotation::kNone || next_plain) {
      run_pass(0xF, true);
    } else {
      // One pass per distinct delta among the tile's entries, the entries of other deltas masked.
      int todo = (e0.z > 0 ? 1 : 0) | (e1.z > 0 ? 2 : 0) | (e2.z > 0 ? 4 : 0) | (e3.z > 0 ? 8 : 0);
      bool first_pass = true;  // the pass that decides tile t + 1 (see run_pass)
      do {
        const int first = __ffs(todo) - 1;
        const int d = first == 0 ? e0.y : first == 1 ? e1.y : first == 2 ? e2.y : e3.y;
        const int active = todo & ((e0.y == d ? 1 : 0) | (e1.y == d ? 2 : 0) | (e2.y == d ? 4 : 0) |
                                   (e3.y == d ? 8 : 0));
        if (d != cur_delta) rotate_q(d);
        todo &= ~active;
        run_pass(active, first_pass);
        first_pass = false;
      } while (todo != 0);
    }
  }
  if (pv_pending) {
    FenceOperands(o);
    FenceOperands(pa);
    issue_pv(pv_v);
    WgmmaWait<0>();
    FenceOperands(o);
  }

  // Epilogue: normalize and store (bf16 to out, or fp32 + log-sum-exp to the split workspace).
#pragma unroll
  for (int r2 = 0; r2 < 2; ++r2) {
    float l = l_run[r2];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = row0 + 8 * r2;
    const int tok = row / group, h = row - tok * group;
    if (tok >= n_tok) continue;
    if (partial < 0) {
      __nv_bfloat16* dst =
          p.out +
          (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * group + h) * kD +
          2 * (lane & 3);
#pragma unroll
      for (int q = 0; q < kD / 8; ++q) {
        *reinterpret_cast<uint32_t*>(dst + 8 * q) =
            PackBf16(o[4 * q + 2 * r2] * inv, o[4 * q + 2 * r2 + 1] * inv);
      }
    } else {
      const int64_t prow = (static_cast<int64_t>(partial) * p.num_kv_heads + kvh) * kBlockM + row;
      float* dst = p.part_o + prow * kD + 2 * (lane & 3);
#pragma unroll
      for (int q = 0; q < kD / 8; ++q) {
        *reinterpret_cast<float2*>(dst + 8 * q) =
            make_float2(o[4 * q + 2 * r2] * inv, o[4 * q + 2 * r2 + 1] * inv);
      }
      if ((lane & 3) == 0) {
        p.part_lse[prow] = l > 0.f ? m_run[r2] * p.scale_log2 + __log2f(l) : -INFINITY;
      }
    }
  }
}

template <PrefillRotation kRot>
absl::Status LaunchKernel(const PagedPrefillPlan& plan, const Params& params, cudaStream_t stream) {
  static const absl::Status attr_status = [] {
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(PagedPrefillWgmmaKernel<kRot>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              WgSmem::kAlloc));
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(PagedPrefillWgmmaKernel<kRot>,
                                              cudaFuncAttributePreferredSharedMemoryCarveout,
                                              cudaSharedmemCarveoutMaxShared));
    return absl::OkStatus();
  }();
  if (!attr_status.ok()) return attr_status;
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(PagedPrefillWgmmaKernel<kRot>,
                                        dim3(plan.num_work_items(), plan.shape().num_kv_heads),
                                        dim3(kThreads), WgSmem::kAlloc, stream, params));
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchWgmmaAttention(const PagedPrefillPlan& plan, const Params& params,
                                  PrefillRotation rotation, cudaStream_t stream) {
  if (plan.shape().head_dim != kD) {
    return absl::InvalidArgumentError(absl::StrCat("paged prefill (wgmma): head_dim ",
                                                   plan.shape().head_dim, " unsupported (128)"));
  }
  switch (rotation) {
    case PrefillRotation::kRotateQ:
      return LaunchKernel<PrefillRotation::kRotateQ>(plan, params, stream);
    case PrefillRotation::kNone:
      return LaunchKernel<PrefillRotation::kNone>(plan, params, stream);
    case PrefillRotation::kRotateK:
      break;
  }
  return absl::InvalidArgumentError("paged prefill (wgmma): only kRotateQ and kNone");
}

}  // namespace lazyattn::prefill_internal
