// Internal to the paged prefill attention (not a public header): the tiling the plan
// (paged_prefill_plan.cc) schedules and both kernels run, and the sizes of the metadata records
// the plan writes and the kernels read. Apart from paged_prefill_internal.cuh so that the plan,
// which is host code, includes no device code.
#ifndef LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_TILING_H_
#define LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_TILING_H_

namespace lazyattn::prefill_internal {

// The plan's units: a work item is kBlockM query rows (row = token * group + head of the group)
// of one KV head over K tiles of kBlockN keys = kEntriesPerTile table entries of kKvBlock slots.
constexpr int kBlockM = 128;
constexpr int kBlockN = 64;
constexpr int kKvBlock = 16;
constexpr int kEntriesPerTile = kBlockN / kKvBlock;
constexpr int kSeqWords = 8, kEntryWords = 4, kWorkWords = 8, kCombineWords = 8;
// CTAs an SM of each kernel (their __launch_bounds__; PrefillCtasPerSm() reports them).
constexpr int kMmaSyncCtasPerSm = 2;
constexpr int kWgmmaCtasPerSm = 1;

// Most split-KV ranges of one query tile (the merge kernel holds two weights per lane).
constexpr int kMaxSplits = 64;

}  // namespace lazyattn::prefill_internal

#endif  // LAZYATTN_KERNELS_CUDA_PAGED_PREFILL_TILING_H_
