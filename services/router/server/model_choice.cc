#include "services/router/server/model_choice.h"

#include <vector>

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
  const int64_t vocab = (*group)->info.vocab_size();
  if (groups.size() > 1 && vocab > 0) {
    if (absl::Status s = validate(request, limits, vocab); !s.ok()) return s;
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
