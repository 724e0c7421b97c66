// KV-memory budgets: named model shapes (bytes of K and V per token) and byte sizes as written on
// the command line ("1GiB", "512MB", "1073741824").
#ifndef LAZYATTN_TOOLS_CACHESIM_KV_BUDGET_H_
#define LAZYATTN_TOOLS_CACHESIM_KV_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace lazyattn {

struct ModelShape {
  std::string name;
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int bytes_per_element = 2;  // bf16 / fp16
  // K and V of every layer for one token.
  int64_t BytesPerToken() const {
    return int64_t{2} * layers * kv_heads * head_dim * bytes_per_element;
  }
};

// "llama3-8b" (32 x 8 x 128, 128 KiB/token) or "smollm2-135m" (30 x 3 x 64, 23,040 B/token);
// InvalidArgument listing the known names otherwise.
absl::StatusOr<ModelShape> FindModelShape(const std::string& name);

// Decimal (KB, MB, GB, TB: powers of 1000) and binary (KiB, MiB, GiB, TiB) units, or plain bytes.
absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

// Whole blocks of `block_size` tokens that fit in `bytes`.
inline int64_t BlocksForBudget(int64_t bytes, int64_t bytes_per_token, int block_size) {
  return bytes / (bytes_per_token * block_size);
}

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CACHESIM_KV_BUDGET_H_
