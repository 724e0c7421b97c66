// Where a step's time goes, while profiling is on (CudaModelRunner::StepProfile): CUDA events
// around each step's GPU work, recorded into its host slot by Launch, and the host times of
// Launch and between steps; benchmarks read it to separate GPU time from host overhead.
#include <algorithm>
#include <chrono>

#include "services/worker/cuda/cuda_runner_state.h"

namespace lazyattn {

void CudaModelRunner::set_profiling(bool on) {
  State& s = *state_;
  for (State::HostSlot& slot : s.slots) {
    if (on && slot.start == nullptr) {
      cudaEventCreate(&slot.start);
      cudaEventCreate(&slot.end);
    }
  }
  s.profiling = on && s.slots[0].start != nullptr && s.slots[1].start != nullptr;
  s.profile = {};
  s.last_return.reset();
}

CudaModelRunner::StepProfile CudaModelRunner::profile() const { return state_->profile; }

void CudaModelRunner::State::RecordStepProfile(const HostSlot& slot) {
  using Ms = std::chrono::duration<double, std::milli>;
  const auto now = std::chrono::steady_clock::now();
  float gpu_ms = 0;
  cudaEventElapsedTime(&gpu_ms, slot.start, slot.end);
  ++profile.steps;
  profile.gpu_ms += gpu_ms;
  profile.forward_wall_ms += Ms(now - slot.entered).count();
  profile.prep_ms += slot.prep_ms;
  profile.enqueue_ms += slot.enqueue_ms;
  // A step launched before the last collection (pipelined) had no host time in between.
  if (last_return) {
    profile.between_ms += std::max(0.0, Ms(slot.entered - *last_return).count());
  }
  last_return = now;
}

}  // namespace lazyattn
