// Decode block tables kept on the device between steps: the host half (plain C++, no CUDA), which
// decides for each decode row of a step what it keeps on the device and what it uploads
// (docs/kernels.md, "Block tables across steps").
//
// The device holds a store of slots() x capacity() table entries, one row per sequence
// (ForwardChunk::table_sequence) seen recently. For each decode row d of a step (device order) the
// host plans a DecodeTableRow: the sequence's store slot, the entries [0, from) that the slot holds
// already (the version the engine says is unchanged, ForwardChunk::table_unchanged), and the
// entries [from, n) that come in the step's patch list. One kernel (decode_table_gather.h) then
// writes the patch into the store and gathers every row into the dense [rows][width] table the
// decode kernel reads. Host work per step: O(rows + new entries), independent of the context; the
// gather reads every entry on the device (2 MB at 32 rows of 128K tokens: microseconds).
//
// The host also mirrors, per slot, the running sums that the checks need (valid slots, entries with
// a delta), so a chunk is validated over its new entries only (ValidateForwardChunk).
//
// A slot is trusted only for the version it was last given: a sequence seen at another version
// (a failed launch, a prefill chunk in between), or not at all, uploads its whole table. Not
// thread-safe (the runner's thread).
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_STORE_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_STORE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "services/worker/cuda/decode_table_row.h"
#include "services/worker/engine/model_runner.h"

namespace lazyattn {

class DecodeTableStore {
 public:
  // Checks chunk `index` as ValidateForwardChunks does, reading only the entries its sequence's
  // slot does not hold (all of them without one). Changes nothing.
  struct Checked {
    TableSummary summary;
    int64_t from = 0;  // leading entries the slot holds
  };
  absl::StatusOr<Checked> Check(const ForwardChunk& chunk, size_t index, const ModelConfig& config,
                                int64_t num_kv_blocks) const;

  // Starts a step of `rows` decode rows whose tables have at most `max_entries` entries: the store
  // grows (every slot forgotten) when it is too small, and true is returned: the caller must then
  // reallocate the device store to slots() x capacity() entries before the step's gather, with no
  // launched step still reading it. `in_use`: the rows' sequences, which no new one may evict.
  bool BeginStep(int rows, int64_t max_entries, const std::vector<uint64_t>& in_use);

  // Plans the next decode row (after BeginStep and Check): appends its row and its new entries
  // to `rows` and `patch`, and records the version as the slot's.
  void PlanRow(const ForwardChunk& chunk, int64_t from, std::vector<DecodeTableRow>* rows,
               std::vector<KvBlockEntry>* patch);

  // After a launch that may not have reached the device: nothing held may be trusted.
  void ForgetAll();

  // One step's decode rows planned at once (BeginStep, then PlanRow for each): `decode` in device
  // order, `from` what Check() returned for each.
  struct StepPlan {
    std::vector<DecodeTableRow> rows;
    std::vector<KvBlockEntry> patch;
    std::vector<int32_t> num_blocks;  // each row's entries (the decode kernel's num_blocks)
    bool store_grew = false;          // reallocate the device store first (BeginStep)
  };
  StepPlan PlanStep(std::span<const ForwardChunk* const> decode, std::span<const int64_t> from);

  // Forgets everything on destruction unless the launch it guards was enqueued whole: until
  // then the host plan may be ahead of the device.
  class LaunchGuard {
   public:
    explicit LaunchGuard(DecodeTableStore& store) : store_(store) {}
    ~LaunchGuard() {
      if (!launched_) store_.ForgetAll();
    }
    LaunchGuard(const LaunchGuard&) = delete;
    LaunchGuard& operator=(const LaunchGuard&) = delete;
    void Launched() { launched_ = true; }

   private:
    DecodeTableStore& store_;
    bool launched_ = false;
  };

  int slots() const { return static_cast<int>(slots_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t store_entries() const { return capacity_ * slots(); }

 private:
  struct Slot {
    uint64_t sequence = 0;  // 0: free
    uint64_t version = 0;
    int64_t last_step = 0;     // last step that used (or will use) it
    int64_t planned_step = 0;  // last step that planned a row on it
    std::vector<int64_t> keys;    // running sums over its entries: valid slots ...
    std::vector<int64_t> deltas;  // ... and entries with a nonzero delta
  };
  void Forget(int slot);
  int TakeSlot();  // a free slot, or the least recently used one this step does not use; -1

  std::vector<Slot> slots_;
  absl::flat_hash_map<uint64_t, int> slot_of_;  // sequence -> slot
  int64_t capacity_ = 0;
  int64_t step_ = 0;
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_DECODE_TABLE_STORE_H_
