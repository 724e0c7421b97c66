// The model one Generate, Complete or Prefetch call runs on (GenerateRequest.model resolved by
// model_groups.h among the live workers' models), with the checks that need that model: a
// request's token ids against its vocabulary. Shared by the gRPC and the HTTP API (both start
// their calls through ForwardingCall::Begin) and by Prefetch.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_MODEL_CHOICE_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_MODEL_CHOICE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "common/request_validator.h"
#include "lazyattn/v1/inference.pb.h"
#include "services/router/server/model_groups.h"
#include "services/router/server/worker_registry.h"

namespace lazyattn::router {

// The chosen model; nullopt when no worker has reported a model and the request names none (it
// is then routed among all workers, as a router that knows no models always did). Errors as
// ResolveModel's, plus InvalidArgument naming the field of a token id outside the chosen
// model's vocabulary, or `documents` beyond its workers' max_documents: admission checks those
// against the served model only while there is one (WorkerRegistry::Model), so with several the
// checks happen here, once the model is known.
absl::StatusOr<std::optional<ModelGroup>> ChooseModel(const WorkerRegistry& registry,
                                                      const ApiLimits& limits,
                                                      const lazyattn::v1::GenerateRequest& request);
absl::StatusOr<std::optional<ModelGroup>> ChooseModel(const WorkerRegistry& registry,
                                                      const ApiLimits& limits,
                                                      const lazyattn::v1::PrefetchRequest& request);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_MODEL_CHOICE_H_
