// GenerateRequest.model and PrefetchRequest.model at a worker: like vLLM, a worker runs a request
// only on the model it serves, so a client that names another one (calling the worker directly,
// or by mistake) is told so instead of getting this model's answer.
#ifndef LAZYATTN_SERVICES_WORKER_SERVER_REQUESTED_MODEL_H_
#define LAZYATTN_SERVICES_WORKER_SERVER_REQUESTED_MODEL_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace lazyattn {

// What a request may name this worker's model by: the ModelInfo.name and the fingerprints its
// Status reports.
struct ServedModelNames {
  std::string name;
  std::string model_fingerprint;
  std::string tokenizer_fingerprint;
};

// OK when `requested` selects `served` as the router would select it were it the only model
// served (model_groups.h): empty; its name (exact); or `name@P` / `name@P.T`, P a non-empty and T
// any prefix of its model and tokenizer fingerprints, case-insensitive (every id the router gives
// a model takes one of these forms).
//
// `routed`: the call carries the router's expected-model metadata naming this worker's model
// (RefuseOtherModel passed it): the router resolved `requested` to these weights, maybe by the
// name another of their workers reported (a group takes its first worker's name), so only its
// form is checked here. The form, the quoting and the `name@P[.T]` parse are common/model_id.h's,
// which the router's resolution uses too.
//
// Errors name the field, with the router's codes and wording: InvalidArgument when it is over
// kMaxModelBytes or not UTF-8, NotFound for another model (the value quoted up to 64
// bytes, and this worker's model named).
absl::Status CheckRequestedModel(std::string_view requested, const ServedModelNames& served,
                                 bool routed);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_SERVER_REQUESTED_MODEL_H_
