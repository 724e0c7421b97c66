// Internal to the tokenizer (not a public header): the two small helpers that building the
// vocabulary (tokenizer_vocab.cc) and encoding (tokenizer.cc) both use.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_INTERNAL_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_INTERNAL_H_

#include <cstdint>
#include <string_view>

#include "absl/strings/string_view.h"

namespace lazyattn::tokenizer_internal {

// Debian's Abseil has its own absl::string_view (not std::string_view); convert explicitly.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Key of the merge table: the pair of symbol ids (left, right).
inline uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace lazyattn::tokenizer_internal

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_TOKENIZER_INTERNAL_H_
