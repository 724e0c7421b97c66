// Backend choice without a GPU (CI): names parse, `auto` falls back to the CPU, and `cuda` fails
// with a clear status instead of crashing; which loader a model path takes, and what loading it
// on the CPU gives. On the GPU machine cuda_backend_test covers `cuda`.
#include "services/worker/engine/runner_factory.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/host_memory.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/test_gguf_files.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

#ifdef LAZYATTN_WITH_CUDA_BACKEND
#include "kernels/cuda/device_info.h"
#endif

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

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
  EXPECT_EQ((*runner)->num_kv_blocks(),
            KvBlocksForBudget(spec->config, 4 << 20, ConfiguredCpuKvCacheDtype()));
}

// A CPU KV budget past the memory the machine has is refused before the pool is made: zeroing it
// grew the process until the OOM killer ended it (1 TiB, the most the config takes).
TEST(RunnerFactoryTest, ACpuKvBudgetPastTheAvailableMemoryIsRefused) {
  const int64_t available = AvailableHostMemoryBytes();
  ASSERT_GT(available, 0) << "neither /proc/meminfo nor the cgroup says how much memory is left";
  if (available >= int64_t{1} << 40) GTEST_SKIP() << "this machine has 1 TiB free";
  auto spec = ParseRandomModelPath("random:small");
  ASSERT_TRUE(spec.ok());
  auto runner = CreateRandomModelRunner(
      *spec, {.backend = Backend::kCpu, .kv_budget_bytes = int64_t{1} << 40});
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(runner.status().message().find("engine.kv_budget_bytes: 1099511627776 bytes of KV "
                                           "cache exceed the "),
            std::string::npos)
      << runner.status();
}

// A model file within every bound can claim 2^24 positions of head_dim 512: a 32 GiB RoPE table
// from a 0.7 MB file, zeroed until the OOM killer ended the process. Refused before it is built,
// naming the context length; the real shapes fit.
TEST(RunnerFactoryTest, ARopeTablePastTheAvailableMemoryIsRefused) {
  ModelConfig c;
  c.max_positions = int64_t{1} << 24;
  c.rope.head_dim = 512;
  const int64_t table = c.max_positions * 512 * 4;  // cos and sin, fp32
  absl::Status s = CheckRunnerHostMemory(c, /*kv_budget_bytes=*/0, table - 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("the model's context length (16777216 positions of "
                                     "head_dim 512) needs a RoPE table of 34359738368 bytes"));
  EXPECT_TRUE(CheckRunnerHostMemory(c, 0, table).ok());
  // On the CPU backend the KV pool comes first.
  s = CheckRunnerHostMemory(c, /*kv_budget_bytes=*/1 << 20, table);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("beside 1048576 bytes of KV cache"));
  EXPECT_THAT(CheckRunnerHostMemory(c, table + 1, table).message(),
              HasSubstr("engine.kv_budget_bytes: "));
  EXPECT_TRUE(CheckRunnerHostMemory(c, table + 1, /*available_bytes=*/-1).ok());  // unknown
  // Llama-3's 128K context of head_dim 128: 64 MiB.
  c.max_positions = 131072;
  c.rope.head_dim = 128;
  EXPECT_TRUE(CheckRunnerHostMemory(c, 0, int64_t{64} << 20).ok());
  EXPECT_FALSE(CheckRunnerHostMemory(c, 0, (int64_t{64} << 20) - 1).ok());
}

TEST(HostMemoryTest, MemAvailableIsReadInBytes) {
  EXPECT_EQ(MemAvailableBytes("MemTotal:       24000000 kB\nMemAvailable:   12345 kB\n"),
            int64_t{12345} << 10);
  EXPECT_EQ(MemAvailableBytes("MemTotal:       24000000 kB\n"), -1);
  EXPECT_EQ(MemAvailableBytes("MemAvailable:   many kB\n"), -1);
  EXPECT_EQ(MemAvailableBytes("MemAvailable:   12 MB\n"), -1);
  EXPECT_EQ(CgroupInactiveFileBytes("anon 10\nactive_file 7\ninactive_file 4096\n"), 4096);
  EXPECT_EQ(CgroupInactiveFileBytes("anon 10\n"), 0);
}

constexpr char kGguf[] = "tests/data/tiny/tiny-llama/tiny-llama-q8_0.gguf";
constexpr char kHfDir[] = "tests/data/tiny/tiny-llama/hf-f32";

// Only a GGUF file on the CUDA backend skips the fp32 host weights; random paths need no file.
TEST(ChooseModelLoadPathTest, GgufOnCudaIsLoadedOnTheGpuAndEverythingElseOnTheHost) {
  EXPECT_EQ(*ChooseModelLoadPath(kGguf, Backend::kCuda), ModelLoadPath::kGgufToGpu);
  EXPECT_EQ(*ChooseModelLoadPath(kGguf, Backend::kCpu), ModelLoadPath::kHostWeights);
  EXPECT_EQ(*ChooseModelLoadPath(kHfDir, Backend::kCuda), ModelLoadPath::kHostWeights);
  EXPECT_EQ(*ChooseModelLoadPath(std::string(kHfDir) + "/config.json", Backend::kCuda),
            ModelLoadPath::kHostWeights);
  EXPECT_EQ(*ChooseModelLoadPath(kHfDir, Backend::kCpu), ModelLoadPath::kHostWeights);
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    EXPECT_EQ(*ChooseModelLoadPath("random:small:3", b), ModelLoadPath::kRandom);
    EXPECT_EQ(*ChooseModelLoadPath("random:nope", b), ModelLoadPath::kRandom);  // parsed later
  }
  for (const std::string& path : testing::TestGgufFiles()) {
    EXPECT_EQ(*ChooseModelLoadPath(path, Backend::kCuda), ModelLoadPath::kGgufToGpu) << path;
  }
}

