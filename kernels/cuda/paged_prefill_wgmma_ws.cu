// Paged prefill attention on Hopper wgmma with warp specialization (PrefillKernel::kWgmmaWs,
// sm_90a): FlashAttention-3's CTA shape on the same function, plan, split-KV partials and merge
// as the mma.sync kernel (paged_prefill_attention.h has the contract). head_dim 128, kRotateQ
// and kNone only. The math of a tile (RS Q K^T, softmax, P V, masking, kRotateQ's passes and
// breaks) and the layouts it relies on (K/V swizzle, descriptors, fragment layouts, Q in
// registers, the plain-tile decision) are derived in paged_prefill_wgmma_ops.cuh's header; this
// file holds who loads, how loads are handed over, and how the two consumer warpgroups share the
// tensor cores.
//
// CTA = 3 warpgroups (384 threads), one CTA an SM, one work item (128 query rows of one KV head):
//   warpgroup 0, producer:  setmaxnreg.dec to kProducerRegs. Warp w (0..3) gathers table entry w
//     of every K tile: it alone reads the entry from global memory, copies the 16 slots' K and V
//     rows (16 bytes a lane, cp.async with src-size 0 past the entry's valid count, so V rows of
//     invalid slots are zeros, never pool garbage) into the stage's swizzled tiles, and lane 0
//     copies the entry record itself into the stage (the consumers mask with it).
//   warpgroups 1, 2, consumers: setmaxnreg.inc to kConsumerRegs; consumer c owns query rows
//     64c..64c+63 (wgmma's M), loads them into shared memory itself (the original q, which
//     kRotateQ rotates from) and into registers (RS form), and runs the tile loop on the stages
//     (S of this pass issued, then P V of the previous pass; where ptxas puts the wait for that
//     P V: paged_prefill_wgmma_ops.cuh).
// No CTA-wide barrier after the prologue: stages are handed over by mbarriers, and the two
// consumers take turns issuing their GEMMs through two named barriers (ping-pong, kPingPong).
//
// ---- Stage protocol (kStages stages; tile j = t - t_begin of the work item, j = 0..n-1) -------
// Stage of tile j: s = j % kStages, use u = j / kStages (how many tiles used s before j).
//   full[s]  init count kWgThreads (128): every producer thread arrives once per tile of s.
//   empty[s] init count kConsumerThreads (256): every consumer thread arrives once per tile of
//            s, after its own last read of the stage (CUTLASS's consumer_release: each reading
//            thread releases; one lane per warp after __syncwarp() is also ordered by the memory
//            model, but compute-sanitizer racecheck flagged the entry records' reuse then).
// Producer thread, iteration j (its loop, step by step, and why it fences its own copies:
//   paged_prefill_wgmma_ws_producer.cuh): from j = kStages on, waits for the release of tile
//   j - kStages (empty[s] parity (u - 1) & 1) before it copies tile j into s; keeps kCopyLag
//   copy groups in flight; arrives on full[] once per tile, in tile order, once its copies of
//   that tile landed and were fenced. So completion u of full[s] is tile s + u * kStages.
// Consumer thread, tile j: wait full[s] parity u & 1, read the 4 entry records of s, run the
//   tile's passes (1 pass, or 1 per distinct delta in kRotateQ; at least 1). Stage s is
//   released (empty[s]) once the wgmmas reading it are done: K by the wait for S in each pass of
//   tile j, V by the wait for the P V of tile j's last pass, which is issued in tile j+1's first
//   pass (after the wait for full of tile j+1) or after the loop for the last tile. So a
//   consumer thread arrives on empty[s] exactly once per tile, in tile order.
// Why it cannot deadlock: the producer at iteration j has signalled tiles <= j-1-kCopyLag and
//   waits for the release of tile j - kStages, which the consumers give in tile j-kStages+1's
//   first pass; they can reach it when j-kStages+1 <= j-1-kCopyLag, i.e. kStages >= kCopyLag+2
//   (static_assert). kStages = kCopyLag + 3 leaves one tile of slack, so the producer's refill is
//   off the consumers' critical path. No phase can be skipped: a phase of full[s] needs the
//   previous release of s, which needs every consumer thread to have waited the previous phase,
//   and vice versa for empty[s]. The producer and both consumers walk the same n tiles (one
//   work item per CTA, n from the same words), and every thread arrives unconditionally.
//
// ---- Ping-pong (kPingPong; named barriers kSchedBar + c, 256 threads = both consumers) --------
// Each pass of consumer c: bar.sync (kSchedBar + c) before its first wgmma, bar.arrive
// (kSchedBar + 1 - c) right after its last wgmma of the pass is issued. So the GEMMs of the two
// consumers are issued in turns, and while the tensor cores run one consumer's, the other
// does its softmax. Balance: both consumers run the same passes (same tiles, same entries, same
// breaks), say N. Barrier kSchedBar + 1 completes N times: consumer 1's N syncs with consumer
// 0's N arrivals. Barrier kSchedBar + 0: consumer 0's N syncs plus ONE more after its loop, with
// consumer 1's one arrival before its loop (which lets consumer 0 go first) plus its N pass
// arrivals. Every completion pairs one sync group with one arrival group; at most one arrival
// group is pending at any time (a consumer's arrival for pass k+1 needs its sync of pass k+1,
// which needs the other's arrival of pass k+1 or k), so no arrival is counted in the wrong
// completion, and none is left pending at exit (also with N = 0).
//
// Registers: __launch_bounds__(384, 1) gives ptxas 168 registers a thread at launch (65,536 /
// 384, rounded down to 8), and setmaxnreg moves them from a per-CTA pool: producer 168 -> 24
// frees 144 x 128, consumers 168 -> 240 take 72 x 256, the same 18,432. setmaxnreg.inc blocks
// until the pool has them, so a kernel compiled to fewer than 168 registers at launch would
// hang: the launcher checks cudaFuncAttributes::numRegs == 168 before the first launch and
// refuses (Internal) otherwise. No mbarrier wait can last forever either: past kWaitLimitNs the
// producer traps and a consumer gives up and writes NaN (MbarWait), so a protocol mistake shows
// as a CUDA error or a NaN result, not a hung device.
//
// Shared memory: Q 32 KB ([128 rows][256 B], XOR swizzle, read by ldmatrix), kStages x (K 16 KB
// + V 16 KB) in wgmma's 128-byte swizzle, kStages x 4 entry records, 2 x kStages mbarriers.
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
#include "kernels/cuda/paged_prefill_wgmma_ws.cuh"
#include "kernels/cuda/paged_prefill_wgmma_ws_producer.cuh"
#include "kernels/cuda/paged_prefill_wgmma_ws_sync.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"
#include "kernels/cuda/wgmma_primitives.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "paged_prefill_wgmma_ws.cu uses wgmma/setmaxnreg: compile it for sm_90a only"
#endif

