// The CPU runner behind the pipelined-decode interface (ModelRunner::Launch/Collect), computing
// at Launch: what the CUDA backend's pipelining asks of the engine, checked without a GPU. A
// chained launch takes chunk i's token from row previous_step_rows[i] of the step launched just
// before, as the CUDA runner does on the device (and, as it does, counts that input token in the
// penalties itself: kCountInputToken). Faults on demand: every `fail_every`-th chained launch
// fails, and the Collect numbered fail_collect_at does.
// (engine_core_pipelining_test.cc, engine_core_block_table_test.cc)
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_PIPELINING_CPU_RUNNER_FOR_TEST_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_PIPELINING_CPU_RUNNER_FOR_TEST_H_

#include <deque>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"

namespace lazyattn::testing {

class PipeliningCpuRunner final : public ModelRunner {
 public:
  // `pipeline` false: SupportsPipelinedDecode() says no, and the engine only calls Forward.
  PipeliningCpuRunner(const ModelWeights* weights, int64_t blocks, int fail_every,
                      bool pipeline = true)
      : inner_(weights, blocks), fail_every_(fail_every), pipeline_(pipeline) {}
  const ModelConfig& config() const override { return inner_.config(); }
  std::string backend_name() const override { return "cpu-pipelining"; }
  int64_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    EXPECT_TRUE(launched_.empty()) << "Forward with a launched step uncollected";
    calls.push_back("F" + std::to_string(chunks.size()));
    auto out = Run(chunks);
    last_ids_.clear();  // only a launched step's draws feed a chained launch
    return out;
  }
  absl::Status CopyBlocks(std::span<const BlockCopy> copies) override {
    EXPECT_TRUE(launched_.empty()) << "CopyBlocks with a launched step uncollected";
    return inner_.CopyBlocks(copies);
  }
  bool SupportsPipelinedDecode() const override { return pipeline_; }
  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override {
    EXPECT_LT(launched_.size(), 2u);
    std::vector<ForwardChunk> own(chunks.begin(), chunks.end());
    std::vector<int32_t> tokens(own.size());
    if (!previous_step_rows.empty()) {
      if (fail_every_ > 0 && ++chained_tries_ % fail_every_ == 0) {
        if (on_refused_launch) on_refused_launch(chunks);
        return absl::InternalError("injected launch failure");
      }
      EXPECT_EQ(previous_step_rows.size(), own.size());
      for (size_t i = 0; i < own.size(); ++i) {
        EXPECT_LT(static_cast<size_t>(previous_step_rows[i]), last_ids_.size());
        tokens[i] = last_ids_.at(previous_step_rows[i]);
        own[i].tokens = std::span(&tokens[i], 1);
        if (HasPenalties(own[i].sampling)) own[i].sampling.flags |= kCountInputToken;
      }
      ++chained_;
    }
    calls.push_back("L" + std::to_string(own.size()));
    auto out = Run(own);
    if (!out.ok()) return out.status();
    launched_.push_back(*std::move(out));
    return absl::OkStatus();
  }
  absl::StatusOr<ForwardOutput> Collect() override {
    if (launched_.empty()) return absl::FailedPreconditionError("nothing launched");
    ForwardOutput out = std::move(launched_.front());
    launched_.pop_front();
    if (++collects_ == fail_collect_at) {
      failed_with_chained_in_flight = !launched_.empty();
      calls.push_back("C!");
      return absl::InternalError("injected collect failure");
    }
    return out;
  }

  int chained() const { return chained_; }
  // Every logits row returned (return_logits chunks), in the order the steps ran.
  const std::vector<std::vector<float>>& returned_rows() const { return returned_rows_; }
  // Sees every step's chunks as they run (a chained step's with the tokens drawn before).
  std::function<void(std::span<const ForwardChunk>)> on_run;
  // Sees the chunks of every chained launch failed by `fail_every`.
  std::function<void(std::span<const ForwardChunk>)> on_refused_launch;
  int fail_collect_at = 0;                     // the Collect of this number (from 1) fails; 0: none
  bool failed_with_chained_in_flight = false;  // ... while a step chained to it was launched
  // Every step run, "F<chunks>" (Forward) or "L<chunks>" (Launch), and "C!" for the failed
  // Collect.
  std::vector<std::string> calls;

 private:
  absl::StatusOr<ForwardOutput> Run(std::span<const ForwardChunk> chunks) {
    if (on_run) on_run(chunks);
    auto out = inner_.Forward(chunks);
    if (!out.ok()) return out;
    const size_t V = static_cast<size_t>(config().vocab_size);
    for (size_t at = 0; at + V <= out->logits.size(); at += V) {
      returned_rows_.emplace_back(out->logits.begin() + at, out->logits.begin() + at + V);
    }
    last_ids_ = out->token_ids;
    return out;
  }

  CpuModelRunner inner_;
  int fail_every_;
  bool pipeline_;
  int chained_tries_ = 0, chained_ = 0, collects_ = 0;
  std::vector<int32_t> last_ids_;  // the ids the last step drew
  std::deque<ForwardOutput> launched_;
  std::vector<std::vector<float>> returned_rows_;
};

}  // namespace lazyattn::testing

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_PIPELINING_CPU_RUNNER_FOR_TEST_H_
