#include "services/router/server/worker_fit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace lazyattn::router {

using lazyattn::v1::GenerateRequest;

std::optional<std::string> WhyCannotServe(const WorkerInfo& w, const GenerateRequest& r) {
  const int biases = r.sampling().logit_bias_size();
  if (biases > 0 && w.reported && w.status.model().max_logit_bias() < biases) {
    return absl::StrCat("not tried: it applies at most ", w.status.model().max_logit_bias(),
                        " sampling.logit_bias entries (ModelInfo.max_logit_bias), the request has ",
                        biases);
  }
  return std::nullopt;
}

bool AnyWorkerCouldServe(const WorkerRegistry& registry, const std::optional<ModelKey>& model,
                         const GenerateRequest& r) {
  for (const WorkerInfo& w : registry.Snapshot()) {
    if (model.has_value() && !(ModelKeyOf(w.status.model()) == *model)) continue;
    if (!WhyCannotServe(w, r).has_value()) return true;
  }
  return false;
}

grpc::Status NoWorkerCanApply(const WorkerRegistry& registry, const std::optional<ModelKey>& model,
                              const GenerateRequest& r) {
  int best = 0;
  for (const WorkerInfo& w : registry.Snapshot()) {
    if (!w.reported || (model.has_value() && !(ModelKeyOf(w.status.model()) == *model))) continue;
    best = std::max(best, w.status.model().max_logit_bias());
  }
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("sampling.logit_bias: the request has ", r.sampling().logit_bias_size(),
                   " entries, and no live worker of its model applies more than ", best,
                   " (ModelInfo.max_logit_bias, which GetModelInfo reports)"));
}

}  // namespace lazyattn::router
