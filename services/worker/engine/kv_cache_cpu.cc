#include "services/worker/engine/kv_cache_cpu.h"

#include <algorithm>

namespace lazyattn {

KvCacheCpu::KvCacheCpu(const ModelConfig& config, int64_t num_blocks, int block_size)
    : shape_{.num_kv_heads = config.num_kv_heads, .head_dim = config.head_dim,
             .block_size = block_size},
      num_blocks_(num_blocks),
      k_(config.num_layers, std::vector<float>(num_blocks * shape_.block_stride())),
      v_(config.num_layers, std::vector<float>(num_blocks * shape_.block_stride())) {
  free_.reserve(num_blocks);
  // Hand out low ids first (pop from the back).
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<uint32_t>(b));
}

int64_t KvCacheCpu::bytes_per_token() const {
  return 2 * static_cast<int64_t>(k_.size()) * shape_.num_kv_heads * shape_.head_dim *
         static_cast<int64_t>(sizeof(float));
}

std::optional<uint32_t> KvCacheCpu::Allocate() {
  if (free_.empty()) return std::nullopt;
  const uint32_t b = free_.back();
  free_.pop_back();
  return b;
}

void KvCacheCpu::Free(uint32_t block) { free_.push_back(block); }

int64_t KvBlocksForBudget(const ModelConfig& c, int64_t budget_bytes, int block_size) {
  const int64_t bytes_per_block = int64_t{2} * c.num_layers * c.kv_size() *
                                  static_cast<int64_t>(sizeof(float)) * block_size;
  return std::max<int64_t>(1, budget_bytes / bytes_per_block);
}

}  // namespace lazyattn
