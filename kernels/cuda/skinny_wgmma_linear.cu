// Few-row linear layers on Hopper tensor cores (skinny_wgmma_linear.h has the contract).
//
// CTA = one consumer warpgroup (warps 0-3) + one producer warp (warp 4); it owns 64 output
// features (`tile`) and a range of K (`split`). Per stage the producer's lane 0 TMA-loads the
// 64 x 64 weight tile and the rows x 64 tile of x into 128-byte-swizzled shared memory and
// arms the stage's "full" mbarrier with their byte count; the consumers wait on it, issue four
// wgmma m64nNk16 (K = 64), wait for them, and arrive on the stage's "empty" mbarrier, which the
// producer waits on before it refills the stage. The accumulator is y^T for the tile: 64 x N
// fp32, N/2 registers a thread.
#include "kernels/cuda/skinny_wgmma_linear.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_overlap.cuh"

namespace lazyattn {
namespace {

constexpr int kTileN = 64;  // output features per CTA: wgmma's M
constexpr int kTileK = 64;  // K per stage: one 128-byte swizzle row of bf16
constexpr int kStages = 8;
constexpr int kConsumers = 128;  // one warpgroup
constexpr int kThreads = kConsumers + 32;
constexpr int kMaxSplits = 8;

template <int kRows>
struct Layout {
  static constexpr int kABytes = kTileN * kTileK * 2;  // weights
  static constexpr int kBBytes = kRows * kTileK * 2;   // x
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kStageBytes % 1024 == 0, "swizzled tiles must stay 1024-byte aligned");
  static constexpr int kFull = kStages * kStageBytes;  // mbarriers: full[kStages], empty[kStages]
  static constexpr int kEmpty = kFull + kStages * 8;
  static constexpr int kBytes = kEmpty + kStages * 8 + 1024;  // + realignment of the base
};

struct Params {
  void* y;
  int rows, in, out, k_blocks, splits;
  bool y_fp32, accumulate;
  int* counters;
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// A wait that never completes (a wrong byte count or descriptor) traps after ~2^28 polls
// instead of hanging the process: the launch then fails with a CUDA error a test can report.
constexpr uint32_t kMaxPolls = 1u << 28;

__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    if (polls == kMaxPolls) __trap();
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// TMA: the box at (c0 = k, c1 = row) of `map` into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// wgmma shared-memory matrix descriptor of a K-major tile with 128-byte swizzle: rows of 128
// bytes, 8-row atoms 1024 bytes apart (stride byte offset); the leading byte offset is unused in
// this mode. Advancing K by 16 elements adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t Desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

template <int kN>
__device__ void Wgmma(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b);

template <>
__device__ __forceinline__ void Wgmma<8>(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3}, "
      "%4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void Wgmma<16>(float (&d)[8], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void Wgmma<32>(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void Wgmma<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7,"
      "%8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23,"
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}

// The accumulator element i of thread (warp w, lane l): feature (wgmma row) and x row (column).
__device__ __forceinline__ int AccFeature(int w, int l, int i) {
  return 16 * w + l / 4 + 8 * ((i / 2) % 2);
}
__device__ __forceinline__ int AccRow(int l, int i) { return 8 * (i / 4) + 2 * (l % 4) + (i % 2); }

template <int kRows>
__global__ void __launch_bounds__(kThreads) SkinnyWgmmaKernel(
    const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
    const Params p) {
  using L = Layout<kRows>;
  extern __shared__ uint8_t smem_raw[];
  // Swizzled tiles need 1024-byte alignment; dynamic shared memory only promises 16.
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const uint32_t base = SmemAddr(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x, tile = blockIdx.y;
  const int n0 = tile * kTileN;
  const int per = (p.k_blocks + p.splits - 1) / p.splits;
  const int kb_begin = min(p.k_blocks, split * per), kb_end = min(p.k_blocks, kb_begin + per);
  const int steps = kb_end - kb_begin;
  auto full = [&](int s) { return base + L::kFull + 8 * s; };
  auto empty = [&](int s) { return base + L::kEmpty + 8 * s; };
  auto a_tile = [&](int s) { return base + s * L::kStageBytes; };
  auto b_tile = [&](int s) { return base + s * L::kStageBytes + L::kABytes; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), kConsumers / 32);
    }
    // Make the initialized barriers visible to the TMA unit (the async proxy).
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumers / 32) {  // producer
    if (lane == 0) {
      // Weights first: they never depend on the previous kernel, so their stages are in flight
      // before the wait (launch_overlap.cuh).
      const int first = min(steps, kStages);
      for (int i = 0; i < first; ++i) {
        MbarArriveExpectTx(full(i), L::kStageBytes);
        TmaLoad2d(a_tile(i), &map_w, (kb_begin + i) * kTileK, n0, full(i));
      }
      WaitForPrerequisiteGrid();
      AllowDependentLaunch();
      for (int i = 0; i < first; ++i) {
        TmaLoad2d(b_tile(i), &map_x, (kb_begin + i) * kTileK, 0, full(i));
      }
      for (int i = kStages; i < steps; ++i) {
        const int s = i % kStages;
        MbarWait(empty(s), ((i / kStages) - 1) & 1);
        MbarArriveExpectTx(full(s), L::kStageBytes);
        TmaLoad2d(a_tile(s), &map_w, (kb_begin + i) * kTileK, n0, full(s));
        TmaLoad2d(b_tile(s), &map_x, (kb_begin + i) * kTileK, 0, full(s));
      }
    } else {
      WaitForPrerequisiteGrid();
      AllowDependentLaunch();
    }
    return;
  }

  // Consumers.
  WaitForPrerequisiteGrid();
  AllowDependentLaunch();
  float d[kRows / 2];
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) d[i] = 0.f;
  for (int i = 0; i < steps; ++i) {
    const int s = i % kStages;
    MbarWait(full(s), (i / kStages) & 1);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      Wgmma<kRows>(d, Desc(a_tile(s) + 32 * kk), Desc(b_tile(s) + 32 * kk));
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    if (lane == 0) MbarArrive(empty(s));
  }

  // Epilogue: the splits of a tile add into y one after another, in split order.
  const bool ordered = p.splits > 1;
  if (ordered && split > 0) {
    if (threadIdx.x == 0) {
      int turn = -1;
      uint32_t polls = 0;
      do {
        if (++polls == kMaxPolls) __trap();
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];"
                     : "=r"(turn)
                     : "l"(p.counters + tile)
                     : "memory");
      } while (turn != split);
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
  }
  const bool add = p.accumulate || split > 0;
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) {
    const int r = AccRow(lane, i), n = n0 + AccFeature(warp, lane, i);
    if (r >= p.rows || n >= p.out) continue;
    const int64_t at = static_cast<int64_t>(r) * p.out + n;
    if (p.y_fp32) {
      // Read through L2 (__ldcg): the previous split's sums were written by another SM.
      float* y = static_cast<float*>(p.y) + at;
      *y = add ? __ldcg(y) + d[i] : d[i];
    } else {
      __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y) + at;
      *y = __float2bfloat16_rn(add ? __bfloat162float(*y) + d[i] : d[i]);
    }
  }
  if (ordered) {
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
    if (threadIdx.x == 0) {
      const int next = split + 1 == p.splits ? 0 : split + 1;  // the last split resets it
      asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p.counters + tile), "r"(next)
                   : "memory");
    }
  }
}

PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D bf16 tensor map over a row-major [rows][cols] matrix, boxes of box_rows x 64 columns,
// 128-byte swizzle; reads past the matrix fill zeros.
absl::Status MakeMap(CUtensorMap* map, const void* ptr, int64_t rows, int64_t cols,
                     int box_rows) {
  auto encode = EncodeTiled();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled is unavailable");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr),
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: ", int(r)));
  }
  return absl::OkStatus();
}

int SmCount() {
  static const int count = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n;
  }();
  return count;
}

template <int kRows>
absl::Status Launch(const CUtensorMap& map_w, const CUtensorMap& map_x, const Params& p,
                    cudaStream_t stream) {
  static const absl::Status attr = [] {
    RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(SkinnyWgmmaKernel<kRows>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              Layout<kRows>::kBytes));
    return absl::OkStatus();
  }();
  if (!attr.ok()) return attr;
  const dim3 grid(p.splits, (p.out + kTileN - 1) / kTileN);
  RETURN_IF_CUDA_ERROR(LaunchOverlapped(SkinnyWgmmaKernel<kRows>, grid, dim3(kThreads),
                                        Layout<kRows>::kBytes, stream, map_w, map_x, p));
  return absl::OkStatus();
}

}  // namespace

SkinnyWgmmaWorkspace::~SkinnyWgmmaWorkspace() {
  if (counters_ != nullptr) cudaFree(counters_);
}

