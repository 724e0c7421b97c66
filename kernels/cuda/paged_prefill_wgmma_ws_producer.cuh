// Internal to the warp-specialized prefill kernel (paged_prefill_wgmma_ws.cu; sm_90a only): the
// producer warpgroup's loop, which gathers the K/V tiles of the CTA's work item into the stages
// and hands them to the consumers through the full[] mbarriers. Apart from the kernel so that its
// file holds the consumers' algorithm and the protocol between the two sides; the part of the
// stage protocol (paged_prefill_wgmma_ws.cu's header) that concerns the producer is here.
//
// Producer thread, iteration j = 0..n-1 (tile j = t - t_begin of the work item; stage
// s = j % kStages, use u = j / kStages):
//   1. j >= kStages: wait empty[s] parity (u - 1) & 1 (completion u - 1 of empty[s] = every
//      consumer thread released tile j - kStages);
//   2. issue its cp.async of tile j into s, commit (one group per tile);
//   3. j >= kCopyLag: cp.async.wait_group kCopyLag (its groups <= j - kCopyLag landed),
//      fence.proxy.async.shared::cta, mbarrier.arrive full[(j - kCopyLag) % kStages].
//   After the loop: wait_group 0, fence, arrive full for tiles max(n - kCopyLag, 0)..n-1.
//   So each producer thread arrives exactly once per tile on its stage's full barrier, in tile
//   order, and completion u of full[s] is tile s + u * kStages.
// Why the producer fences (rather than cp.async.mbarrier.arrive.noinc and a fence in the
//   consumers): the PTX memory model orders generic-proxy writes before async-proxy reads
//   through a proxy fence by the writing thread followed by a release/acquire synchronization
//   (mbarrier.arrive has release semantics, try_wait acquire), the pattern CUTLASS uses for
//   shared-memory writes that TMA or wgmma read. cp.async's writes are generic-proxy writes of
//   the issuing thread once cp.async.wait_group returns; fence.proxy.async after it is exactly
//   that pattern. The .noinc form would let the producer run further ahead, but leaves the
//   fence to a thread that did not write, which the model does not spell out; kCopyLag groups
//   in flight per thread hide the copy latency instead.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_PRODUCER_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_PRODUCER_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/paged_prefill_internal.cuh"
#include "kernels/cuda/paged_prefill_wgmma_ops.cuh"
#include "kernels/cuda/paged_prefill_wgmma_ws_sync.cuh"
#include "kernels/cuda/tensor_core_primitives.cuh"
#include "kernels/cuda/wgmma_primitives.cuh"

