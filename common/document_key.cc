#include "common/document_key.h"

#include <openssl/evp.h>

#include <array>
#include <bit>
#include <cstdio>

namespace lazyattn {
namespace {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  void Update(const void* data, size_t n) { EVP_DigestUpdate(ctx_, data, n); }
  // Length-prefixed field: distinct field boundaries give distinct byte streams.
  void Field(std::string_view bytes) {
    const uint64_t n = bytes.size();
    Update(&n, sizeof(n));
    Update(bytes.data(), bytes.size());
  }
  std::array<uint8_t, 32> Finish() {
    std::array<uint8_t, 32> out{};
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, out.data(), &len);
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

DocumentKey KeyFrom(const std::array<uint8_t, 32>& d) {
  DocumentKey k;
  for (int i = 0; i < 8; ++i) {
    k.hi = (k.hi << 8) | d[i];
    k.lo = (k.lo << 8) | d[8 + i];
  }
  return k;
}

DocumentKey Key(std::string_view model_fp, std::string_view tokenizer_fp, std::string_view kind,
                std::string_view content) {
  Sha256 h;
  h.Field("lazyattn-doc-v1");
  h.Field(model_fp);
  h.Field(tokenizer_fp);
  h.Field(kind);
  h.Field(content);
  return KeyFrom(h.Finish());
}

}  // namespace

std::string DocumentKey::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

DocumentKey DocumentKeyFromText(std::string_view model_fp, std::string_view tokenizer_fp,
                                std::string_view text) {
  return Key(model_fp, tokenizer_fp, "text", text);
}

DocumentKey DocumentKeyFromTokens(std::string_view model_fp, std::string_view tokenizer_fp,
                                  const std::vector<int32_t>& ids) {
  // The key hashes each id as 4 little-endian bytes: on a little-endian host that is the
  // vector's own memory, hashed in place (a 20K-token RAG request is 80 KB per call).
  if constexpr (std::endian::native == std::endian::little) {
    return Key(model_fp, tokenizer_fp, "tokens",
               std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  }
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  return Key(model_fp, tokenizer_fp, "tokens", bytes);
}

DocumentKey ScopedDocumentKey(const DocumentKey& content_key, const CacheScope& scope) {
  if (scope.shared()) return content_key;
  Sha256 h;
  h.Field("lazyattn-doc-scope-v1");
  uint8_t raw[16];
  for (int i = 0; i < 8; ++i) {
    raw[i] = static_cast<uint8_t>(content_key.hi >> (56 - 8 * i));
    raw[8 + i] = static_cast<uint8_t>(content_key.lo >> (56 - 8 * i));
  }
  h.Field(std::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
  h.Field(scope.cache_namespace);
  h.Field(scope.salt);
  return KeyFrom(h.Finish());
}

std::vector<int32_t> PrefixScopeWords(const CacheScope& scope) {
  if (scope.shared()) return {};
  Sha256 h;
  h.Field("lazyattn-prefix-scope-v1");
  h.Field(scope.cache_namespace);
  h.Field(scope.salt);
  const auto d = h.Finish();
  std::vector<int32_t> words(8);
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t w = 0;
    for (int b = 0; b < 4; ++b) w = (w << 8) | d[4 * i + b];
    words[i] = static_cast<int32_t>(w);
  }
  return words;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes.data(), bytes.size());
  const auto d = h.Finish();
  std::string hex;
  char buf[3];
  for (uint8_t b : d) {
    std::snprintf(buf, sizeof(buf), "%02x", b);
    hex += buf;
  }
  return hex;
}

}  // namespace lazyattn