absl::Status SkinnyWgmmaWorkspace::Init() {
  if (counters_ != nullptr) return absl::OkStatus();
  RETURN_IF_CUDA_ERROR(cudaMalloc(&counters_, kMaxTiles * sizeof(int)));
  RETURN_IF_CUDA_ERROR(cudaMemset(counters_, 0, kMaxTiles * sizeof(int)));
  return absl::OkStatus();
}

bool SkinnyWgmmaLinearSupports(int64_t rows, int64_t in, int64_t out, const void* x,
                               const void* w, const void* y) {
  static const bool hopper = [] {
    int device = 0, major = 0, minor = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) ==
               cudaSuccess &&
           major == 9 && minor == 0;
  }();
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return hopper && rows >= 1 && rows <= 64 && in >= kTileK && in % 8 == 0 && out >= 1 &&
         (out + kTileN - 1) / kTileN <= SkinnyWgmmaWorkspace::kMaxTiles &&
         in <= (int64_t{1} << 30) && aligned(x) && aligned(w) && aligned(y);
}

absl::Status SkinnyWgmmaLinearCuda(const __nv_bfloat16* x, const __nv_bfloat16* w, int64_t rows,
                                   int64_t in, int64_t out, void* y, GemmOutputType y_type,
                                   bool accumulate, const SkinnyWgmmaWorkspace& workspace,
                                   cudaStream_t stream, int splits) {
  if (!SkinnyWgmmaLinearSupports(rows, in, out, x, w, y)) {
    return absl::InvalidArgumentError(absl::StrCat("skinny wgmma linear: unsupported product ",
                                                   rows, "x", in, " * ", out, "x", in, "^T"));
  }
  const bool fp32 = y_type == GemmOutputType::kFp32;
  const int tiles = static_cast<int>((out + kTileN - 1) / kTileN);
  const int k_blocks = static_cast<int>((in + kTileK - 1) / kTileK);
  if (splits <= 0) {
    // Fill the SMs once; a bf16 y is written once, never summed in bf16.
    splits = fp32 ? std::clamp(SmCount() / tiles, 1, kMaxSplits) : 1;
  }
  splits = std::clamp(std::min(splits, k_blocks), 1, kMaxSplits);
  if (splits > 1 && !fp32) {
    return absl::InvalidArgumentError("skinny wgmma linear: split K needs an fp32 output");
  }
  if (splits > 1 && workspace.counters() == nullptr) {
    return absl::InvalidArgumentError(
        "skinny wgmma linear: split K needs an initialized workspace");
  }
  const int row_tile = rows <= 8 ? 8 : rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
  CUtensorMap map_w, map_x;
  RETURN_IF_ERROR(MakeMap(&map_w, w, out, in, kTileN));
  RETURN_IF_ERROR(MakeMap(&map_x, x, rows, in, row_tile));
  const Params p{.y = y,
                 .rows = static_cast<int>(rows),
                 .in = static_cast<int>(in),
                 .out = static_cast<int>(out),
                 .k_blocks = k_blocks,
                 .splits = splits,
                 .y_fp32 = fp32,
                 .accumulate = accumulate,
                 .counters = workspace.counters()};
  switch (row_tile) {
    case 8:
      return Launch<8>(map_w, map_x, p, stream);
    case 16:
      return Launch<16>(map_w, map_x, p, stream);
    case 32:
      return Launch<32>(map_w, map_x, p, stream);
    default:
      return Launch<64>(map_w, map_x, p, stream);
  }
}

}  // namespace lazyattn
