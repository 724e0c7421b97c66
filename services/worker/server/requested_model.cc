#include "services/worker/server/requested_model.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace lazyattn {
namespace {

// Debian's Abseil has its own string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The client's value as the router's messages quote it: at most 64 bytes, cut at a UTF-8
// boundary (the message may end up in JSON), marked when cut.
std::string Quote(std::string_view value) {
  constexpr size_t kQuoteBytes = 64;
  if (value.size() <= kQuoteBytes) return absl::StrCat("\"", Absl(value), "\"");
  size_t n = kQuoteBytes;
  while (n > 0 && (static_cast<unsigned char>(value[n]) & 0xC0) == 0x80) --n;
  return absl::StrCat("\"", Absl(value.substr(0, n)), "...\"");
}

bool SelectsByFingerprint(std::string_view requested, const ServedModelNames& served) {
  // The last '@': a name may hold one itself.
  const size_t at = requested.rfind('@');
  if (at == std::string_view::npos || requested.substr(0, at) != served.name) return false;
  std::string_view model_prefix = requested.substr(at + 1);
  std::string_view tokenizer_prefix;
  if (const size_t dot = model_prefix.find('.'); dot != std::string_view::npos) {
    tokenizer_prefix = model_prefix.substr(dot + 1);
    model_prefix = model_prefix.substr(0, dot);
  }
  return !model_prefix.empty() &&
         absl::StartsWithIgnoreCase(served.model_fingerprint, Absl(model_prefix)) &&
         absl::StartsWithIgnoreCase(served.tokenizer_fingerprint, Absl(tokenizer_prefix));
}

}  // namespace

absl::Status CheckRequestedModel(std::string_view requested, const ServedModelNames& served,
                                 bool routed) {
  if (requested.size() > kMaxRequestedModelBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: ", requested.size(), " bytes, over the limit of ", kMaxRequestedModelBytes));
  }
  if (const size_t bad = FirstInvalidUtf8Byte(requested); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("model: not valid UTF-8 (byte ", bad, ")"));
  }
  if (routed || requested.empty() || requested == served.name ||
      SelectsByFingerprint(requested, served)) {
    return absl::OkStatus();
  }
  // The id the router would list it under when it serves it alone.
  const std::string id =
      served.name.empty() ? absl::StrCat("@", served.model_fingerprint.substr(0, 12)) : served.name;
  return absl::NotFoundError(absl::StrCat("model: ", Quote(requested),
                                          " is not served by this worker; it serves ", id,
                                          " (Worker.Status reports it)"));
}

}  // namespace lazyattn
