#include "services/router/http/openai_models.h"

#include <utility>

#include "nlohmann/json.hpp"

namespace lazyattn::router {
namespace {

using nlohmann::json;

json ModelObject(const lazyattn::v1::ModelInfo& model, int64_t created) {
  return {{"id", ListedModelId(model)},
          {"object", "model"},
          {"created", created},
          {"owned_by", "lazyattn"},
          {"max_model_len", model.max_context_tokens()}};
}

// A model's id and name come from a worker's ModelInfo; replace rather than throw if one is not
// UTF-8.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string ListedModelId(const lazyattn::v1::ModelInfo& model) {
  return model.id().empty() ? model.name() : model.id();
}

std::string ModelsJson(const std::vector<lazyattn::v1::ModelInfo>& models, int64_t created) {
  json data = json::array();
  for (const lazyattn::v1::ModelInfo& model : models) data.push_back(ModelObject(model, created));
  return Dump({{"object", "list"}, {"data", std::move(data)}});
}

std::string ModelJson(const lazyattn::v1::ModelInfo& model, int64_t created) {
  return Dump(ModelObject(model, created));
}

}  // namespace lazyattn::router
