#include "services/worker/server/requested_model.h"

#include "absl/strings/str_cat.h"
#include "common/model_id.h"

namespace lazyattn {
namespace {

bool SelectsByFingerprint(std::string_view requested, const ServedModelNames& served) {
  const std::optional<FingerprintSelector> selector = ParseFingerprintSelector(requested);
  return selector.has_value() && selector->name == served.name &&
         SelectsFingerprints(*selector, served.model_fingerprint, served.tokenizer_fingerprint);
}

}  // namespace

absl::Status CheckRequestedModel(std::string_view requested, const ServedModelNames& served,
                                 bool routed) {
  if (absl::Status form = CheckModelField(requested); !form.ok()) return form;
  if (routed || requested.empty() || requested == served.name ||
      SelectsByFingerprint(requested, served)) {
    return absl::OkStatus();
  }
  // The id the router would list it under when it serves it alone.
  const std::string id =
      served.name.empty() ? absl::StrCat("@", served.model_fingerprint.substr(0, 12)) : served.name;
  return absl::NotFoundError(absl::StrCat("model: ", QuoteModelValue(requested),
                                          " is not served by this worker; it serves ", id,
                                          " (Worker.Status reports it)"));
}

}  // namespace lazyattn
