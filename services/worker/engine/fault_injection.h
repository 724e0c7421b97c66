// Fault injection for testing the worker's fault containment on any backend, the CPU's included
// (YAML keys under `testing:`, docs/worker.md). Off unless configured; the worker prints a loud
// warning at start when any is set. Never for production: it makes a healthy worker fail.
//
//   fail_steps_after N     every step (Forward or Launch) after the first N fails with Internal,
//                          as a transient device error would; the engine stops serving after
//                          engine.max_consecutive_step_failures of them in a row.
//   sticky_error_after N   every step after the first N fails with a sticky device error
//                          (common/device_error.h), as CUDA's cudaErrorIllegalAddress does; the
//                          engine stops serving at the first.
//   abort_on_prompt_marker a request whose text (system, question, a document) contains it
//                          aborts the process while it is prepared: a query of death.
//   hold_model_load_ms N   the worker waits N ms after logging "loading the model", before it
//                          reads the model: a load that takes long, for the stop-while-loading
//                          tests (a FIFO model, which once held the load, is refused at once).
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_FAULT_INJECTION_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_FAULT_INJECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "services/worker/engine/model_runner.h"
#include "services/worker/engine/request.h"

namespace lazyattn {

struct FaultInjectionOptions {
  int64_t fail_steps_after = -1;    // -1: off
  int64_t sticky_error_after = -1;  // -1: off
  std::string abort_on_prompt_marker;  // empty: off
  int64_t hold_model_load_ms = 0;      // 0: off
  bool any() const {
    return fail_steps_after >= 0 || sticky_error_after >= 0 || !abort_on_prompt_marker.empty() ||
           hold_model_load_ms > 0;
  }
  // "testing.fail_steps_after=3, ..." for the start-up warning.
  std::string Describe() const;
};

// `runner` with the step faults of `options` (fail_steps_after, sticky_error_after); `runner`
// itself when neither is set. When both are, the sticky error wins once both are due.
std::unique_ptr<ModelRunner> WithFaultInjection(std::unique_ptr<ModelRunner> runner,
                                                const FaultInjectionOptions& options);

// Whether `marker` (non-empty) occurs in the request's system text, question or a text document.
bool RequestContainsMarker(const EngineRequest& request, std::string_view marker);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_FAULT_INJECTION_H_
