#include "kernels/cuda/device_info.h"

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_check.h"

namespace lazyattn {
namespace {

TEST(CudaCheckTest, ErrorsBecomeStatusesNamingTheCall) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "f()", "x.cu", 1).ok());
  const absl::Status s = CudaStatus(cudaErrorInvalidValue, "cudaMemcpy(a, b)", "x.cu", 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("cudaMemcpy(a, b)"), std::string::npos);
  EXPECT_NE(s.message().find("x.cu:7"), std::string::npos);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "g()", "x.cu", 2).code(), absl::StatusCode::kUnavailable);
}

// An error that leaves the context usable (here an allocation refused) is read off the runtime's
// last-error slot, so the next launch check (cudaGetLastError) does not report it again.
TEST(CudaCheckTest, AnErrorThatLeavesTheContextUsableIsNotReportedAgain) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device visible (GPU tests run via tests/gpu/run.sh)";
  void* p = nullptr;
  const absl::Status s =
      CudaStatus(cudaMalloc(&p, size_t{1} << 60), "cudaMalloc(1 EiB)", "x.cu", 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(DeviceInfoTest, MissingDeviceIsUnavailableNotACrash) {
  EXPECT_EQ(QueryDevice(CudaDeviceCount()).status().code(), absl::StatusCode::kUnavailable);
}

TEST(DeviceInfoTest, SmokeKernelRunsOnEveryVisibleGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible (GPU tests run via tests/gpu/run.sh)";
  for (int d = 0; d < CudaDeviceCount(); ++d) {
    auto info = QueryDevice(d);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_GT(info->sm_count, 0);
    EXPECT_GT(info->l2_bytes, 0);
    EXPECT_TRUE(RunSmokeKernel(d).ok());
  }
}

}  // namespace
}  // namespace lazyattn
