// One entry of a request's KV block table, packed into 64 bits.
//
// The table lists, in sequence order, the physical KV blocks a request attends to. Each entry says
// which block, the RoPE offset `delta` of the segment the block belongs to (the global position of
// that segment's first token; keys in the block were rotated at segment-local positions and are
// rotated forward by `delta` at attention time), and how many of the block's slots hold tokens (a
// segment's last block may be partly filled; the next segment starts on a fresh block).
//
// Layout (one 64-bit load in the decode kernel, then register shifts):
//   bits  0..31  physical block id   (up to 4,294,967,295 blocks)
//   bits 32..55  delta               (up to 16,777,215: far past 128K-token prompts; the paper's
//                                     reference packs 16 bits and stops at 65,535)
//   bits 56..63  valid slots          (1..255; block sizes up to 255 tokens)
// Shared by the CPU twins and the CUDA kernels, hence constexpr and host/device-callable.
#ifndef LAZYATTN_KERNELS_INCLUDE_KV_BLOCK_ENTRY_H_
#define LAZYATTN_KERNELS_INCLUDE_KV_BLOCK_ENTRY_H_

#include <cstdint>

#if defined(__CUDACC__)
#define LAZYATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LAZYATTN_HOST_DEVICE inline
#endif

namespace lazyattn {

inline constexpr int kDefaultKvBlockSize = 16;
inline constexpr uint32_t kMaxKvDelta = (1u << 24) - 1;
inline constexpr uint32_t kMaxKvValidSlots = 255;

using KvBlockEntry = uint64_t;

// Preconditions: delta <= kMaxKvDelta, 1 <= valid <= kMaxKvValidSlots (callers validate; the
// packing masks so an out-of-range value cannot corrupt the neighbouring field).
LAZYATTN_HOST_DEVICE constexpr KvBlockEntry PackKvBlockEntry(uint32_t block, uint32_t delta,
                                                             uint32_t valid) {
  return static_cast<uint64_t>(block) | (static_cast<uint64_t>(delta & kMaxKvDelta) << 32) |
         (static_cast<uint64_t>(valid & 0xffu) << 56);
}
LAZYATTN_HOST_DEVICE constexpr uint32_t KvEntryBlock(KvBlockEntry e) {
  return static_cast<uint32_t>(e);
}
LAZYATTN_HOST_DEVICE constexpr uint32_t KvEntryDelta(KvBlockEntry e) {
  return static_cast<uint32_t>(e >> 32) & kMaxKvDelta;
}
LAZYATTN_HOST_DEVICE constexpr uint32_t KvEntryValid(KvBlockEntry e) {
  return static_cast<uint32_t>(e >> 56);
}

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_INCLUDE_KV_BLOCK_ENTRY_H_
