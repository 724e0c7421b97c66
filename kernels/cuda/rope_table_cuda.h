// A device copy of a RopeTable (kernels/include/rope.h): the fp32 cos/sin rows computed in double
// on the host, plus the double inverse frequencies for kernels that compute cos/sin in double.
//
// The kernels take the plain view (RopeTableView) so they never depend on who owns the memory.
#ifndef LAZYATTN_KERNELS_CUDA_ROPE_TABLE_CUDA_H_
#define LAZYATTN_KERNELS_CUDA_ROPE_TABLE_CUDA_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/include/rope.h"

namespace lazyattn {

// Device pointers; cos/sin are row-major [max_positions][head_dim / 2], inv_freq [head_dim / 2].
// A kernel that reads row `pos` requires 0 <= pos < max_positions (kernels clamp so a bad
// position cannot read out of bounds; the engine validates positions before the launch).
struct RopeTableView {
  const float* cos = nullptr;
  const float* sin = nullptr;
  const double* inv_freq = nullptr;
  int64_t max_positions = 0;
  int head_dim = 0;
};

// Owns the device copy. Not copyable; destroy it after the last kernel that uses it has finished.
class DeviceRopeTable {
 public:
  // Uploads `table` to the current device (synchronously).
  static absl::StatusOr<std::unique_ptr<DeviceRopeTable>> Create(const RopeTable& table);
  ~DeviceRopeTable();
  DeviceRopeTable(const DeviceRopeTable&) = delete;
  DeviceRopeTable& operator=(const DeviceRopeTable&) = delete;

  const RopeTableView& view() const { return view_; }

 private:
  DeviceRopeTable() = default;
  void* memory_ = nullptr;
  RopeTableView view_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_ROPE_TABLE_CUDA_H_
