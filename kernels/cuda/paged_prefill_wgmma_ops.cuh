// Internal to the warp-specialized wgmma prefill kernel (paged_prefill_wgmma_ws.cu, its producer
// loop in paged_prefill_wgmma_ws_producer.cuh; sm_90a only): the inline PTX it issues beyond
// wgmma_primitives.cuh (its two wgmma shapes, the L1 prefetch, the uncached break load,
// cp.async's wait with a pending count, the descriptor advance) and the operand fences over its
// fragment arrays, apart from the kernel so that its file holds the algorithm and the stage
// protocol; and here, what both the producer and the consumers rely on: the layout of the K/V
// tiles in shared memory, the wgmma descriptors over them, the fragment layouts, why Q sits in
// registers, and how kRotateQ decides a plain tile.
//
// GEMMs, per consumer warpgroup (64 query rows, wgmma's M) and K tile of 64 keys (4 entries):
//   S = Q K^T   8 x wgmma.m64n64k16, A = q (registers), B = K (shared memory, K-major)
//   O += P V    4 x wgmma.m64n128k16, A = P (registers), B = V (shared memory, MN-major)
// with fp32 accumulators (S 32, O 64 registers a thread). The source orders a pass as
// FlashAttention-3's intra-warpgroup pipelining: issue S of this tile, then P V of the previous
// pass, wait for S only, mask and exponentiate S, then wait for P V and rescale O. ptxas,
// however, puts the wait for P V ahead of the softmax (the SASS of every instance, 2026-12-02:
// it waits for every wgmma in flight before the mask's in-place writes into S), so in the
// compiled kernel a consumer's softmax overlaps the other consumer's GEMMs (ping-pong), not its
// own P V. A form that keeps the wait after the softmax measured 1-3 % slower (docs/kernels.md).
//
// K and V tiles in the 128-byte-swizzle layout wgmma reads: [2 halves][64 keys][64 dims], half h
// holding dims 64h..64h+63, 128 bytes a key, 16-byte chunk c of key r at chunk c ^ (r & 7) of its
// row inside the 1024-byte 8-key atom (so every tile starts 1024-byte aligned). The producer
// writes this layout with cp.async; invalid slots are zero-filled (src-size 0), so pool garbage
// never reaches P V. Descriptors (PTX ISA "Matrix Descriptor Format" and "Canonical Layouts";
// CUTLASS cute/atom/mma_traits_sm90_gmma.hpp make_gmma_desc), in the canonical 128B-swizzle
// layouts with T = 8 bf16 per 16 bytes:
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
//
// Q in registers (a deviation from the SS form, on purpose): S = Q K^T reads A from registers
// (the mma.sync A fragment, loaded with ldmatrix from Q in shared memory, where each consumer
// keeps the original q of its 64 rows for the whole work item, in the mma.sync kernel's XOR
// swizzle). Why: an SS m64n64k16 reads 2 KB of A and 2 KB of B from shared memory per 32
// tensor-core cycles, i.e. the full 128 B/cycle of an SM, and both consumer warpgroups read the
// same K; with A in registers Q K^T needs half of that. It costs 32 registers a thread, and
// makes the deferred rotation register-only: q' = R_{-delta} q is computed from the original q
// in shared memory (never from an earlier q') straight into the A fragments, with no shared
// memory rewrite, no proxy fence and no barrier. A dimension i and its rotation partner i + 64
// sit in the same register of k16 steps ks and ks + 4, in the same thread.
//
// kRotateQ mirrors the mma.sync kernel: a tile whose 4 entries carry different deltas is done in
// one pass per distinct delta, entries of the other deltas masked; q' is rebuilt when the delta
// changes (once per document and work item). n64 per pass (one plan tile) rather than two plan
// tiles (n128): a pass's mask and delta are per plan tile, and S stays 32 registers. Whether a
// tile is plain (every valid entry at the current delta: nearly all tiles) is decided a tile
// ahead, in the previous tile's first pass while its wgmmas run, and a plain tile runs kNone's
// pass body: deciding it at the top of the tile, as the mma.sync kernel does, put a
// shared-memory load and a branch chain between the wait for the tile and Q K^T of every tile
// (measured on the first wgmma kernel: +5 % at encode4096, where every delta is 0). The decision
// is a compare against the plan's next break (the next tile that is not plain, which the host
// found: paged_prefill_attention.h), not a look at the tile's four entries: that look, eight
// shared-memory loads and their compares a tile, was most of what kRotateQ's steady tile
// executed beyond kNone's.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_OPS_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_OPS_CUH_

#include <cstdint>

#include "kernels/cuda/wgmma_primitives.cuh"

namespace lazyattn::prefill_internal {

// A hint: brings the line holding `ptr` (global memory) into L1.
__device__ __forceinline__ void PrefetchL1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(__cvta_generic_to_global(ptr)));
}

// breaks[i] (global memory, read-only for the kernel). Volatile asm so that ptxas keeps the load
// and its address arithmetic inside the rare branch that needs it instead of hoisting them into
// every tile.
__device__ __forceinline__ int LoadBreak(const int* breaks, int i) {
  int v;
  asm volatile(
      "{\n.reg .s64 a;\nmul.wide.s32 a, %1, 4;\nadd.s64 a, a, %2;\n"
      "ld.global.nc.b32 %0, [a];\n}\n"
      : "=r"(v)
      : "r"(i), "l"(breaks));
  return v;
}

// `desc` with its start address `bytes` (a multiple of 16) further: only the 14-bit address
// field changes, and it does not carry out while the operand stays in the 256 KB the field spans
// (shared memory here is 228 KB). One add per wgmma instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t DescAdvance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (static_cast<uint64_t>(static_cast<uint32_t>(desc >> 32)) << 32) | lo;
}

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// S (64 x 64 fp32 per warpgroup) = q (registers, 64 x 16 bf16) x K^T (K-major descriptor), or
// += with kAccumulate (scale-d; without it the accumulators are not read).
template <bool kAccumulate>
__device__ __forceinline__ void WgmmaQk(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(kAccumulate ? 1 : 0));
}

// O (64 x 128 fp32 per warpgroup) += P (registers, 64 x 16 bf16) x V (MN-major: imm-trans-b 1).
__device__ __forceinline__ void WgmmaPv(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

// WgmmaFenceOperand over every register of a fragment array.
template <int N>
__device__ __forceinline__ void FenceOperands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) WgmmaFenceOperand(r[i]);
}
template <int M, int N>
__device__ __forceinline__ void FenceOperands(uint32_t (&r)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int j = 0; j < N; ++j) WgmmaFenceOperand(r[i][j]);
  }
}

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_OPS_CUH_
