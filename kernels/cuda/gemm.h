// Linear layers on the GPU through cuBLASLt: y = x W^T (+ y), bf16 operands, fp32 accumulation.
// Same convention as the CPU twin LinearCpu (kernels/include/gemm.h): W row-major
// [out_features][in_features], x [rows][in_features], y [rows][out_features], all row-major and
// contiguous.
//
// The handle, the workspace and, per shape, the matmul descriptors and the heuristic's algorithm
// are created once and reused. Not thread-safe: one CublasLtGemm per thread (or per stream).
//
// One-row products (decode at batch 1) go to SkinnyLinearCuda (kernels/cuda/skinny_linear.h)
// instead, where it supports the shape: a weight stream on CUDA cores, launched to overlap the
// kernel before it, which cuBLASLt's kernels cannot (docs/benchmarks.md times both).
#ifndef LAZYATTN_KERNELS_CUDA_GEMM_H_
#define LAZYATTN_KERNELS_CUDA_GEMM_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazyattn {

enum class GemmOutputType { kBf16, kFp32 };

class CublasLtGemm {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> Create(
      size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // y[rows][out] = x[rows][in] * w[out][in]^T, plus y when accumulate (y's type either way).
  // Pointers are device pointers, 16-byte aligned. InvalidArgument on bad sizes; Internal with
  // cuBLAS's status string when cuBLASLt refuses.
  absl::Status Linear(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows, int64_t in,
                      int64_t out, void* y, GemmOutputType y_type, bool accumulate,
                      cudaStream_t stream);

  // Autotuning (on by default): the first call of a shape with at most kAutotuneMaxRows rows
  // times up to 16 of cuBLASLt's heuristic candidates (into a scratch output, so the caller's y
  // is untouched), each run with the weights flushed out of L2 as they are inside a forward
  // step, and keeps the fastest. The heuristic's first pick is often a poor fit for the skinny
  // products of decode steps. Row counts share one timing per power-of-two bucket (the first
  // shape of a bucket is timed; later ones reuse its pick when cuBLASLt accepts it for their
  // size). Must not be first called for a shape during stream capture.
  static constexpr int64_t kAutotuneMaxRows = 1024;
  void set_autotune(bool on) { autotune_ = on; }

  // act[r][i] = silu(gate) * up of y = x W^T, for W = [gate rows; up rows] ([2 * inter][in]).
  // One fused pass where the skinny path applies; otherwise Linear into `gate_up_scratch`
  // ([rows][2 * inter] bf16) and SwiGluCuda.
  absl::Status LinearSwiGlu(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, int64_t rows,
                            int64_t in, int64_t inter, __nv_bfloat16* gate_up_scratch,
                            __nv_bfloat16* act, cudaStream_t stream);

  // Whether one-row products use the skinny kernel (on by default; off to time cuBLASLt).
  void set_skinny(bool on) { skinny_ = on; }

  // Number of cached shapes (for tests).
  size_t cached_plans() const { return plans_.size(); }

 private:
  struct Plan;
  // (rows, in, out, y type, accumulate, pointer alignment)
  using Key = std::tuple<int64_t, int64_t, int64_t, int, bool, int>;
  CublasLtGemm() = default;
  absl::StatusOr<const Plan*> GetPlan(const Key& key, const __nv_bfloat16* x,
                                      const __nv_bfloat16* w, cudaStream_t stream);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool autotune_ = true;
  bool skinny_ = true;
  void* tune_scratch_ = nullptr;  // output of the timing runs
  static constexpr size_t kFlushBytes = size_t{128} << 20;  // > 2x the largest L2 (H200: 50 MB)
  void* flush_ = nullptr;         // read before each timing run (evicts the weights)
  size_t tune_scratch_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, const Plan*> tuned_;  // the timed plan of each row bucket (owned by plans_)
};

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_GEMM_H_
