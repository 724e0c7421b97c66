// Internal to the warp-specialized prefill kernel (paged_prefill_wgmma_ws.cu; sm_90a only): the
// inline PTX of its synchronization (setmaxnreg, named barriers, mbarriers) and the bounded
// mbarrier wait. Apart from the kernel so that its file holds the algorithm and the protocol.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_SYNC_CUH_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_SYNC_CUH_

#include <cstdint>

namespace lazyattn::prefill_internal {

// How long an mbarrier wait may last before MbarWait calls the protocol broken: far past any
// legitimate wait (a tile's copies land in microseconds, also under compute-sanitizer).
constexpr uint64_t kWaitLimitNs = 10'000'000'000ull;  // 10 s

template <int kRegs>
__device__ __forceinline__ void SetMaxNRegDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNRegInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Release semantics (the default): this thread's earlier memory operations are visible to a
// thread whose wait observes the phase this arrival completes.
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Waits until the phase of `bar` with parity `parity` has completed (acquire). Bounded by the
// protocol (file header). A wait past kWaitLimitNs means the protocol is broken:
//   kTrap (the producer): trap, so that the launch fails with a CUDA error instead of hanging.
//   !kTrap (the consumers): set `failed` and return; a thread with `failed` set skips its later
//     waits and writes NaN (the caller's epilogue), so the kernel ends with a visibly wrong
//     result (and the producer, left waiting for releases, traps). Not a trap here because a
//     trap in the consumers' code makes ptxas give up their setmaxnreg register budget (measured
//     with ptxas 13.0: 168 registers, spills, serialized wgmma).
template <bool kTrap>
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity, bool& failed) {
  if (failed || MbarTryWait(bar, parity)) return;
  const uint64_t start = GlobalTimerNs();
  for (uint32_t polls = 1;; ++polls) {
    if (MbarTryWait(bar, parity)) return;
    if ((polls & 255) == 0 && GlobalTimerNs() - start > kWaitLimitNs) {
      if constexpr (kTrap) {
        __trap();
      } else {
        failed = true;
        return;
      }
    }
  }
}

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_WGMMA_WS_SYNC_CUH_
