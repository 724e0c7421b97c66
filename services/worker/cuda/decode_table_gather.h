// The device half of the persistent decode tables (decode_table_store.h): one launch per decode
// step writes each row's new entries into its sequence's store slot and gathers every row's table
// into the dense array PagedDecodeAttention reads ([rows][width], zero past a row's n).
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_GATHER_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_GATHER_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/include/kv_block_entry.h"
#include "services/worker/cuda/decode_table_row.h"

namespace lazyattn {

// rows [num_rows], patch (the rows' new entries, DecodeTableRow::patch indexes it), store
// [slots][capacity] and dense [num_rows][width]: device memory. Preconditions (the host planner
// guarantees them): n <= width, n <= capacity with a slot, from == 0 without one, no slot twice.
absl::Status GatherDecodeTablesCuda(const DecodeTableRow* rows, int num_rows,
                                    const KvBlockEntry* patch, KvBlockEntry* store,
                                    int64_t capacity, KvBlockEntry* dense, int width,
                                    cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_GATHER_H_
