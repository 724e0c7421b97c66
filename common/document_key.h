// The identity of a document's KV cache, derived from content alone so the router (which has no
// model) and every worker compute the same key for the same document.
//
//   key = first 128 bits of SHA-256( "lazyattn-doc-v1" | model_fingerprint | tokenizer_fingerprint
//                                    | kind | content )
// where `kind` distinguishes text documents from token-id documents, every field is length-
// prefixed (so no two field splits collide), and token ids are hashed as little-endian int32.
// The fingerprints come from the worker's model (GetModelInfo): KV computed by one model is never
// served to another.
#ifndef LAZYATTN_COMMON_DOCUMENT_KEY_H_
#define LAZYATTN_COMMON_DOCUMENT_KEY_H_

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lazyattn {

struct DocumentKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  auto operator<=>(const DocumentKey&) const = default;
  // 32 lowercase hex digits.
  std::string ToHex() const;
  template <typename H>
  friend H AbslHashValue(H h, const DocumentKey& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
};

DocumentKey DocumentKeyFromText(std::string_view model_fingerprint,
                                std::string_view tokenizer_fingerprint, std::string_view text);
DocumentKey DocumentKeyFromTokens(std::string_view model_fingerprint,
                                  std::string_view tokenizer_fingerprint,
                                  const std::vector<int32_t>& token_ids);

// Hex SHA-256 of arbitrary bytes, for fingerprints.
std::string Sha256Hex(std::string_view bytes);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_DOCUMENT_KEY_H_
