#include "services/worker/engine/fault_injection.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/device_error.h"

namespace lazyattn {
namespace {

class FaultInjectingRunner final : public ForwardingModelRunner {
 public:
  FaultInjectingRunner(std::unique_ptr<ModelRunner> inner, const FaultInjectionOptions& options)
      : ForwardingModelRunner(std::move(inner)), options_(options) {}

  absl::StatusOr<ForwardOutput> Forward(std::span<const ForwardChunk> chunks) override {
    if (absl::Status s = NextStep(); !s.ok()) return s;
    return inner().Forward(chunks);
  }
  absl::Status Launch(std::span<const ForwardChunk> chunks,
                      std::span<const int32_t> previous_step_rows) override {
    if (absl::Status s = NextStep(); !s.ok()) return s;
    return inner().Launch(chunks, previous_step_rows);
  }

 private:
  // Counts a step and says whether it is to fail. Only the engine thread runs steps.
  absl::Status NextStep() {
    const int64_t step = steps_++;
    if (options_.sticky_error_after >= 0 && step >= options_.sticky_error_after) {
      return MarkStickyDeviceError(absl::InternalError(absl::StrCat(
          "injected sticky device error (testing.sticky_error_after ",
          options_.sticky_error_after, ", step ", step, ")")));
    }
    if (options_.fail_steps_after >= 0 && step >= options_.fail_steps_after) {
      return absl::InternalError(absl::StrCat("injected step failure (testing.fail_steps_after ",
                                              options_.fail_steps_after, ", step ", step, ")"));
    }
    return absl::OkStatus();
  }

  const FaultInjectionOptions options_;
  int64_t steps_ = 0;
};

}  // namespace

std::string FaultInjectionOptions::Describe() const {
  std::vector<std::string> parts;
  if (fail_steps_after >= 0) parts.push_back(absl::StrCat("fail_steps_after=", fail_steps_after));
  if (sticky_error_after >= 0) {
    parts.push_back(absl::StrCat("sticky_error_after=", sticky_error_after));
  }
  if (!abort_on_prompt_marker.empty()) {
    parts.push_back(absl::StrCat("abort_on_prompt_marker=\"", abort_on_prompt_marker, "\""));
  }
  if (hold_model_load_ms > 0) {
    parts.push_back(absl::StrCat("hold_model_load_ms=", hold_model_load_ms));
  }
  return absl::StrJoin(parts, ", ");
}

std::unique_ptr<ModelRunner> WithFaultInjection(std::unique_ptr<ModelRunner> runner,
                                                const FaultInjectionOptions& options) {
  if (options.fail_steps_after < 0 && options.sticky_error_after < 0) return runner;
  return std::make_unique<FaultInjectingRunner>(std::move(runner), options);
}

bool RequestContainsMarker(const EngineRequest& request, std::string_view marker) {
  if (marker.empty()) return false;
  auto has = [&](std::string_view text) { return text.find(marker) != std::string_view::npos; };
  if (has(request.system_prefix) || has(request.question)) return true;
  for (const EngineDocument& d : request.documents) {
    if (has(d.text)) return true;
  }
  return false;
}

}  // namespace lazyattn