namespace lazyattn::prefill_internal {

// The loop of producer thread `tid` (0..127, warpgroup 0; its setmaxnreg is the caller's) over
// the n = t_end - t_begin tiles of `item` for KV head `kvh`. L is the kernel's shared-memory
// layout (WsSmem: kNumStages stages of K and V tiles at kK / kV, kTileBytes each, in the
// 128-byte swizzle of paged_prefill_wgmma_ops.cuh; entry records at kEnt; full[] then empty[]
// mbarriers at kBar), all relative to `sbase`, the 1024-byte-aligned shared-memory base.
// kCopyLag: the cp.async groups a thread keeps in flight (the kernel's kStages - 3). Warp w
// copies table entry w of every tile. Returns after its last arrival on full[]; no later barrier
// counts the producer. A wait for a release past kWaitLimitNs traps (MbarWait).
template <class L, int kCopyLag>
__device__ __forceinline__ void RunWsProducer(const Params& p, const WorkItem& item, int kvh,
                                              int tid, uint32_t sbase) {
  constexpr int kStages = L::kNumStages;
  constexpr int kD = L::kHeadDim;
  static_assert(kEntriesPerTile == 4 && kKvBlock == 16, "producer warp w copies entry w");
  const int lane = tid & 31;
  const int t_begin = item.t_begin, t_end = item.t_end;
  auto full_bar = [&](int s) { return sbase + L::kBar + 8 * s; };
  auto empty_bar = [&](int s) { return sbase + L::kBar + 8 * (kStages + s); };
  const int w = tid / 32;  // the table entry of each tile this warp copies
  const int half = lane / 16, c = lane % 16;
  const int64_t kv_off = static_cast<int64_t>(kvh) * kKvBlock * kD;
  const __nv_bfloat16* k_head = p.k_pool + kv_off + half * kD + c * 8;
  const __nv_bfloat16* v_head = p.v_pool + kv_off + half * kD + c * 8;
  const int4* ent_src = p.entries + item.entry_start;
  const int num_entries = item.num_entries;
  const int n = t_end > t_begin ? t_end - t_begin : 0;
  // Entry (block, valid) of tile j, read one tile ahead so the gather never waits on it.
  auto load_entry = [&](int j, uint32_t& blk, int& valid) {
    const int e = (t_begin + j) * kEntriesPerTile + w;
    blk = 0;
    valid = 0;
    if (j < n && e < num_entries) {
      const int* rec = reinterpret_cast<const int*>(ent_src + e);
      blk = static_cast<uint32_t>(__ldg(rec));
      valid = __ldg(rec + 2);
    }
  };
  // Swizzled destinations of this lane's copies (the 128-byte swizzle of wgmma's K/V tiles,
  // paged_prefill_wgmma_ops.cuh): a lane-constant part, and the XOR of its chunk with key
  // row 2 (i % 4) + half of copy i.
  const uint32_t dst_lane = (c >> 3) * (kBlockN * 128) + (w * kKvBlock + half) * 128;
  uint32_t swz[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) swz[k] = ((c & 7) ^ (2 * k + half)) << 4;
  uint32_t blk, next_blk;
  int valid, next_valid;
  load_entry(0, next_blk, next_valid);
  bool never_fails = false;  // the producer's waits trap instead
  int s = 0;
  // Parity (u - 1) & 1 of the release the producer waits for at tile j = s + u * kStages;
  // first read at u = 1 (0), after the first wrap.
  uint32_t empty_parity = 1;
  for (int j = 0; j < n; ++j) {
    blk = next_blk;
    valid = next_valid;
    load_entry(j + 1, next_blk, next_valid);
    if (j >= kStages) MbarWait<true>(empty_bar(s), empty_parity, never_fails);
    if (lane == 0) {
      const int e = (t_begin + j) * kEntriesPerTile + w;
      const bool ok = e < num_entries;
      CpAsync16(sbase + L::kEnt + (s * kEntriesPerTile + w) * 16, ent_src + (ok ? e : 0), ok);
    }
    const uint32_t k_dst = sbase + L::kK + s * L::kTileBytes;
    const uint32_t v_dst = sbase + L::kV + s * L::kTileBytes;
    const int64_t blk_off = static_cast<int64_t>(blk) * p.block_stride;
#pragma unroll
    for (int i = 0; i < kKvBlock / 2; ++i) {
      const int slot = 2 * i + half;  // lanes 0-15 and 16-31: two 256-byte key rows
      const bool ok = slot < valid;
      // Chunk c of key row w * 16 + slot in the swizzled tile, written so that ptxas sees the
      // swizzle repeat every 4 copies (slot & 7 = 2 (i % 4) + half): 4 XOR terms and an
      // immediate instead of 8 registers, which at 24 registers a thread spilled one.
      const uint32_t dst = dst_lane + 2 * i * 128 + swz[i % 4];
      const int64_t off = blk_off + 2 * i * kD;
      // src-size 0 reads nothing: the unoffset row stands in for the address.
      CpAsync16(k_dst + dst, k_head + (ok ? off : 0), ok);
      CpAsync16(v_dst + dst, v_head + (ok ? off : 0), ok);
    }
    CpAsyncCommit();
    if (j >= kCopyLag) {
      CpAsyncWait<kCopyLag>();
      FenceProxyAsyncShared();
      const int done = j - kCopyLag;
      MbarArrive(full_bar(done % kStages));
    }
    if (++s == kStages) {
      s = 0;
      empty_parity ^= 1;
    }
  }
  CpAsyncWaitAll();
  FenceProxyAsyncShared();
  for (int j = n > kCopyLag ? n - kCopyLag : 0; j < n; ++j) MbarArrive(full_bar(j % kStages));
}

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_PRODUCER_CUH_
