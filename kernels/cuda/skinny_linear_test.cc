#include "kernels/cuda/skinny_linear.h"

#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/include/gemm.h"
#include "kernels/include/rms_norm.h"
#include "kernels/include/swiglu.h"

namespace lazyattn {
namespace {

using testing::DeviceBuffer;
using testing::FloatToBf16Bits;

using testing::RandomBf16;
using testing::AsBf16;
using testing::Bf16ToFloats;


// Against LinearCpu on the same bf16 inputs. The kernel sums each lane's strided products and
// then the warp's lanes, OpenBLAS another order: ~1e-6 relative in fp32. A bf16 output adds half
// an ulp, and with accumulate the rounded sum of two values: the tolerances of gemm_test.cc.
TEST(SkinnyLinearTest, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int in, out;
  };
  // in: one partial pass of a warp (8, 576), exact passes (4096), many passes with a partial
  // last (14,344); out: under one CTA (7), a partial last CTA (99), many CTAs (6144).
  const int rows = 1;
  for (Shape s : {Shape{8, 7}, Shape{576, 99}, Shape{4096, 6144}, Shape{14344, 99}}) {
    for (bool fp32 : {false, true}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << s.in << "x" << s.out << " fp32 "
                                          << fp32 << " accumulate " << accumulate);
        const auto x = RandomBf16(size_t(rows) * s.in, rng);
        const auto w = RandomBf16(size_t(s.out) * s.in, rng);
        std::vector<float> y0(size_t(rows) * s.out);
        for (auto& v : y0) v = testing::RoundBf16(std::normal_distribution<float>(0, 10)(rng));
        DeviceBuffer<uint16_t> dx, dw, dy16;
        DeviceBuffer<float> dy32;
        dx.Upload(x);
        dw.Upload(w);
        std::vector<uint16_t> y0b(y0.size());
        for (size_t i = 0; i < y0.size(); ++i) y0b[i] = FloatToBf16Bits(y0[i]);
        if (fp32) {
          dy32.Upload(y0);
          if (!accumulate) dy32.Poison();
        } else {
          dy16.Upload(y0b);
          if (!accumulate) dy16.Poison();
        }
        void* y = fp32 ? static_cast<void*>(dy32.get()) : static_cast<void*>(dy16.get());
        const absl::Status st = SkinnyLinearCuda(
            AsBf16(dx), AsBf16(dw), rows, s.in, s.out, y,
            fp32 ? GemmOutputType::kFp32 : GemmOutputType::kBf16, accumulate, nullptr);
        ASSERT_TRUE(st.ok()) << st;
        CUDA_ASSERT(cudaDeviceSynchronize());
        std::vector<float> want = y0;
        const auto xf = Bf16ToFloats(x), wf = Bf16ToFloats(w);
        LinearCpu(xf.data(), wf.data(), rows, s.in, s.out, want.data(), accumulate);
        const std::vector<float> got = fp32 ? dy32.Download() : Bf16ToFloats(dy16.Download());
        const double rms = testing::Rms(want);
        EXPECT_TRUE(testing::AllClose(got, want,
                                      fp32 ? testing::Tolerance{1e-4 * rms, 1e-4, 1e-4}
                                           : testing::Tolerance{1e-2 * rms, 1.0 / 128, 5e-3}));
      }
    }
  }
}

// The fused gate/up product against LinearCpu then SwiGluCpu in fp32: one bf16 rounding of the
// output (the CPU twin rounds nothing), so half a bf16 ulp plus the fp32 reordering above. Half
// an ulp is up to 2^-8 of a value just above a power of two, and with 3 outputs one such value
// can carry the whole L2 error (seed 1487066899: 0.00319), so the L2 bound is that too.
TEST(SkinnyLinearTest, SwiGluMatchesCpuTwins) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int rows = 1;
  for (int inter : {3, 1536, 14336}) {
    const int in = 576;
    SCOPED_TRACE(::testing::Message() << "inter " << inter);
    // Small weights keep gate and up near the curved part of silu.
    const auto x = RandomBf16(size_t(rows) * in, rng);
    const auto w = RandomBf16(size_t(2 * inter) * in, rng, 0.05f);
    DeviceBuffer<uint16_t> dx, dw, dact(size_t(rows) * inter);
    dx.Upload(x);
    dw.Upload(w);
    dact.Poison();
    const absl::Status st =
        SkinnyLinearSwiGluCuda(AsBf16(dx), AsBf16(dw), rows, in, inter,
                               reinterpret_cast<__nv_bfloat16*>(dact.get()), nullptr);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_ASSERT(cudaDeviceSynchronize());
    const auto xf = Bf16ToFloats(x), wf = Bf16ToFloats(w);
    std::vector<float> gate_up(size_t(rows) * 2 * inter), want(size_t(rows) * inter);
    LinearCpu(xf.data(), wf.data(), rows, in, 2 * inter, gate_up.data());
    SwiGluCpu(gate_up.data(), rows, inter, want.data());
    const double rms = testing::Rms(want);
    const double half_ulp = 1.0 / 256 + 1e-4;
    EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dact.Download()), want,
                                  testing::Tolerance{1e-3 * rms, half_ulp, half_ulp}));
  }
}

