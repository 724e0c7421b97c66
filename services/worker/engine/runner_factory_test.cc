// Backend choice without a GPU (CI): names parse, `auto` falls back to the CPU, and `cuda` fails
// with a clear status instead of crashing. On the GPU machine cuda_backend_test covers `cuda`.
#include "services/worker/engine/runner_factory.h"

#include "gtest/gtest.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/model/random_weights.h"

#ifdef LAZYATTN_WITH_CUDA_BACKEND
#include "kernels/cuda/device_info.h"
#endif

namespace lazyattn {
namespace {

bool GpuVisible() {
#ifdef LAZYATTN_WITH_CUDA_BACKEND
  return CudaDeviceCount() > 0;
#else
  return false;
#endif
}

TEST(RunnerFactoryTest, ParsesBackendNames) {
  EXPECT_EQ(*ParseBackend("cpu"), Backend::kCpu);
  EXPECT_EQ(*ParseBackend("cuda"), Backend::kCuda);
  EXPECT_EQ(*ParseBackend("auto"), Backend::kAuto);
  auto bad = ParseBackend("tpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cpu, cuda, auto"), std::string::npos);
  EXPECT_EQ(BackendName(Backend::kCuda), "cuda");
}

TEST(RunnerFactoryTest, AutoWithoutAGpuIsTheCpuBackend) {
  if (GpuVisible()) GTEST_SKIP() << "a GPU is visible: cuda_backend_test covers auto there";
  EXPECT_EQ(ResolveBackend(Backend::kAuto), Backend::kCpu);
  auto w = MakeRandomWeights(TinyTestConfig(), 1);
  auto runner = CreateModelRunner(w.get(), {.backend = Backend::kAuto,
                                            .kv_budget_bytes = 1 << 20});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->backend_name(), "cpu");
  EXPECT_GT((*runner)->num_kv_blocks(), 0);
}

TEST(RunnerFactoryTest, CudaWithoutAGpuIsAClearError) {
  if (GpuVisible()) GTEST_SKIP() << "a GPU is visible: cuda_backend_test covers cuda there";
  auto w = MakeRandomWeights(TinyTestConfig(), 1);
  auto runner = CreateModelRunner(w.get(), {.backend = Backend::kCuda});
  const absl::StatusCode expected = CudaBackendBuiltIn() ? absl::StatusCode::kUnavailable
                                                         : absl::StatusCode::kFailedPrecondition;
  EXPECT_EQ(runner.status().code(), expected) << runner.status();
  EXPECT_NE(runner.status().message().find("cuda"), std::string::npos);
}

TEST(RunnerFactoryTest, RandomModelPathsParseAndServeOnTheCpu) {
  EXPECT_TRUE(IsRandomModelPath("random:small"));
  EXPECT_FALSE(IsRandomModelPath("models/x.gguf"));
  auto spec = ParseRandomModelPath("random:small:7");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->config.name, "small");
  EXPECT_EQ(spec->seed, 7u);
  EXPECT_EQ(ParseRandomModelPath("random:small")->seed, 1u);
  for (const char* bad : {"random:nope", "random:small:x", "random:small:-1", "small"}) {
    auto r = ParseRandomModelPath(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(RandomModelFingerprint(*spec, Backend::kCpu),
            RandomModelFingerprint(*spec, Backend::kCuda));
  EXPECT_NE(RandomModelFingerprint(*spec, Backend::kCpu),
            RandomModelFingerprint(*ParseRandomModelPath("random:small:8"), Backend::kCpu));
  auto runner = CreateRandomModelRunner(*spec, {.backend = Backend::kCpu,
                                                .kv_budget_bytes = 4 << 20});
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->backend_name(), "cpu");
  EXPECT_EQ((*runner)->config().hidden_size, 512);
  EXPECT_EQ((*runner)->num_kv_blocks(), KvBlocksForBudget(spec->config, 4 << 20));
}

}  // namespace
}  // namespace lazyattn
