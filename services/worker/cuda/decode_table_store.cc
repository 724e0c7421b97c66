#include "services/worker/cuda/decode_table_store.h"

#include <algorithm>

namespace lazyattn {

absl::StatusOr<DecodeTableStore::Checked> DecodeTableStore::Check(const ForwardChunk& ch,
                                                                  size_t index,
                                                                  const ModelConfig& config,
                                                                  int64_t num_kv_blocks) const {
  Checked checked;
  TableSummary held;
  if (auto it = slot_of_.find(ch.table_sequence);
      ch.table_sequence != 0 && ch.table_version > 1 && it != slot_of_.end()) {
    const Slot& s = slots_[it->second];
    const int64_t n = static_cast<int64_t>(s.keys.size());
    if (s.version + 1 == ch.table_version && ch.table_unchanged > 0 && ch.table_unchanged <= n &&
        ch.table_unchanged <= static_cast<int64_t>(ch.block_table.size())) {
      checked.from = ch.table_unchanged;
      held = {.keys = s.keys[checked.from - 1], .delta_entries = s.deltas[checked.from - 1]};
    }
  }
  absl::StatusOr<TableSummary> summary = ValidateForwardChunk(
      ch, index, config, num_kv_blocks, kDefaultKvBlockSize, checked.from, held);
  if (!summary.ok()) return summary.status();
  checked.summary = *summary;
  return checked;
}

bool DecodeTableStore::BeginStep(int rows, int64_t max_entries,
                                 const std::vector<uint64_t>& in_use) {
  ++step_;
  bool grown = false;
  if (rows > slots()) {
    slots_.resize(std::max({rows, 2 * slots(), 64}));
    grown = true;
  }
  if (max_entries > capacity_) {
    // Doubling, in 64-entry (1,024-token) steps: a growing context reallocates O(log) times.
    capacity_ = (std::max(max_entries, 2 * capacity_) + 63) / 64 * 64;
    grown = true;
  }
  if (grown) ForgetAll();
  for (uint64_t sequence : in_use) {
    if (auto it = slot_of_.find(sequence); it != slot_of_.end()) {
      slots_[it->second].last_step = step_;
    }
  }
  return grown;
}

void DecodeTableStore::Forget(int slot) {
  Slot& s = slots_[slot];
  if (s.sequence != 0) slot_of_.erase(s.sequence);
  s.sequence = 0;
  s.version = 0;
  s.keys.clear();
  s.deltas.clear();
}

void DecodeTableStore::ForgetAll() {
  for (int i = 0; i < slots(); ++i) Forget(i);
}

int DecodeTableStore::TakeSlot() {
  int best = -1;
  for (int i = 0; i < slots(); ++i) {
    const Slot& s = slots_[i];
    if (s.sequence == 0) return i;
    if (s.last_step < step_ && (best < 0 || s.last_step < slots_[best].last_step)) best = i;
  }
  if (best >= 0) Forget(best);
  return best;
}

void DecodeTableStore::PlanRow(const ForwardChunk& ch, int64_t from,
                               std::vector<DecodeTableRow>* rows,
                               std::vector<KvBlockEntry>* patch) {
  const int64_t n = static_cast<int64_t>(ch.block_table.size());
  int slot = -1;
  if (ch.table_sequence != 0 && n <= capacity_) {
    if (auto it = slot_of_.find(ch.table_sequence); it != slot_of_.end()) {
      slot = it->second;
      const Slot& s = slots_[slot];
      if (s.planned_step == step_) {
        // The same sequence twice in one step (not something the engine does): neither row
        // may rely on the slot, and it is dropped.
        Forget(slot);
        slot = -1;
      } else if (s.version + 1 != ch.table_version ||
                 from > static_cast<int64_t>(s.keys.size())) {
        from = 0;
      }
    } else {
      slot = TakeSlot();
      from = 0;
    }
  }
  if (slot < 0) from = 0;
  rows->push_back({.slot = slot,
                   .from = static_cast<int32_t>(from),
                   .n = static_cast<int32_t>(n),
                   .patch = static_cast<int32_t>(patch->size())});
  patch->insert(patch->end(), ch.block_table.begin() + from, ch.block_table.end());
  if (slot < 0) return;
  Slot& s = slots_[slot];
  if (s.sequence != ch.table_sequence) {
    s.sequence = ch.table_sequence;
    slot_of_[ch.table_sequence] = slot;
  }
  s.version = ch.table_version;
  s.last_step = s.planned_step = step_;
  s.keys.resize(n);
  s.deltas.resize(n);
  for (int64_t i = from; i < n; ++i) {
    const KvBlockEntry e = ch.block_table[i];
    s.keys[i] = (i > 0 ? s.keys[i - 1] : 0) + KvEntryValid(e);
    s.deltas[i] = (i > 0 ? s.deltas[i - 1] : 0) + (KvEntryDelta(e) != 0);
  }
}

DecodeTableStore::StepPlan DecodeTableStore::PlanStep(std::span<const ForwardChunk* const> decode,
                                                      std::span<const int64_t> from) {
  StepPlan plan;
  if (decode.empty()) return plan;
  std::vector<uint64_t> sequences;
  sequences.reserve(decode.size());
  int64_t max_entries = 0;
  for (const ForwardChunk* ch : decode) {
    sequences.push_back(ch->table_sequence);
    max_entries = std::max<int64_t>(max_entries, static_cast<int64_t>(ch->block_table.size()));
  }
  plan.store_grew = BeginStep(static_cast<int>(decode.size()), max_entries, sequences);
  plan.rows.reserve(decode.size());
  plan.num_blocks.reserve(decode.size());
  for (size_t d = 0; d < decode.size(); ++d) {
    PlanRow(*decode[d], from[d], &plan.rows, &plan.patch);
    plan.num_blocks.push_back(static_cast<int32_t>(decode[d]->block_table.size()));
  }
  return plan;
}

}  // namespace lazyattn
