// Which workers can apply a request as asked: today, whether a worker applies as many
// sampling.logit_bias entries as the request has (ModelInfo.max_logit_bias). A worker older than
// logit_bias advertises 0 and would ignore them, answering as if they were not there, as can
// happen during a rolling upgrade. ForwardingCall skips the workers that cannot and, when no live
// worker of the model can, refuses the request with NoWorkerCanApply.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_FIT_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_FIT_H_

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>

#include "lazyattn/v1/inference.pb.h"
#include "services/router/server/model_groups.h"
#include "services/router/server/worker_registry.h"

namespace lazyattn::router {

// Why worker `w` must not be sent `r` though it serves its model (for the request's failure
// list), or nullopt. A worker that never reported is tried: its answer is the only way to learn
// what it is.
std::optional<std::string> WhyCannotServe(const WorkerInfo& w, const lazyattn::v1::GenerateRequest& r);

// Some live worker of `model` could serve `r`, whether or not the request's plan holds it (an
// ejected or breaker-open worker is left out of plans for a while).
bool AnyWorkerCouldServe(const WorkerRegistry& registry, const std::optional<ModelKey>& model,
                         const lazyattn::v1::GenerateRequest& r);

// FAILED_PRECONDITION for a request no live worker of `model` can apply: the field and the most
// any of them applies, which GetModelInfo also reports. The client's own request is at fault, so
// the message names no worker: an HTTP client sees it (400), and worker ids and addresses are the
// operator's, in the log.
grpc::Status NoWorkerCanApply(const WorkerRegistry& registry, const std::optional<ModelKey>& model,
                              const lazyattn::v1::GenerateRequest& r);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_WORKER_FIT_H_