namespace lazyattn::prefill_internal {
namespace {

constexpr int kD = 128;
constexpr int kWgThreads = 128;
constexpr int kThreads = 3 * kWgThreads;  // producer + 2 consumers
constexpr int kConsumerThreads = 2 * kWgThreads;
constexpr int kRowsPerWg = kBlockM / 2;  // 64: wgmma's M
constexpr int kQkSteps = kD / 16;
constexpr int kPvSteps = kBlockN / 16;
constexpr int kLaunchRegs = 168;  // 65,536 / 384 rounded down to a multiple of 8
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
static_assert(kProducerRegs * kWgThreads + kConsumerRegs * kConsumerThreads <=
                  kLaunchRegs * kThreads,
              "setmaxnreg.inc would wait forever for registers the pool never has");
// Named barriers (0 is __syncthreads): the schedulers' turn barriers, one per consumer, and the
// barrier a consumer's own 128 threads pass once its Q rows landed.
constexpr int kSchedBar = 1;  // + consumer index
constexpr int kQBar = 3;      // + consumer index

template <int kStages>
struct WsSmem {
  static constexpr int kNumStages = kStages;  // for RunWsProducer
  static constexpr int kHeadDim = kD;
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kHalfBytes = kBlockN * 128;  // [64 keys][64 dims]
  static constexpr int kTileBytes = 2 * kHalfBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;                             // [kStages]
  static constexpr int kV = kK + kStages * kTileBytes;                // [kStages]
  static constexpr int kEnt = kV + kStages * kTileBytes;              // int4 [kStages][4]
  static constexpr int kBar = kEnt + kStages * kEntriesPerTile * 16;  // full[], then empty[]
  static constexpr int kBytes = kBar + 2 * kStages * 8;
  static constexpr int kAlloc = kBytes + 1024;  // dynamic shared memory is only 16-byte aligned
  static_assert(kK % 1024 == 0 && kV % 1024 == 0 && kTileBytes % 1024 == 0,
                "swizzle atoms must start 1024-byte aligned");
  static_assert(kAlloc <= 227 * 1024, "more shared memory than a CTA may have");
};

template <PrefillRotation kRot, int kStages, bool kPingPong>
__global__ void __launch_bounds__(kThreads, 1) PagedPrefillWgmmaWsKernel(const Params p) {
  static_assert(kRot == PrefillRotation::kRotateQ || kRot == PrefillRotation::kNone);
  using L = WsSmem<kStages>;
  constexpr int kCopyLag = kStages - 3;  // cp.async groups a producer thread keeps in flight
  static_assert(kCopyLag >= 1 && kStages >= kCopyLag + 2, "see the stage protocol");
  // Launched overlapped: wait, then let the next kernel launch (launch_overlap.cuh).
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const uint32_t sbase = SmemAddr(smem);
  const int tid = threadIdx.x, lane = tid & 31;
  const int kvh = blockIdx.y;
  const WorkItem item = LoadWorkItem(p, blockIdx.x);
  const int t_begin = item.t_begin, t_end = item.t_end;
  auto full_bar = [&](int s) { return sbase + L::kBar + 8 * s; };
  auto empty_bar = [&](int s) { return sbase + L::kBar + 8 * (kStages + s); };

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_bar(s), kWgThreads);
      MbarInit(empty_bar(s), kConsumerThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers exist before anyone uses them

  if (tid < kWgThreads) {
    // ---------------- producer (paged_prefill_wgmma_ws_producer.cuh) ----------------
    SetMaxNRegDec<kProducerRegs>();
    RunWsProducer<L, kCopyLag>(p, item, kvh, tid, sbase);
    return;  // no named barrier or later CTA-wide barrier counts the producer
  }

  // ---------------- consumers ----------------
  SetMaxNRegInc<kConsumerRegs>();
  const int cw = tid / kWgThreads - 1;  // consumer 0 or 1
  const int ctid = tid - kWgThreads;    // 0..255
  const int wtid = tid % kWgThreads;    // thread of the consumer warpgroup
  const int warp_in_wg = wtid / 32;
  const int m_tok0 = item.m_tok0, n_tok = item.n_tok, partial = item.partial;
  const int q_start = item.q_start, fqi = item.first_query_index;
  const int group = p.group;

  auto q_row_ptr = [&](int tok, int h) {
    return p.q +
           (static_cast<int64_t>(q_start + m_tok0 + tok) * p.num_heads + kvh * group + h) * kD;
  };
  const uint32_t q_smem = sbase + L::kQ;
  // This consumer's 64 Q rows (the original q) into shared memory: 8 chunks a thread.
#pragma unroll
  for (int i = 0; i < kRowsPerWg * (kD / 8) / kWgThreads; ++i) {
    const int id = wtid + i * kWgThreads;
    const int row = cw * kRowsPerWg + id / (kD / 8), ch = id % (kD / 8);
    const int tok = row / group, h = row - tok * group;
    const bool ok = tok < n_tok;
    CpAsync16(q_smem + Swz<kD>(row, ch), ok ? q_row_ptr(tok, h) + ch * 8 : p.q, ok);
  }
  CpAsyncCommit();

  // This thread's accumulator rows: row0 and row0 + 8 (r2 = 0, 1) of the CTA's 128.
  const int row0 = cw * kRowsPerWg + warp_in_wg * 16 + lane / 4;
  int q_index[2];
#pragma unroll
  for (int r2 = 0; r2 < 2; ++r2) {
    const int tok = (row0 + 8 * r2) / group;
    q_index[r2] = tok < n_tok ? fqi + m_tok0 + tok : -1;
  }
  const int min_q_index = fqi + m_tok0;

  const uint32_t a_base = q_smem + (cw * kRowsPerWg + warp_in_wg * 16 + (lane & 15)) * (kD * 2);
  const uint32_t a_xor = ((lane >> 4) ^ (lane & 7)) << 4;
  auto load_q = [&](int ks, uint32_t(&r)[4]) {
    Ldmatrix4(r, a_base + (ks / 4) * 128 + ((32u * (ks % 4)) ^ a_xor));
  };

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

  CpAsyncWaitAll();
  NamedBarSync(kQBar + cw, kWgThreads);  // every row of this consumer's Q landed
#pragma unroll
  for (int ks = 0; ks < kQkSteps; ++ks) load_q(ks, qa[ks]);

  // kRotateQ: q' = R_{-delta} q into the A fragments from the original q (dims i and i + 64 in
  // the same register of k16 steps ks and ks + 4: paged_prefill_wgmma_ops.cuh).
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
      for (int h = 0; h < 2; ++h) {
        const int dim = 16 * ks + 8 * h + 2 * (lane & 3);
        const float2 cv = __ldg(reinterpret_cast<const float2*>(cs + dim));
        const float2 sv = __ldg(reinterpret_cast<const float2*>(sn + dim));
        const float sa = -sv.x, sb = -sv.y;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = 2 * h + r;
          const float2 xa = UnpackBf16(lo[j]), xb = UnpackBf16(hi[j]);
          qa[ks][j] = PackBf16(xa.x * cv.x - xb.x * sa, xa.y * cv.y - xb.y * sb);
          qa[ks + kQkSteps / 2][j] = PackBf16(xa.x * sa + xb.x * cv.x, xa.y * sb + xb.y * cv.y);
        }
      }
    }
    cur_delta = delta;
  };

  // The P V of the previous pass, issued behind the next pass's Q K^T, and its stage.
  bool pv_pending = false;
  int pv_stage = 0;
  auto issue_pv = [&](int stage) {
    WgmmaFence();
    const uint64_t desc0 = WgmmaDesc128(sbase + L::kV + stage * L::kTileBytes,
                                        /*lbo=*/L::kHalfBytes, /*sbo=*/1024);
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) WgmmaPv(o, pa[kk], DescAdvance(desc0, kk * 16 * 128));
    WgmmaCommit();
  };
  // Hands stage `stage` back to the producer (every wgmma of this warp reading it is done).
  auto release = [&](int stage) { MbarArrive(empty_bar(stage)); };

  // kRotateQ's plain-tile decision a tile ahead, from the plan's breaks
  // (paged_prefill_wgmma_ops.cuh).
  const int* breaks = p.breaks + item.break_start;
  const int entry_start = item.entry_start, num_entries = item.num_entries;
  // Warms L1 with the cos/sin rows of tile t's deltas (a hint; entries read from global memory,
  // since tile t's stage may not be full yet). Consumer 0's first 16 threads, a line each.
  auto prefetch_rope = [&](int t) {
    if (ctid < kEntriesPerTile * 4 && t < t_end) {
      const int e = t * kEntriesPerTile + ctid / 4;
      if (e < num_entries) {
        const int delta = __ldg(reinterpret_cast<const int*>(p.entries + entry_start + e) + 1);
        const float* table = (ctid & 2) ? p.rope_sin : p.rope_cos;
        PrefetchL1(table + static_cast<int64_t>(delta) * (kD / 2) + (ctid & 1) * 32);
      }
    }
  };
  bool next_plain = true;
  int next_break = 0;
  if constexpr (kRot == PrefillRotation::kRotateQ) {
    if (t_begin < t_end) {
      next_break = item.first_break;
      next_plain = t_begin < next_break;
      if (!next_plain) {
        prefetch_rope(t_begin);
        next_break = LoadBreak(breaks, t_begin + 1);
      }
    }
  }

  // Ping-pong: consumer 1's one arrival before the loop lets consumer 0 issue first (header).
  if constexpr (kPingPong) {
    if (cw == 1) NamedBarArrive(kSchedBar + 0, kConsumerThreads);
  }

  int stage = 0;
  uint32_t full_parity = 0;
  bool wait_failed = false;  // a full-barrier wait timed out: the protocol is broken (MbarWait)
  for (int t = t_begin; t < t_end; ++t) {
    MbarWait<false>(full_bar(stage), full_parity, wait_failed);
    const int4* ent = reinterpret_cast<const int4*>(smem + L::kEnt) + stage * kEntriesPerTile;
    const int4 e0 = ent[0], e1 = ent[1], e2 = ent[2], e3 = ent[3];
    const uint32_t k_smem = sbase + L::kK + stage * L::kTileBytes;

    // One pass over the entries in `active`. `first`: the tile's first pass, which decides tile
    // t + 1 (plan_next) and, its pending P V being the previous tile's last, releases the
    // previous tile's stage once that P V is done.
    auto run_pass = [&](int active, bool first) {
      FenceOperands(o);
      FenceOperands(qa);
      FenceOperands(pa);
      if constexpr (kPingPong) NamedBarSync(kSchedBar + cw, kConsumerThreads);
      WgmmaFence();
      const uint64_t desc0 = WgmmaDescKMajor128(k_smem);
#pragma unroll
      for (int ks = 0; ks < kQkSteps; ++ks) {
        const uint64_t desc = DescAdvance(desc0, (ks / 4) * L::kHalfBytes + (ks % 4) * 32);
        if (ks == 0) {
          WgmmaQk<false>(s, qa[ks], desc);
        } else {
          WgmmaQk<true>(s, qa[ks], desc);
        }
      }
      WgmmaCommit();
      auto plan_next = [&] {
        if constexpr (kRot == PrefillRotation::kRotateQ) {
          if (!first) return;
          next_plain = t + 1 < next_break;
          if (!next_plain) {
            prefetch_rope(t + 1);
            next_break = LoadBreak(breaks, next_break + 1);
          }
        }
      };
      const bool had_pv = pv_pending;
      if (pv_pending) {
        issue_pv(pv_stage);
        if constexpr (kPingPong) NamedBarArrive(kSchedBar + 1 - cw, kConsumerThreads);
        plan_next();
        WgmmaWait<1>();
      } else {
        if constexpr (kPingPong) NamedBarArrive(kSchedBar + 1 - cw, kConsumerThreads);
        plan_next();
        WgmmaWait<0>();
      }
      FenceOperands(s);

      const bool full =
          e0.z == kKvBlock && e1.z == kKvBlock && e2.z == kKvBlock && e3.z == kKvBlock;
      if (!full || active != 0xF || e3.w + kKvBlock - 1 > min_q_index) {
        const int key0[4] = {e0.w, e1.w, e2.w, e3.w};
        const int nv[4] = {(active & 1) ? e0.z : 0, (active & 2) ? e1.z : 0,
                           (active & 4) ? e2.z : 0, (active & 8) ? e3.z : 0};
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int slot = ((i >> 2) & 1) * 8 + 2 * (lane & 3) + (i & 1);
          const int e = i >> 3;
          if (slot >= nv[e] || key0[e] + slot > q_index[(i >> 1) & 1]) s[i] = -INFINITY;
        }
      }

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
          for (int cc = 0; cc < 2; ++cc) {
            const float pr = Exp2(fmaf(s[4 * q + 2 * r2 + cc], p.scale_log2, -m_scaled));
            s[4 * q + 2 * r2 + cc] = pr;
            sum += pr;
          }
        }
        l_run[r2] = l_run[r2] * alpha[r2] + sum;
      }

      // Unconditional (nothing is in flight without a pending P V): ptxas does not correlate the
      // two pv_pending branches, and with a conditional wait it serializes every wgmma.
      WgmmaWait<0>();
      FenceOperands(o);
      FenceOperands(s);
      if (first && had_pv) release(pv_stage);  // the previous tile's last P V is done
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
      pv_stage = stage;
      pv_pending = true;
    };

    if (kRot == PrefillRotation::kNone || next_plain) {
      run_pass(0xF, true);
    } else {
      int todo = (e0.z > 0 ? 1 : 0) | (e1.z > 0 ? 2 : 0) | (e2.z > 0 ? 4 : 0) | (e3.z > 0 ? 8 : 0);
      bool first_pass = true;
      // do-while: a tile runs at least one pass (with todo = 0, one fully masked pass), which
      // the protocol needs: a tile's first pass releases the previous stage and takes turns.
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
    if (++stage == kStages) {
      stage = 0;
      full_parity ^= 1;
    }
  }
  if (pv_pending) {
    FenceOperands(o);
    FenceOperands(pa);
    issue_pv(pv_stage);
    WgmmaWait<0>();
    FenceOperands(o);
    release(pv_stage);  // never waited on (no tile follows); keeps one release per tile
  }
  // Ping-pong: consumer 0's extra turn, which takes consumer 1's last arrival (header).
  if constexpr (kPingPong) {
    if (cw == 0) NamedBarSync(kSchedBar + 0, kConsumerThreads);
  }

  // Epilogue: normalize and store (bf16 to out, or fp32 + log-sum-exp to the split workspace).
