// Few-row linear layers on Hopper tensor cores: y = x W^T (+ y), 1 to 64 rows, bf16 operands,
// fp32 accumulation. Same convention as LinearCpu (kernels/include/gemm.h): W row-major
// [out][in], x [rows][in], y [rows][out], all contiguous.
//
// Why: at 32-64 rows cuBLASLt's kernels stream the weights at 2.3-3.9 TB/s, limited by the bytes
// each SM keeps in flight (docs/kernels.md, "Small kernels"), where one row reaches 3.0-4.1 on
// CUDA cores. This kernel computes y^T = W x^T ("swap AB"): blocks of 64 output features are
// wgmma's 64-row A operand, the rows of x its N (8..64), both K-major in 128-byte-swizzled
// shared memory filled by TMA through a deep pipeline (one producer warp, one consumer
// warpgroup). A CTA owns 64, 128 or 256 features (wider tiles re-read x fewer times). Launched
// overlapped (launch_overlap.cuh), the producer issues the first weight stages before it waits
// for the previous kernel, since weights never depend on it.
//
// Split K (for products with few output tiles) sums the splits' fp32 partials in a fixed order,
// so results are the same from run to run and between a CUDA graph and an eager launch.
//
// Needs sm_90a (compiled only for it); SkinnyWgmmaLinearSupports() says whether a call can run.
// Timed alone it trails cuBLASLt at 32-64 rows by 2-37 % (docs/kernels.md; `lazyattn-bench-engine
// --parts gemm --wgmma-gemm` compares them), but inside a decode step replayed from a graph its
// early weight loads win: the runner uses it for steps of 2-64 rows
// (CudaRunnerOptions::wgmma_max_rows).
#ifndef LAZYATTN_KERNELS_CUDA_SKINNY_WGMMA_LINEAR_H_
#define LAZYATTN_KERNELS_CUDA_SKINNY_WGMMA_LINEAR_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rope_kv_append.h"

namespace lazyattn {

// Scratch the split-K reduction needs: one int counter per output tile, zero between calls (each
// call leaves them zero), and 32 MB of fp32 partial tiles. One per stream: two calls in flight
// at once must not share it.
class SkinnyWgmmaWorkspace {
 public:
  static constexpr int kMaxTiles = 4096;  // out / 64: up to 262,144 output features
  SkinnyWgmmaWorkspace() = default;
  ~SkinnyWgmmaWorkspace();
  SkinnyWgmmaWorkspace(const SkinnyWgmmaWorkspace&) = delete;
  SkinnyWgmmaWorkspace& operator=(const SkinnyWgmmaWorkspace&) = delete;
  absl::Status Init();
  int* counters() const { return counters_; }
  float* partials() const { return partials_; }

 private:
  int* counters_ = nullptr;
  float* partials_ = nullptr;
};

// How a product is cut: output features per CTA and K splits. 0 lets the kernel choose; a
// splits count the workspace or K cannot hold is lowered.
struct SkinnyWgmmaConfig {
  int tile_features = 0;  // 64, 128 or 256
  int splits = 0;         // 1 to 8
};

// Whether SkinnyWgmmaLinearCuda can compute this product: 1 <= rows <= 64, in a multiple of 8
// (TMA needs 16-byte row strides) and >= 64, 1 <= out <= 262,144, pointers 16-byte aligned, and
// a device of compute capability 9.0.
bool SkinnyWgmmaLinearSupports(int64_t rows, int64_t in, int64_t out, const void* x,
                               const void* w, const void* y);

// y[rows][out] = x[rows][in] * w[out][in]^T (+ y when accumulate), y fp32 or bf16 (rounded
// once). Without an initialized workspace the kernel's own choice never splits K.
// InvalidArgument where SkinnyWgmmaLinearSupports is false or `config` is out of range;
// FailedPrecondition for config.splits > 1 without an initialized workspace; Internal for CUDA
// errors.
absl::Status SkinnyWgmmaLinearCuda(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows,
                                   int64_t in, int64_t out, void* y, GemmOutputType y_type,
                                   bool accumulate, const SkinnyWgmmaWorkspace& workspace,
                                   cudaStream_t stream, SkinnyWgmmaConfig config = {},
                                   const __nv_bfloat16* w_packed = nullptr);

// act[r][i] = silu(gate) * up of y = x W^T for W = [gate rows; up rows] ([2 * inter][in]),
// act bf16 [rows][inter]: gate and up are rounded to bf16 before the product, exactly as
// SwiGluCuda reads them after a bf16 Linear, but the [rows][2 * inter] product is never
// written. A CTA owns config.tile_features features' gate and up rows (64 or 128 features:
// 128 or 256 weight rows; 0 is 64); splits as SkinnyWgmmaConfig::splits. Errors as
// SkinnyWgmmaLinearCuda.
absl::Status SkinnyWgmmaLinearSwiGluCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up,
                                         int64_t rows, int64_t in, int64_t inter,
                                         __nv_bfloat16* act, const SkinnyWgmmaWorkspace& workspace,
                                         cudaStream_t stream, SkinnyWgmmaConfig config = {},
                                         const __nv_bfloat16* w_packed = nullptr);

