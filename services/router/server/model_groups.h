// The models a router serves, and which one a request names.
//
// A model is one (model_fingerprint, tokenizer_fingerprint) pair among the live workers: the pair
// document keys are derived from (common/document_key.h), so only workers of one model share
// document caches, and a request may only ever reach workers of the model it was routed for. Two
// weight files (or one weight file with two tokenizers) are two models even when they report the
// same name, as during a rolling upgrade that keeps the name.
//
// Ids (what GenerateRequest.model names a model by, and ModelInfo.id / GET /v1/models list):
//   - the model's name when no other live model has that name;
//   - `name@<first 12 hex digits of model_fingerprint>` when several do, and
//     `name@<12 of model_fingerprint>.<12 of tokenizer_fingerprint>` when even those collide
//     (same weights, different tokenizers), and both whole fingerprints past that; an empty name
//     gives `@<...>`. Ids are unique.
// A request may name a model by:
//   - its id;
//   - its name, even when shared: then the version with the most live workers (ties: the one
//     whose workers appeared last, i.e. the newer), so clients that send the name keep being
//     served through a rolling upgrade that keeps it and follow the majority as it shifts;
//   - `name@P` or `name@P.T`, P (T) any prefix of the model (tokenizer) fingerprint, case
//     insensitive, matching exactly one model of that name;
//   - nothing (empty): the only model, or the majority version when every live model has one
//     name; with several names, INVALID_ARGUMENT listing the ids.
#ifndef LAZYATTN_SERVICES_ROUTER_SERVER_MODEL_GROUPS_H_
#define LAZYATTN_SERVICES_ROUTER_SERVER_MODEL_GROUPS_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model_id.h"
#include "lazyattn/v1/inference.pb.h"

namespace lazyattn::router {

struct ModelKey {
  std::string model_fingerprint;
  std::string tokenizer_fingerprint;

  bool operator==(const ModelKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ModelKey& k) {
    return H::combine(std::move(h), k.model_fingerprint, k.tokenizer_fingerprint);
  }
};

// The key of a reported model; empty fingerprints when the worker reported none.
ModelKey ModelKeyOf(const lazyattn::v1::ModelInfo& model);

struct ModelGroup {
  ModelKey key;
  std::string id;  // see above; unique among the groups it was assigned with
  // As its first worker (by worker id) reported it, with `id` and `workers` filled in.
  lazyattn::v1::ModelInfo info;
  int workers = 0;                          // live workers serving it
  absl::Time since = absl::InfinitePast();  // when the earliest of them was first seen with it
};

// Fills in every group's `id` (and info.id) from the names and fingerprints of all of them, and
// orders them by id.
void AssignModelIds(std::vector<ModelGroup>& groups);

// The group `requested` (GenerateRequest.model) selects among `groups` (ids assigned), as the
// header comment says. nullptr (OK) only when `groups` is empty and nothing was requested: no
// worker has reported a model, so there is nothing to choose between. Errors name the field
// `model`: InvalidArgument (not UTF-8, over kMaxModelBytes of common/model_id.h, missing while
// several names are served, a prefix matching several), NotFound (no live model by that name),
// Unavailable (a name while no worker has reported its model yet). The client's value is quoted up
// to 64 bytes.
absl::StatusOr<const ModelGroup*> ResolveModel(const std::vector<ModelGroup>& groups,
                                               std::string_view requested);

}  // namespace lazyattn::router

#endif  // LAZYATTN_SERVICES_ROUTER_SERVER_MODEL_GROUPS_H_