#pragma unroll
  for (int r2 = 0; r2 < 2; ++r2) {
    float l = l_run[r2];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = wait_failed ? NAN : l > 0.f ? 1.f / l : 0.f;
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
        p.part_lse[prow] = wait_failed ? NAN
                           : l > 0.f   ? m_run[r2] * p.scale_log2 + __log2f(l)
                                       : -INFINITY;  // NaN: the merge then writes NaN
      }
    }
  }
}

template <PrefillRotation kRot, int kStages, bool kPingPong>
absl::Status LaunchKernel(const PagedPrefillPlan& plan, const Params& params, cudaStream_t stream) {
  void (*const kernel)(Params) = PagedPrefillWgmmaWsKernel<kRot, kStages, kPingPong>;
  constexpr int smem = WsSmem<kStages>::kAlloc;
  static const absl::Status attr_status = [kernel] {
    // setmaxnreg's register budget holds only if the kernel starts with 168 registers a thread
    // (file header); anything else could block the consumers forever, so it never launches.
    cudaFuncAttributes attr{};
    RETURN_IF_CUDA_ERROR(cudaFuncGetAttributes(&attr, kernel));
    if (attr.numRegs != kLaunchRegs || attr.maxThreadsPerBlock < kThreads) {
      return absl::InternalError(
          absl::StrCat("paged prefill (wgmma-ws): kernel built with ", attr.numRegs,
                       " registers and ", attr.maxThreadsPerBlock,
                       " threads a CTA; setmaxnreg needs ", kLaunchRegs, " and ", kThreads));
    }
    RETURN_IF_CUDA_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(
        kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    return absl::OkStatus();
  }();
  if (!attr_status.ok()) return attr_status;
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(kernel,
                                        dim3(plan.num_work_items(), plan.shape().num_kv_heads),
                                        dim3(kThreads), smem, stream, params));
  return absl::OkStatus();
}

