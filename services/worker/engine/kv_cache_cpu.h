// Paged KV storage of the CPU backend: per layer, K and V pools in the layout of
// kernels/include/paged_attention.h, plus a plain free list of physical blocks.
//
// This is the storage only. Which block holds which document, reference counts and eviction
// belong to the block pool of services/worker/cache/; this class just hands out block ids.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_KV_CACHE_CPU_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_KV_CACHE_CPU_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/include/paged_attention.h"
#include "services/worker/model/model_config.h"

namespace lazyattn {

class KvCacheCpu {
 public:
  KvCacheCpu(const ModelConfig& config, int64_t num_blocks, int block_size = kDefaultKvBlockSize);

  const PagedKvShape& shape() const { return shape_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Bytes of K+V one token takes across all layers (fp32).
  int64_t bytes_per_token() const;

  // A free block id, or nullopt when none is left.
  std::optional<uint32_t> Allocate();
  void Free(uint32_t block);

  float* k(int layer) { return k_[layer].data(); }
  float* v(int layer) { return v_[layer].data(); }

 private:
  PagedKvShape shape_;
  int64_t num_blocks_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<uint32_t> free_;
};

// Blocks that fit a KV budget in bytes: fp32 K and V of every layer, `block_size` tokens a block;
// at least 1.
int64_t KvBlocksForBudget(const ModelConfig& config, int64_t budget_bytes,
                          int block_size = kDefaultKvBlockSize);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_KV_CACHE_CPU_H_
