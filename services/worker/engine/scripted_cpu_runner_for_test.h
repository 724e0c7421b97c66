// The CPU backend for engine-core tests that need to see or disturb what the core asks of its
// runner: steps that fail on demand or by content (a device error, as the CUDA backend reports),
// and a record of every step's size and every block copy's rotation delta (mode block's copies
// of a document to a new offset).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_SCRIPTED_CPU_RUNNER_FOR_TEST_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_SCRIPTED_CPU_RUNNER_FOR_TEST_H_

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "services/worker/engine/cpu_runner.h"

namespace lazyattn::testing {

class ScriptedCpuRunner final : public ModelRunner {
 public:
  ScriptedCpuRunner(const ModelWeights* weights, int64_t blocks) : inner_(weights, blocks) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::string backend_name() const override { return "cpu-scripted"; }
  int64_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    StepRecord& record = steps.emplace_back();
    for (const ForwardChunk& c : chunks) {
      record.chunk_tokens.push_back(static_cast<int64_t>(c.tokens.size()));
      record.table_sequences.push_back(c.table_sequence);
    }
    record.failed = fail_next > 0 || (fail_if && fail_if(chunks));
    if (fail_next > 0) --fail_next;
    if (record.failed) return fail_with;
    return inner_.Forward(chunks);
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies) copy_deltas.push_back(c.delta);
    return inner_.CopyBlocks(copies);
  }

  int fail_next = 0;                  // the next this many steps fail
  // Then every step it holds true for fails (a chunk or a batch the device cannot run).
  std::function<bool(std::span<const ForwardChunk>)> fail_if;
  struct StepRecord {
    std::vector<int64_t> chunk_tokens;      // per chunk
    std::vector<uint64_t> table_sequences;  // per chunk (ForwardChunk::table_sequence)
    bool failed = false;
  };
  std::vector<StepRecord> steps;  // every step asked for, failed ones too
  absl::Status fail_with = absl::InternalError("injected device failure");  // with this
  std::vector<int32_t> copy_deltas;   // of every block copied, in order

 private:
  CpuModelRunner inner_;
};

}  // namespace lazyattn::testing

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_SCRIPTED_CPU_RUNNER_FOR_TEST_H_
