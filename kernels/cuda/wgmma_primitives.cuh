// Inline PTX wrappers for Hopper's warpgroup MMA (wgmma, sm_90a only) shared by the kernels that
// use it (skinny_wgmma_kernel.cu, paged_prefill_wgmma_ws.cu): shared-memory matrix descriptors for
// the 128-byte swizzle, the fence / commit / wait of the async pipeline, and the cross-proxy
// fence. The MMA instructions themselves (one shape per use) stay in the kernel that needs them.
//
// 128-byte swizzle: a tile whose rows are 128 bytes (64 bf16) is stored in 8-row atoms of 1024
// bytes, 16-byte chunk c of row r at chunk c ^ (r & 7). The hardware applies the XOR to address
// bits [4,6] from bits [7,9], so atoms must start 1024-byte aligned (descriptor base offset 0).
#ifndef LAZYATTN_KERNELS_CUDA_WGMMA_PRIMITIVES_CUH_
#define LAZYATTN_KERNELS_CUDA_WGMMA_PRIMITIVES_CUH_

#include <cstdint>

namespace lazyattn {

// Descriptor bits (PTX ISA, "Matrix Descriptor Format"): [0,14) start address >> 4, [16,30)
// leading dimension byte offset >> 4, [32,46) stride dimension byte offset >> 4, [62,64) swizzle
// mode (1 = 128-byte).
__device__ __forceinline__ uint64_t WgmmaDesc128(uint32_t smem_addr, uint32_t lbo_bytes,
                                                 uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(sbo_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

// K-major operand (the reduction dimension contiguous), 128-byte swizzle: rows of 128 bytes,
// 8-row atoms 1024 bytes apart (stride byte offset); the leading byte offset is unused in this
// mode (encoded 1, as the PTX ISA says it is assumed). Advancing K by 16 bf16 adds 32 bytes to
// the start address.
__device__ __forceinline__ uint64_t WgmmaDescKMajor128(uint32_t smem_addr) {
  return WgmmaDesc128(smem_addr, 16, 1024);
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the wgmma that
// follows: required before the first wgmma after registers it reads were written otherwise.
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// Closes the wgmmas issued since the last commit into one group.
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending of this warpgroup's committed groups are still running (groups
// complete in order: the older ones are done).
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving register reads or writes of `r` across the surrounding wgmma
// fence / wait (the asm statements are ordered among themselves, plain arithmetic is not): apply
// to accumulators after a wait before reading them, and before issuing.
__device__ __forceinline__ void WgmmaFenceOperand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}
__device__ __forceinline__ void WgmmaFenceOperand(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}

// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
// async proxy (wgmma, TMA) before a barrier hands them over.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_WGMMA_PRIMITIVES_CUH_