// Launched overlapped (the default), the kernel starts during the previous kernel's tail and
// must still read that kernel's output: an RMSNorm (which lets dependents launch once it runs)
// writes x, the product reads it, 50 times with fresh inputs, eagerly and replayed from a
// captured graph. A missing wait shows as stale or poisoned x.
TEST(SkinnyLinearTest, OverlappedLaunchWaitsForItsInput) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int dim = 4096, out = 4096;
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto w = RandomBf16(size_t(out) * dim, rng, 0.02f);
  const auto norm_w = RandomBf16(dim, rng);
  DeviceBuffer<uint16_t> dw, dnorm, dh(dim);
  DeviceBuffer<float> dx(dim), dy(out);
  dw.Upload(w);
  dnorm.Upload(norm_w);
  auto enqueue = [&]() -> absl::Status {
    absl::Status st = RmsNormF32ToBf16Cuda(dx.get(), AsBf16(dnorm), 1, dim, 1e-5f,
                                           reinterpret_cast<__nv_bfloat16*>(dh.get()), stream);
    if (!st.ok()) return st;
    return SkinnyLinearCuda(AsBf16(dh), AsBf16(dw), 1, dim, out, dy.get(),
                            GemmOutputType::kFp32, false, stream);
  };
  cudaGraphExec_t exec = nullptr;
  {
    cudaGraph_t graph = nullptr;
    CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status st = enqueue();
    CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(st.ok()) << st;
    CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
  }
  const auto wf = Bf16ToFloats(w), nf = Bf16ToFloats(norm_w);
  for (int i = 0; i < 50; ++i) {
    const bool graph = i % 2 == 1;
    SCOPED_TRACE(::testing::Message() << "run " << i << (graph ? " (graph)" : " (eager)"));
    std::vector<float> x(dim);
    std::normal_distribution<float> normal(0, 1);
    for (auto& v : x) v = normal(rng);
    CUDA_ASSERT(cudaMemcpyAsync(dx.get(), x.data(), dim * sizeof(float), cudaMemcpyHostToDevice,
                                stream));
    CUDA_ASSERT(cudaMemsetAsync(dh.get(), 0xff, dim * 2, stream));  // poisoned x of the product
    CUDA_ASSERT(cudaMemsetAsync(dy.get(), 0xff, out * 4, stream));
    if (graph) {
      CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    } else {
      const absl::Status st = enqueue();
      ASSERT_TRUE(st.ok()) << st;
    }
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    std::vector<float> h(dim), want(out);
    RmsNormCpu(x.data(), nf.data(), 1, dim, 1e-5f, h.data());
    for (auto& v : h) v = testing::RoundBf16(v);  // the kernel stores h in bf16
    LinearCpu(h.data(), wf.data(), 1, dim, out, want.data());
    const double rms = testing::Rms(want);
    // h may differ from the CPU's by one bf16 rounding in a few elements: 1e-2 of the rms.
    ASSERT_TRUE(
        testing::AllClose(dy.Download(), want, testing::Tolerance{1e-2 * rms, 1e-2, 3e-3}));
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

// The forms that normalize their own fp32 input equal RmsNormF32ToBf16Cuda followed by the plain
// forms bit for bit (the same arithmetic, rms_norm_row.cuh): dims under one pass of the norm's
// threads (8, 576), the 8B model's 4096, and one past the norm kernel's register-held part
// (4,104); fp32 accumulate into y, bf16 output, the SwiGLU form. Launched overlapped after a
// kernel that writes x, as in a step, on a stream that also replays them from a graph.
TEST(SkinnyLinearTest, RmsNormFormsEqualNormThenProduct) {
  SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  cudaStream_t stream = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int dim : {8, 576, 4096, 4104}) {
    const int out = 1000, inter = 700;
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    std::vector<float> x(dim), y0(out);
    std::normal_distribution<float> normal(0, 3);
    for (auto& v : x) v = normal(rng);
    for (auto& v : y0) v = normal(rng);
    const auto w = RandomBf16(size_t(2 * inter) * dim, rng, 0.05f);
    const auto norm_w = RandomBf16(dim, rng);
    DeviceBuffer<uint16_t> dw, dnorm, dh(dim), dact_ref(inter), dact(inter), dbf_ref(out),
        dbf(out);
    DeviceBuffer<float> dx_src, dx(dim), dy0, dy_ref(out), dy(out);
    dw.Upload(w);
    dnorm.Upload(norm_w);
    dx_src.Upload(x);
    dy0.Upload(y0);
    const auto* wp = AsBf16(dw);
    const auto* np = AsBf16(dnorm);
    auto* h = reinterpret_cast<__nv_bfloat16*>(dh.get());
    const float eps = 1e-5f;
    for (auto* b : {&dact_ref, &dact, &dbf_ref, &dbf}) b->Poison();
    // x is written on the stream right before each fused kernel (a copy, then an RMSNorm that
    // reads it, so the fused kernel follows a kernel as in a step).
    auto fresh_x = [&]() {
      CUDA_ASSERT(cudaMemcpyAsync(dx.get(), dx_src.get(), dim * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
      ASSERT_TRUE(RmsNormF32ToBf16Cuda(dx.get(), np, 1, dim, eps, h, stream).ok());
    };
    CUDA_ASSERT(cudaMemcpyAsync(dy_ref.get(), dy0.get(), out * 4, cudaMemcpyDeviceToDevice,
                                stream));
    CUDA_ASSERT(cudaMemcpyAsync(dy.get(), dy0.get(), out * 4, cudaMemcpyDeviceToDevice, stream));
    fresh_x();
    ASSERT_TRUE(SkinnyLinearCuda(h, wp, 1, dim, out, dy_ref.get(), GemmOutputType::kFp32, true,
                                 stream).ok());
    ASSERT_TRUE(SkinnyLinearCuda(h, wp, 1, dim, out, dbf_ref.get(), GemmOutputType::kBf16, false,
                                 stream).ok());
    ASSERT_TRUE(SkinnyLinearSwiGluCuda(h, wp, 1, dim, inter,
                                       reinterpret_cast<__nv_bfloat16*>(dact_ref.get()), stream)
                    .ok());
    fresh_x();
    ASSERT_TRUE(SkinnyRmsNormLinearCuda(dx.get(), np, eps, wp, dim, out, dy.get(),
                                        GemmOutputType::kFp32, true, stream).ok());
    fresh_x();
    ASSERT_TRUE(SkinnyRmsNormLinearCuda(dx.get(), np, eps, wp, dim, out, dbf.get(),
                                        GemmOutputType::kBf16, false, stream).ok());
    fresh_x();
    ASSERT_TRUE(SkinnyRmsNormLinearSwiGluCuda(dx.get(), np, eps, wp, dim, inter,
                                              reinterpret_cast<__nv_bfloat16*>(dact.get()),
                                              stream).ok());
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    EXPECT_EQ(dy.Download(), dy_ref.Download());
    EXPECT_EQ(dbf.Download(), dbf_ref.Download());
    EXPECT_EQ(dact.Download(), dact_ref.Download());
    // And the reference itself is a product of the norm: not a pair of equal garbage.
    std::vector<float> hf(dim), want(out);
    RmsNormCpu(x.data(), Bf16ToFloats(norm_w).data(), 1, dim, eps, hf.data());
    for (auto& v : hf) v = testing::RoundBf16(v);
    LinearCpu(hf.data(), Bf16ToFloats(w).data(), 1, dim, out, want.data());
    const double rms = testing::Rms(want);
    EXPECT_TRUE(testing::AllClose(Bf16ToFloats(dbf.Download()), want,
                                  testing::Tolerance{2e-2 * rms, 1.0 / 64, 5e-3}));
  }
  cudaStreamDestroy(stream);
}

TEST(SkinnyLinearTest, RmsNormFormsRejectWhatTheyDoNotTake) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<float> x(kMaxNormedIn + 8), y(8);
  DeviceBuffer<uint16_t> norm(kMaxNormedIn + 8), w((kMaxNormedIn + 8) * 8);
  auto call = [&](int64_t in, const float* xp) {
    return SkinnyRmsNormLinearCuda(xp, AsBf16(norm), 1e-5f, AsBf16(w), in, 8, y.get(),
                                   GemmOutputType::kFp32, false, nullptr)
        .code();
  };
  EXPECT_EQ(call(kMaxNormedIn + 8, x.get()), absl::StatusCode::kInvalidArgument);  // too long
  EXPECT_EQ(call(60, x.get()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(64, x.get() + 1), absl::StatusCode::kInvalidArgument);  // misaligned
  EXPECT_EQ(call(64, x.get()), absl::StatusCode::kOk);
  CUDA_ASSERT(cudaDeviceSynchronize());
}

TEST(SkinnyLinearTest, RejectsWhatItDoesNotTake) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<uint16_t> x(64), w(64 * 8);
  DeviceBuffer<float> y(64);
  auto call = [&](int64_t rows, int64_t in, const void* xp) {
    return SkinnyLinearCuda(static_cast<const __nv_bfloat16*>(xp), AsBf16(w), rows, in, 8,
                            y.get(), GemmOutputType::kFp32, false, nullptr)
        .code();
  };
  EXPECT_EQ(call(2, 64, x.get()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(0, 64, x.get()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(call(1, 60, x.get()), absl::StatusCode::kInvalidArgument);  // not 16-byte rows
  EXPECT_EQ(call(1, 64, x.get() + 1), absl::StatusCode::kInvalidArgument);  // misaligned
  EXPECT_FALSE(SkinnyLinearSupports(1, 64, 8, nullptr, reinterpret_cast<void*>(8)));
  EXPECT_TRUE(SkinnyLinearSupports(1, 64, 8, x.get(), w.get()));
}

}  // namespace
}  // namespace lazyattn
