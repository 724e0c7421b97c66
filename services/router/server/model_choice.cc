#include "services/router/server/model_choice.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyattn::router {
namespace {

template <typename Request, typename Validate>
absl::StatusOr<std::optional<ModelGroup>> Choose(const WorkerRegistry& registry,
                                                 const ApiLimits& limits, const Request& request,
                                                 Validate validate) {
  const std::vector<ModelGroup> groups = registry.Models();
  absl::StatusOr<const ModelGroup*> group = ResolveModel(groups, request.model());
  if (!group.ok()) return group.status();
  if (*group == nullptr) return std::nullopt;
  if (groups.size() > 1) {
    const lazyattn::v1::ModelInfo& model = (*group)->info;
    if (model.vocab_size() > 0) {
      if (absl::Status s = validate(request, limits, model.vocab_size()); !s.ok()) return s;
    }
    if (model.max_documents() > 0 && request.documents_size() > model.max_documents()) {
      return absl::InvalidArgumentError(
          absl::StrCat("documents: ", request.documents_size(), " documents, the workers of model ",
                       (*group)->id, " take at most ", model.max_documents(), " (GetModelInfo)"));
    }
  }
  return **group;
}

}  // namespace

absl::StatusOr<std::optional<ModelGroup>> ChooseModel(
    const WorkerRegistry& registry, const ApiLimits& limits,
    const lazyattn::v1::GenerateRequest& request) {
  return Choose(registry, limits, request, ValidateGenerateRequest);
}

absl::StatusOr<std::optional<ModelGroup>> ChooseModel(
    const WorkerRegistry& registry, const ApiLimits& limits,
    const lazyattn::v1::PrefetchRequest& request) {
  return Choose(registry, limits, request, ValidatePrefetchRequest);
}

}  // namespace lazyattn::router