template <PrefillRotation kRot>
absl::Status LaunchVariant(const PagedPrefillPlan& plan, const Params& params, int variant,
                           cudaStream_t stream) {
  switch (variant) {
    case 0:
      return LaunchKernel<kRot, 5, true>(plan, params, stream);
    case 1:
      return LaunchKernel<kRot, 5, false>(plan, params, stream);
    case 2:
      return LaunchKernel<kRot, 6, true>(plan, params, stream);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("paged prefill (wgmma-ws): variant ", variant, " out of range"));
}

}  // namespace

absl::Status LaunchWgmmaWsAttention(const PagedPrefillPlan& plan, const Params& params,
                                    PrefillRotation rotation, int variant, cudaStream_t stream) {
  if (plan.shape().head_dim != kD) {
    return absl::InvalidArgumentError(absl::StrCat("paged prefill (wgmma-ws): head_dim ",
                                                   plan.shape().head_dim, " unsupported (128)"));
  }
  switch (rotation) {
    case PrefillRotation::kRotateQ:
      return LaunchVariant<PrefillRotation::kRotateQ>(plan, params, variant, stream);
    case PrefillRotation::kNone:
      return LaunchVariant<PrefillRotation::kNone>(plan, params, variant, stream);
    case PrefillRotation::kRotateK:
      break;
  }
  return absl::InvalidArgumentError("paged prefill (wgmma-ws): only kRotateQ and kNone");
}

}  // namespace lazyattn::prefill_internal

namespace lazyattn {

int PrefillWgmmaWsVariants() { return prefill_internal::kWgmmaWsVariants; }

const char* PrefillWgmmaWsVariantName(int variant) {
  switch (variant) {
    case 0:
      return "pp-s5";
    case 1:
      return "nopp-s5";
    case 2:
      return "pp-s6";
  }
  return "?";
}

}  // namespace lazyattn
