#include "services/router/server/model_groups.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_id.h"

namespace lazyattn::router {
namespace {

constexpr size_t kIdDigits = 12;

std::string IdList(const std::vector<ModelGroup>& groups) {
  return absl::StrJoin(groups, ", ",
                       [](std::string* out, const ModelGroup& g) { absl::StrAppend(out, g.id); });
}

std::string IdList(const std::vector<const ModelGroup*>& groups) {
  return absl::StrJoin(groups, ", ",
                       [](std::string* out, const ModelGroup* g) { absl::StrAppend(out, g->id); });
}

// Among versions of one name: the most live workers, then the newer, then the smaller id (so
// the choice never depends on the order of `candidates`).
const ModelGroup* Majority(const std::vector<const ModelGroup*>& candidates) {
  const ModelGroup* best = nullptr;
  for (const ModelGroup* g : candidates) {
    if (best == nullptr || std::make_tuple(g->workers, g->since, best->id) >
                               std::make_tuple(best->workers, best->since, g->id)) {
      best = g;
    }
  }
  return best;
}

std::vector<const ModelGroup*> Named(const std::vector<ModelGroup>& groups, std::string_view name) {
  std::vector<const ModelGroup*> out;
  for (const ModelGroup& g : groups) {
    if (g.info.name() == name) out.push_back(&g);
  }
  return out;
}

}  // namespace

ModelKey ModelKeyOf(const lazyattn::v1::ModelInfo& model) {
  return ModelKey{model.model_fingerprint(), model.tokenizer_fingerprint()};
}

void AssignModelIds(std::vector<ModelGroup>& groups) {
  // Each group takes the shortest form no other group shares; the last (both whole
  // fingerprints) is unique because the keys are.
  auto name_only = [](const ModelGroup& g) { return g.info.name(); };
  auto with_model = [](const ModelGroup& g) {
    return absl::StrCat(g.info.name(), "@", g.key.model_fingerprint.substr(0, kIdDigits));
  };
  auto with_tokenizer = [&with_model](const ModelGroup& g) {
    return absl::StrCat(with_model(g), ".", g.key.tokenizer_fingerprint.substr(0, kIdDigits));
  };
  auto whole = [](const ModelGroup& g) {
    return absl::StrCat(g.info.name(), "@", g.key.model_fingerprint, ".",
                        g.key.tokenizer_fingerprint);
  };
  absl::flat_hash_map<std::string, int> count[3];
  for (const ModelGroup& g : groups) {
    ++count[0][name_only(g)];
    ++count[1][with_model(g)];
    ++count[2][with_tokenizer(g)];
  }
  for (ModelGroup& g : groups) {
    if (!g.info.name().empty() && count[0][name_only(g)] == 1) {
      g.id = name_only(g);
    } else if (count[1][with_model(g)] == 1) {
      g.id = with_model(g);
    } else if (count[2][with_tokenizer(g)] == 1) {
      g.id = with_tokenizer(g);
    } else {
      g.id = whole(g);
    }
    g.info.set_id(g.id);
    g.info.set_workers(g.workers);
  }
  std::sort(groups.begin(), groups.end(),
            [](const ModelGroup& a, const ModelGroup& b) { return a.id < b.id; });
}

absl::StatusOr<const ModelGroup*> ResolveModel(const std::vector<ModelGroup>& groups,
                                               std::string_view requested) {
  if (absl::Status form = CheckModelField(requested); !form.ok()) return form;
  if (requested.empty()) {
    if (groups.empty()) return nullptr;
    std::vector<const ModelGroup*> all = Named(groups, groups.front().info.name());
    if (all.size() == groups.size()) return Majority(all);
    return absl::InvalidArgumentError(
        absl::StrCat("model: required: the router serves ", groups.size(),
                     " models; name one of: ", IdList(groups), " (GetModelInfo lists them)"));
  }
  if (groups.empty()) {
    return absl::UnavailableError(
        absl::StrCat("model: no live worker has reported its model yet, so none serves ",
                     QuoteModelValue(requested)));
  }
  for (const ModelGroup& g : groups) {
    if (g.id == requested) return &g;
  }
  if (std::vector<const ModelGroup*> named = Named(groups, requested); !named.empty()) {
    return Majority(named);
  }
  if (const std::optional<FingerprintSelector> selector = ParseFingerprintSelector(requested)) {
    std::vector<const ModelGroup*> matches;
    for (const ModelGroup* g : Named(groups, selector->name)) {
      if (SelectsFingerprints(*selector, g->key.model_fingerprint, g->key.tokenizer_fingerprint)) {
        matches.push_back(g);
      }
    }
    if (matches.size() == 1) return matches.front();
    if (matches.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: ", QuoteModelValue(requested), " matches ", matches.size(),
                       " models (", IdList(matches), "); give more of the fingerprint"));
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "model: ", QuoteModelValue(requested),
      " is not served by any live worker; served: ", IdList(groups), " (GetModelInfo lists them)"));
}

}  // namespace lazyattn::router
