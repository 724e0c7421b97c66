#include "common/model_id.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace lazyattn {
namespace {

// Debian's Abseil has its own string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr size_t kQuoteBytes = 64;

}  // namespace

absl::Status CheckModelField(std::string_view requested) {
  if (requested.size() > kMaxModelBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: ", requested.size(), " bytes, over the limit of ", kMaxModelBytes));
  }
  if (const size_t bad = FirstInvalidUtf8Byte(requested); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("model: not valid UTF-8 (byte ", bad, ")"));
  }
  return absl::OkStatus();
}

std::string QuoteModelValue(std::string_view value) {
  if (value.size() <= kQuoteBytes) return absl::StrCat("\"", Absl(value), "\"");
  size_t n = kQuoteBytes;
  while (n > 0 && (static_cast<unsigned char>(value[n]) & 0xC0) == 0x80) --n;
  return absl::StrCat("\"", Absl(value.substr(0, n)), "...\"");
}

std::optional<FingerprintSelector> ParseFingerprintSelector(std::string_view requested) {
  const size_t at = requested.rfind('@');
  if (at == std::string_view::npos) return std::nullopt;
  FingerprintSelector selector{.name = requested.substr(0, at),
                               .model_prefix = requested.substr(at + 1)};
  if (const size_t dot = selector.model_prefix.find('.'); dot != std::string_view::npos) {
    selector.tokenizer_prefix = selector.model_prefix.substr(dot + 1);
    selector.model_prefix = selector.model_prefix.substr(0, dot);
  }
  if (selector.model_prefix.empty()) return std::nullopt;
  return selector;
}

bool SelectsFingerprints(const FingerprintSelector& selector, std::string_view model_fingerprint,
                         std::string_view tokenizer_fingerprint) {
  return absl::StartsWithIgnoreCase(Absl(model_fingerprint), Absl(selector.model_prefix)) &&
         absl::StartsWithIgnoreCase(Absl(tokenizer_fingerprint), Absl(selector.tokenizer_prefix));
}

}  // namespace lazyattn
