// The identity of a document's KV cache, derived from content alone so the router (which has no
// model) and every worker compute the same key for the same document.
//
//   key = first 128 bits of SHA-256( "lazyattn-doc-v1" | model_fingerprint | tokenizer_fingerprint
//                                    | kind | content )
// where `kind` distinguishes text documents from token-id documents, every field is length-
// prefixed (so no two field splits collide), and token ids are hashed as little-endian int32.
// The fingerprints come from the worker's model (GetModelInfo): KV computed by one model is never
// served to another.
//
// Cache scopes: KV is shared only among requests of one CacheScope (the API key's cache namespace
// and the request's cache_salt). A scoped request's document key is derived from the content key
// above and the scope (ScopedDocumentKey), and its prompt prefixes are matched under the scope's
// words (PrefixScopeWords), so requests of two scopes never share, hit, or time each other's KV.
// The unscoped key is the content key itself: a cluster without scopes keeps its keys.
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

// Whose requests may share KV. `cache_namespace`: the API key's (the router sends it to workers in
// the kCacheNamespaceMetadata of each call; empty without API keys); `salt`: the request's
// cache_salt. Both empty: the cluster-wide scope.
struct CacheScope {
  std::string cache_namespace;
  std::string salt;
  bool shared() const { return cache_namespace.empty() && salt.empty(); }
};

// The gRPC metadata key under which a router sends a worker the API key's cache namespace.
inline constexpr char kCacheNamespaceMetadata[] = "lazyattn-cache-namespace";

// `content_key` in `scope`: itself in the shared scope, otherwise the first 128 bits of SHA-256(
// "lazyattn-doc-scope-v1" | content_key | namespace | salt), fields length-prefixed.
DocumentKey ScopedDocumentKey(const DocumentKey& content_key, const CacheScope& scope);

// Words a prefix cache puts before a scoped request's tokens, so that no prefix of one scope
// matches another's: none in the shared scope, otherwise 8 words of SHA-256(
// "lazyattn-prefix-scope-v1" | namespace | salt).
std::vector<int32_t> PrefixScopeWords(const CacheScope& scope);

// Hex SHA-256 of arbitrary bytes, for fingerprints.
std::string Sha256Hex(std::string_view bytes);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_DOCUMENT_KEY_H_
