// One decode row's table as the gather kernel takes it (decode_table_store.h plans them,
// decode_table_gather.h applies them). Shared by host and device code, hence this header alone.
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_ROW_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_ROW_H_

#include <cstdint>

namespace lazyattn {

// from > 0 only with a slot.
struct DecodeTableRow {
  int32_t slot = -1;   // store row, or -1: the whole table is in the patch, the store untouched
  int32_t from = 0;    // entries [0, from) are the slot's already
  int32_t n = 0;       // entries in all
  int32_t patch = 0;   // index in the patch list of entry `from`
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_ROW_H_
