// Generated Unicode classification tables (see tools/gen_unicode_tables.py and unicode_tables.cc).
// Internal to the tokenizer; use unicode.h instead.
#ifndef LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_UNICODE_TABLES_H_
#define LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_UNICODE_TABLES_H_

#include <cstddef>
#include <cstdint>

namespace lazyattn::unicode_internal {

struct CodepointRange {
  uint32_t first;
  uint32_t last;  // inclusive
  uint8_t flags;  // 1 letter, 2 number, 4 whitespace
};

extern const char kUnicodeVersion[];
extern const CodepointRange kCodepointRanges[];
extern const size_t kNumCodepointRanges;

}  // namespace lazyattn::unicode_internal

#endif  // LAZYATTN_SERVICES_WORKER_MODEL_TOKENIZER_UNICODE_TABLES_H_
