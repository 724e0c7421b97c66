// OpenAI's model objects for GET /v1/models and GET /v1/models/{id} (docs/http-api.md): each
// served model as {"id", "object": "model", "created", "owned_by": "lazyattn", "max_model_len"}.
#ifndef LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_MODELS_H_
#define LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_MODELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lazyattn/v1/inference.pb.h"

namespace lazyattn::router {

// The id a model is listed under: its ModelInfo.id (the `model` value that selects it), or its
// name when the id is not set.
std::string ListedModelId(const lazyattn::v1::ModelInfo& model);
// GET /v1/models: every served model (WorkerRegistry::Models) as an OpenAI list; an empty list
// when none is.
std::string ModelsJson(const std::vector<lazyattn::v1::ModelInfo>& models, int64_t created);
// GET /v1/models/{id}: one model object, as ModelsJson lists it.
std::string ModelJson(const lazyattn::v1::ModelInfo& model, int64_t created);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_HTTP_OPENAI_MODELS_H_
