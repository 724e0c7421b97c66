#include "kernels/cuda/rope_table_cuda.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {

absl::StatusOr<std::unique_ptr<DeviceRopeTable>> DeviceRopeTable::Create(const RopeTable& table) {
  const int half = table.head_dim() / 2;
  if (half <= 0 || table.max_positions() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("RoPE table is empty: head_dim ",
                                                   table.head_dim(), ", positions ",
                                                   table.max_positions()));
  }
  const size_t row_bytes = size_t(table.max_positions()) * half * sizeof(float);
  const size_t freq_bytes = size_t(half) * sizeof(double);
  std::unique_ptr<DeviceRopeTable> t(new DeviceRopeTable());
  // One allocation: inv_freq first (8-byte aligned), then cos, then sin (each 256-byte aligned).
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t cos_off = align(freq_bytes), sin_off = cos_off + align(row_bytes);
  RETURN_IF_CUDA_ERROR(cudaMalloc(&t->memory_, sin_off + row_bytes));
  char* base = static_cast<char*>(t->memory_);
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(base, table.inv_freq().data(), freq_bytes, cudaMemcpyHostToDevice));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(base + cos_off, table.cos_data().data(), row_bytes, cudaMemcpyHostToDevice));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpy(base + sin_off, table.sin_data().data(), row_bytes, cudaMemcpyHostToDevice));
  t->view_ = RopeTableView{.cos = reinterpret_cast<const float*>(base + cos_off),
                           .sin = reinterpret_cast<const float*>(base + sin_off),
                           .inv_freq = reinterpret_cast<const double*>(base),
                           .max_positions = table.max_positions(),
                           .head_dim = table.head_dim()};
  return t;
}

DeviceRopeTable::~DeviceRopeTable() {
  if (memory_ != nullptr) cudaFree(memory_);
}

}  // namespace lazyattn
