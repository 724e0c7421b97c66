#include "services/worker/cuda/decode_table_gather.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

// Grid (x: entry tiles, y: rows). Each entry is one thread's: the store slot's entries below
// `from` are read, the rest come from the patch and are written back to the slot.
__global__ void GatherDecodeTablesKernel(const DecodeTableRow* __restrict__ rows,
                                         const KvBlockEntry* __restrict__ patch,
                                         KvBlockEntry* __restrict__ store, int64_t capacity,
                                         KvBlockEntry* __restrict__ dense, int width) {
  const int d = blockIdx.y;
  const DecodeTableRow r = rows[d];
  KvBlockEntry* slot = r.slot >= 0 ? store + int64_t{r.slot} * capacity : nullptr;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    KvBlockEntry e = 0;
    if (i < r.n) {
      if (i >= r.from) {
        e = patch[r.patch + (i - r.from)];
        if (slot != nullptr) slot[i] = e;
      } else {
        e = slot[i];
      }
    }
    dense[int64_t{d} * width + i] = e;
  }
}

}  // namespace

absl::Status GatherDecodeTablesCuda(const DecodeTableRow* rows, int num_rows,
                                    const KvBlockEntry* patch, KvBlockEntry* store,
                                    int64_t capacity, KvBlockEntry* dense, int width,
                                    cudaStream_t stream) {
  if (num_rows <= 0 || width <= 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const dim3 grid(std::min((width + kThreads - 1) / kThreads, 32), num_rows);
  GatherDecodeTablesKernel<<<grid, kThreads, 0, stream>>>(rows, patch, store, capacity, dense,
                                                          width);
  RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace lazyattn
