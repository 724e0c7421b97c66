#include "services/worker/engine/kv_cache_cpu.h"

#include <algorithm>
#include <atomic>

namespace lazyattn {
namespace {

std::atomic<KvCacheDtype> g_cpu_kv_dtype{KvCacheDtype::kF16};

}  // namespace

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kF16 ? "f16" : "f32";
}

bool ParseKvCacheDtype(std::string_view name, KvCacheDtype* out) {
  if (name == "f16") {
    *out = KvCacheDtype::kF16;
  } else if (name == "f32") {
    *out = KvCacheDtype::kF32;
  } else {
    return false;
  }
  return true;
}

int64_t KvCacheDtypeBytes(KvCacheDtype dtype) { return dtype == KvCacheDtype::kF16 ? 2 : 4; }

void SetCpuKvCacheDtype(KvCacheDtype dtype) {
  g_cpu_kv_dtype.store(dtype, std::memory_order_relaxed);
}

KvCacheDtype ConfiguredCpuKvCacheDtype() { return g_cpu_kv_dtype.load(std::memory_order_relaxed); }

KvCacheCpu::KvCacheCpu(const ModelConfig& config, int64_t num_blocks, int block_size,
                       std::optional<KvCacheDtype> dtype)
    : shape_{.num_kv_heads = config.num_kv_heads,
             .head_dim = config.head_dim,
             .block_size = block_size},
      dtype_(dtype.value_or(ConfiguredCpuKvCacheDtype())),
      num_layers_(config.num_layers),
      num_blocks_(num_blocks) {
  const size_t pool = static_cast<size_t>(num_blocks * shape_.block_stride());
  if (dtype_ == KvCacheDtype::kF16) {
    k16_.assign(num_layers_, std::vector<uint16_t>(pool));
    v16_.assign(num_layers_, std::vector<uint16_t>(pool));
  } else {
    k_.assign(num_layers_, std::vector<float>(pool));
    v_.assign(num_layers_, std::vector<float>(pool));
  }
  free_.reserve(num_blocks);
  // Hand out low ids first (pop from the back).
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<uint32_t>(b));
}

int64_t KvCacheCpu::bytes_per_token() const {
  return 2 * int64_t{num_layers_} * shape_.num_kv_heads * shape_.head_dim *
         KvCacheDtypeBytes(dtype_);
}

std::optional<uint32_t> KvCacheCpu::Allocate() {
  if (free_.empty()) return std::nullopt;
  const uint32_t b = free_.back();
  free_.pop_back();
  return b;
}

void KvCacheCpu::Free(uint32_t block) { free_.push_back(block); }

int64_t KvBlocksForBudget(const ModelConfig& c, int64_t budget_bytes, KvCacheDtype dtype,
                          int block_size) {
  const int64_t bytes_per_block =
      int64_t{2} * c.num_layers * c.kv_size() * KvCacheDtypeBytes(dtype) * block_size;
  return std::max<int64_t>(1, budget_bytes / bytes_per_block);
}

int64_t KvBlocksForBudget(const ModelConfig& c, int64_t budget_bytes, int block_size) {
  return KvBlocksForBudget(c, budget_bytes, KvCacheDtype::kF32, block_size);
}

}  // namespace lazyattn