// The QKV projection with RopeKvAppend's work as its epilogue: qkv = x W_qkv^T for W_qkv =
// [q heads; k heads; v heads] ([(H + 2 KH) * 128][in]), then exactly what RopeKvAppend(rope)
// does with that bf16 qkv (rope.q/k/v and their strides are ignored): q rotated to delta + local
// into rope.q_out, k rotated to local and v into the pool slots (none for a negative slot). The
// qkv rows are never written, and a step saves RopeKvAppend's launch. head_dim 128 only: a
// 128-feature tile is one head, so each thread holds both dims of its rotation pairs.
// config.tile_features must be 0 or 128; splits as SkinnyWgmmaConfig::splits.
bool SkinnyWgmmaQkvRopeSupports(int64_t rows, int64_t in, const RopeKvAppendArgs& rope,
                                const void* x, const void* w_qkv);
absl::Status SkinnyWgmmaLinearQkvRopeCuda(const __nv_bfloat16* x, const __nv_bfloat16* w_qkv,
                                          int64_t rows, int64_t in, const RopeKvAppendArgs& rope,
                                          const SkinnyWgmmaWorkspace& workspace,
                                          cudaStream_t stream, SkinnyWgmmaConfig config = {},
                                          const __nv_bfloat16* w_packed = nullptr);

// Packed weights (every function above takes them as an optional last argument, w_packed, read
// instead of w, which must still be given): W [out][in] cut into 64 x 64 blocks, block (g, kb) of
// rows 64 g.. and columns 64 kb.. stored contiguously at (g * ceil(in / 64) + kb) * 8 KB, its
// rows already in the 128-byte-swizzled order the kernel's shared memory wants, zeros past out
// (rounded up to 256 rows) and in. A weight tile then arrives as one 8 KB copy per 64 rows,
// where a tensor-map box is 64 separate 128-byte pieces of rows in/64 * 8 KB apart. The SwiGLU
// form needs inter a multiple of 64. Batch-32 decode steps ran 2.4 % faster with it
// (CudaRunnerOptions::wgmma_packed_weights, on by default).
int64_t PackedWeightsElements(int64_t out, int64_t in);
// Writes w's packed form into `packed` (PackedWeightsElements(out, in) elements), on `stream`.
absl::Status PackWeightsForWgmma(const __nv_bfloat16* w, int64_t out, int64_t in,
                                 __nv_bfloat16* packed, cudaStream_t stream);

// The cut SkinnyWgmmaLinearCuda makes for this product and a `config` it accepts, with an
// initialized workspace (for benchmarks and tests).
SkinnyWgmmaConfig SkinnyWgmmaChosenConfig(int64_t rows, int64_t in, int64_t out,
                                          SkinnyWgmmaConfig config = {});

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SKINNY_WGMMA_LINEAR_H_