// A path that is no model fails with the host loader's own status, whatever the backend.
TEST(ChooseModelLoadPathTest, BadPathsFailAsTheHostLoaderDoes) {
  const std::string missing = "/nonexistent/model.gguf";
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    auto choice = ChooseModelLoadPath(missing, b);
    EXPECT_EQ(choice.status(), LoadModelWeights(missing).status());
    EXPECT_EQ(choice.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(choice.status().message().find(missing), std::string::npos);
  }
  auto unknown = ChooseModelLoadPath("tests/data/tiny/golden.json", Backend::kCuda);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("tests/data/tiny/golden.json"), std::string::npos);
}

// The CPU backend serves a GGUF from the host loader: its tokenizer, its fingerprint, and the
// weights the runner borrows, kept alive beside it.
TEST(LoadServedModelTest, CpuServesTheHostLoadersModel) {
  auto host = LoadModel(kGguf);
  ASSERT_TRUE(host.ok()) << host.status();
  auto served =
      LoadServedModel(kGguf, {.runner = {.backend = Backend::kCpu, .kv_budget_bytes = 1 << 20}});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->runner->backend_name(), "cpu");
  EXPECT_EQ(served->fingerprint, ModelFingerprint(*host->weights));
  EXPECT_EQ(served->config.vocab_size, host->weights->config.vocab_size);
  ASSERT_NE(served->host_weights, nullptr);
  ASSERT_NE(served->tokenizer, nullptr);
  EXPECT_EQ(TokenizerFingerprint(*served->tokenizer), TokenizerFingerprint(*host->tokenizer));
  EXPECT_EQ(served->runner->num_kv_blocks(),
            KvBlocksForBudget(served->config, 1 << 20, ConfiguredCpuKvCacheDtype()));

  auto bare = LoadServedModel(
      kHfDir,
      {.runner = {.backend = Backend::kCpu, .kv_budget_bytes = 1 << 20}, .load_tokenizer = false});
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->tokenizer, nullptr);
  EXPECT_EQ(bare->fingerprint, ModelFingerprint(**LoadModelWeights(kHfDir)));
}

TEST(LoadServedModelTest, RandomPathsServeWithTheByteTokenizer) {
  auto served = LoadServedModel("random:small:7",
                                {.runner = {.backend = Backend::kCpu, .kv_budget_bytes = 4 << 20}});
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->config.name, "small");
  EXPECT_EQ(served->fingerprint,
            RandomModelFingerprint(*ParseRandomModelPath("random:small:7"), Backend::kCpu));
  ASSERT_NE(served->tokenizer, nullptr);
  EXPECT_EQ(TokenizerFingerprint(*served->tokenizer), TokenizerFingerprint(*MakeByteTokenizer()));

  ModelLoadStage stage = ModelLoadStage::kBackend;
  auto bad = LoadServedModel("random:nope", {.runner = {.backend = Backend::kCpu}}, &stage);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stage, ModelLoadStage::kModel);
}

// Errors say which step failed: a missing or corrupt file is the model's fault on every backend
// (the CUDA path checks the file before it looks for a device); cuda without a GPU is the
// backend's.
TEST(LoadServedModelTest, FailuresNameTheFileOrTheBackend) {
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    SCOPED_TRACE(BackendName(b));
    ModelLoadStage stage = ModelLoadStage::kBackend;
    auto missing = LoadServedModel("/nonexistent/model.gguf", {.runner = {.backend = b}}, &stage);
    EXPECT_EQ(missing.status(), LoadModel("/nonexistent/model.gguf").status());
    EXPECT_EQ(stage, ModelLoadStage::kModel);
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("lazyattn_runner_factory_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string corrupt = (dir / "corrupt.gguf").string();
  std::ofstream(corrupt) << "GGUF, truncated";
  ModelLoadStage stage = ModelLoadStage::kBackend;
  auto bad = LoadServedModel(corrupt, {.runner = {.backend = Backend::kCpu}}, &stage);
  EXPECT_EQ(bad.status(), LoadModel(corrupt).status());
  EXPECT_NE(bad.status().message().find(corrupt), std::string::npos) << bad.status();
  EXPECT_EQ(stage, ModelLoadStage::kModel);
  std::filesystem::remove_all(dir);

  if (GpuVisible()) return;  // cuda_model_loader_test covers cuda there
  for (const char* path : {kGguf, kHfDir, "random:small"}) {
    SCOPED_TRACE(path);
    stage = ModelLoadStage::kModel;
    auto no_gpu = LoadServedModel(path, {.runner = {.backend = Backend::kCuda}}, &stage);
    EXPECT_EQ(no_gpu.status().code(), CudaBackendBuiltIn() ? absl::StatusCode::kUnavailable
                                                           : absl::StatusCode::kFailedPrecondition)
        << no_gpu.status();
    EXPECT_NE(no_gpu.status().message().find("cuda"), std::string::npos);
    EXPECT_EQ(stage, ModelLoadStage::kBackend);
  }
}

}  // namespace
}  // namespace lazyattn
