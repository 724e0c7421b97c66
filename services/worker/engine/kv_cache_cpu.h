// Paged KV storage of the CPU backend: per layer, K and V pools in the layout of
// kernels/include/paged_attention.h, plus a plain free list of physical blocks.
//
// Element type (engine.cpu_kv_cache): f16 (IEEE half, the default, as llama.cpp's F16 cache) or
// f32. A decode step reads every key and value of its context, so f16 halves the bytes a step
// reads (SmolLM2 at 600 tokens: 28 -> 14 MB) and doubles the tokens a byte budget holds; each
// value is rounded once when written (relative error <= 2^-11, docs/worker.md has the effect on
// logits). The attention kernels widen it to fp32 as they read.
//
// This is the storage only. Which block holds which document, reference counts and eviction
// belong to the block pool of services/worker/cache/; this class just hands out block ids.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_KV_CACHE_CPU_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_KV_CACHE_CPU_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/include/paged_attention.h"
#include "services/worker/model/model_config.h"

namespace lazyattn {

enum class KvCacheDtype : uint8_t { kF16, kF32 };
std::string_view KvCacheDtypeName(KvCacheDtype dtype);  // "f16", "f32"
// "f16" -> kF16, "f32" -> kF32; false for anything else.
bool ParseKvCacheDtype(std::string_view name, KvCacheDtype* out);
// Bytes of one stored value: 2 or 4.
int64_t KvCacheDtypeBytes(KvCacheDtype dtype);
// The process-wide element type of the CPU backend's KV pools (engine.cpu_kv_cache /
// --cpu-kv-cache), read when a KvCacheCpu is made without an explicit one; kF16 until set. Set it
// before the runner is created: a pool keeps the type it was made with.
void SetCpuKvCacheDtype(KvCacheDtype dtype);
KvCacheDtype ConfiguredCpuKvCacheDtype();

class KvCacheCpu {
 public:
  // dtype: nullopt takes ConfiguredCpuKvCacheDtype().
  KvCacheCpu(const ModelConfig& config, int64_t num_blocks, int block_size = kDefaultKvBlockSize,
             std::optional<KvCacheDtype> dtype = std::nullopt);

  const PagedKvShape& shape() const { return shape_; }
  KvCacheDtype dtype() const { return dtype_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Bytes of K+V one token takes across all layers (2 or 4 bytes a value, per dtype()).
  int64_t bytes_per_token() const;

  // A free block id, or nullopt when none is left.
  std::optional<uint32_t> Allocate();
  void Free(uint32_t block);

  // Layer `layer`'s pools: k() / v() for f32 (nullptr under f16), k_f16() / v_f16() for f16
  // (nullptr under f32).
  float* k(int layer) { return k_.empty() ? nullptr : k_[layer].data(); }
  float* v(int layer) { return v_.empty() ? nullptr : v_[layer].data(); }
  uint16_t* k_f16(int layer) { return k16_.empty() ? nullptr : k16_[layer].data(); }
  uint16_t* v_f16(int layer) { return v16_.empty() ? nullptr : v16_[layer].data(); }

 private:
  PagedKvShape shape_;
  KvCacheDtype dtype_;
  int num_layers_;
  int64_t num_blocks_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::vector<uint16_t>> k16_, v16_;
  std::vector<uint32_t> free_;
};

// Blocks that fit a KV budget in bytes: K and V of every layer, `block_size` tokens a block,
// KvCacheDtypeBytes(dtype) a value; at least 1. f16 fits twice the blocks of f32.
int64_t KvBlocksForBudget(const ModelConfig& config, int64_t budget_bytes, KvCacheDtype dtype,
                          int block_size = kDefaultKvBlockSize);
// The same for f32 values (the form other backends' callers size their options with).
int64_t KvBlocksForBudget(const ModelConfig& config, int64_t budget_bytes,
                          int block_size = kDefaultKvBlockSize);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_KV_CACHE_CPU_H_
