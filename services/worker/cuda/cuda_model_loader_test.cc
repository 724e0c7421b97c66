// The CUDA backend's GGUF loader (LoadGgufModelToGpu, and LoadServedModel's choice of it) against
// the host loader: the same bf16 weights bit for bit, the same fingerprint, the same tokenizer,
// the same errors. The error tests need no GPU (they fail before any device work); the rest skip
// without one.
#include "services/worker/cuda/cuda_model_loader.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "services/worker/engine/runner_factory.h"
#include "services/worker/model/gguf_file.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/model_loader.h"
#include "services/worker/model/model_weights.h"
#include "services/worker/model/test_gguf_files.h"

namespace lazyattn {
namespace {

std::vector<uint16_t> Download(const __nv_bfloat16* p, int64_t n) {
  std::vector<uint16_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// Every tensor of `a` and `b` (same config `c`) equal bit for bit; one failure per tensor.
void ExpectSameWeights(const ModelConfig& c, const CudaModelWeights& a, const CudaModelWeights& b) {
  auto same = [&](const __nv_bfloat16* x, const __nv_bfloat16* y, WeightSlot slot,
                  const std::string& what) {
    const int64_t n = WeightSlotElements(c, slot == WeightSlot::kLmHead && c.tie_word_embeddings
                                                ? WeightSlot::kTokenEmbedding
                                                : slot);
    const auto hx = Download(x, n), hy = Download(y, n);
    for (int64_t i = 0; i < n; ++i) {
      if (hx[i] != hy[i]) {
        ADD_FAILURE() << what << ": element " << i << " differs (" << hx[i] << " uploaded, "
                      << hy[i] << " loaded on the GPU)";
        return;
      }
    }
  };
  same(a.token_embedding(), b.token_embedding(), WeightSlot::kTokenEmbedding, "embedding");
  same(a.output_norm(), b.output_norm(), WeightSlot::kOutputNorm, "output norm");
  same(a.lm_head(), b.lm_head(), WeightSlot::kLmHead, "lm head");
  for (int l = 0; l < c.num_layers; ++l) {
    const CudaLayerWeights &x = a.layer(l), &y = b.layer(l);
    const std::string at = " of layer " + std::to_string(l);
    same(x.attn_norm, y.attn_norm, WeightSlot::kAttnNorm, "attn norm" + at);
    same(x.wqkv, y.wqkv, WeightSlot::kWqkv, "wqkv" + at);
    same(x.wo, y.wo, WeightSlot::kWo, "wo" + at);
    same(x.ffn_norm, y.ffn_norm, WeightSlot::kFfnNorm, "ffn norm" + at);
    same(x.w_gate_up, y.w_gate_up, WeightSlot::kGateUp, "gate/up" + at);
    same(x.w_down, y.w_down, WeightSlot::kDown, "down" + at);
  }
}

// Every GGUF the tests carry (tests/data/tiny: F32, F16, Q8_0 and Q4_0 tensors, tied and untied,
// Llama-3 RoPE factors; SmolLM2's Q4_1 when tests/gpu/run.sh unpacked it): the same config, the
// same bf16 weights as the host loader's fp32 uploaded with Upload, the same fingerprint and the
// same tokenizer.
TEST(CudaModelLoaderTest, GgufOnTheGpuEqualsTheHostLoader) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> paths = testing::TestGgufFiles();
  ASSERT_GE(paths.size(), 4u) << "tests/data/tiny holds the tiny models' GGUF files";
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    auto host = LoadModel(path);
    ASSERT_TRUE(host.ok()) << host.status();
    auto uploaded = CudaModelWeights::Upload(*host->weights);
    auto loaded = LoadGgufModelToGpu(path);
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const ModelConfig& c = host->weights->config;
    const CudaModelWeights& gpu = *loaded->weights;
    EXPECT_EQ(gpu.config().num_layers, c.num_layers);
    EXPECT_EQ(gpu.config().vocab_size, c.vocab_size);
    EXPECT_EQ(gpu.config().rope.freq_factors, c.rope.freq_factors);
    EXPECT_EQ(gpu.bytes(), (*uploaded)->bytes());
    ExpectSameWeights(c, **uploaded, gpu);
    EXPECT_EQ(loaded->fingerprint, ModelFingerprint(*host->weights));
    ASSERT_NE(loaded->tokenizer, nullptr);
    EXPECT_EQ(TokenizerFingerprint(*loaded->tokenizer), TokenizerFingerprint(*host->tokenizer));

    auto bare = LoadGgufModelToGpu(path, /*load_tokenizer=*/false);
    ASSERT_TRUE(bare.ok()) << bare.status();
    EXPECT_EQ(bare->tokenizer, nullptr);
    EXPECT_EQ(bare->fingerprint, loaded->fingerprint);
  }
}

// What the worker and the CLI call, on SmolLM2 (the tiny test models' head_dim of 16 is below
// what the CUDA runner serves): on cuda the GGUF takes the GPU loader and keeps no host weights,
// with the host path's fingerprint, tokenizer and config, and its runner computes the logits of
// the runner built over the host loader's weights uploaded, bit for bit.
TEST(CudaModelLoaderTest, ServedGgufOnCudaMatchesTheHostPath) {
  SKIP_WITHOUT_GPU();
  const std::string path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not fetched (tools/fetch-model)";
  ASSERT_EQ(*ChooseModelLoadPath(path, Backend::kCuda), ModelLoadPath::kGgufToGpu);
  const RunnerOptions cuda{.backend = Backend::kCuda, .kv_budget_bytes = 16 << 20};
  auto served = LoadServedModel(path, {.runner = cuda});
  ASSERT_TRUE(served.ok()) << served.status();
  auto host = LoadModel(path);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(served->runner->backend_name(), "cuda");
  EXPECT_EQ(served->host_weights, nullptr);
  EXPECT_EQ(served->config.hidden_size, host->weights->config.hidden_size);
  EXPECT_EQ(served->config.vocab_size, host->weights->config.vocab_size);
  EXPECT_EQ(served->fingerprint, ModelFingerprint(*host->weights));
  ASSERT_NE(served->tokenizer, nullptr);
  EXPECT_EQ(TokenizerFingerprint(*served->tokenizer), TokenizerFingerprint(*host->tokenizer));

  auto uploaded = CreateModelRunner(host->weights.get(), cuda);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  auto ids =
      served->tokenizer->EncodeWithSpecials("The Amstel river flows through Amsterdam.", false);
  const int64_t n = static_cast<int64_t>(ids.size());
  ASSERT_LE(n, kDefaultKvBlockSize * 4);
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = i;
  std::vector<KvBlockEntry> table;
  for (int64_t b = 0; b * kDefaultKvBlockSize < n; ++b) {
    table.push_back(PackKvBlockEntry(static_cast<uint32_t>(b), 0,
                                     static_cast<uint32_t>(std::min<int64_t>(
                                         kDefaultKvBlockSize, n - b * kDefaultKvBlockSize))));
  }
  const ForwardChunk chunk{
      .tokens = ids, .kv_slots = slots, .block_table = table, .return_logits = true};
  auto a = served->runner->Forward(std::span(&chunk, 1));
  auto b = (*uploaded)->Forward(std::span(&chunk, 1));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->logits.size(), static_cast<size_t>(served->config.vocab_size));
  EXPECT_EQ(a->logits, b->logits);
}

// The GPU loader fails as the host loader does, naming the file, before touching the device
// (so these run without a GPU too).
TEST(CudaModelLoaderTest, ErrorsAreTheHostLoadersAndNameTheFile) {
  const std::string missing = "/nonexistent/model.gguf";
  auto gpu_missing = LoadGgufModelToGpu(missing);
  auto host_missing = LoadModel(missing);
  EXPECT_EQ(gpu_missing.status(), host_missing.status());
  EXPECT_EQ(gpu_missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gpu_missing.status().message().find(missing), std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() /
                   ("lazyattn_cuda_model_loader_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string corrupt = (dir / "corrupt.gguf").string();
  std::ofstream(corrupt) << "GGUF but not really a GGUF file at all";
  auto gpu_corrupt = LoadGgufModelToGpu(corrupt);
  auto host_corrupt = LoadModel(corrupt);
  EXPECT_FALSE(gpu_corrupt.ok());
  EXPECT_EQ(gpu_corrupt.status(), host_corrupt.status());
  EXPECT_NE(gpu_corrupt.status().message().find(corrupt), std::string::npos)
      << gpu_corrupt.status();
  std::filesystem::remove_all(dir);

  auto hf = LoadGgufModelToGpu("tests/data/tiny/tiny-llama/hf-f32");
  EXPECT_EQ(hf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(hf.status().message().find("not a GGUF file"), std::string::npos) << hf.status();
}

// One Inf weight makes every logit NaN, so every request would end at once with no tokens: the
// GPU loader refuses the file before anything reaches the device, as the host loader does.
// A copy of the tiny F32 GGUF with element 100 of blk.0.attn_q.weight set to `value`, in a
// temporary folder the caller removes (returned as the file's path).
std::string TinyF32GgufWithWeight(float value, const std::string& tag) {
  const std::string from = "tests/data/tiny/tiny-llama/tiny-llama-f32.gguf";
  std::ifstream in(from, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(bytes.empty()) << from;
  size_t at = std::string::npos;
  {
    auto file = GgufFile::Open(from);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return "";
    auto tensor = (*file)->FindTensor("blk.0.attn_q.weight");
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    if (!tensor.ok()) return "";
    // The tensor's first 64 bytes (random weights) locate its data in the file.
    at = bytes.find(std::string(reinterpret_cast<const char*>((*tensor)->data), 64));
    EXPECT_NE(at, std::string::npos);
    if (at == std::string::npos) return "";
  }
  bytes.replace(at + 100 * sizeof(float), sizeof(float), reinterpret_cast<const char*>(&value),
                sizeof(float));
  const auto dir = std::filesystem::temp_directory_path() /
                   ("lazyattn_cuda_model_loader_" + tag + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / (tag + ".gguf")).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(CudaModelLoaderTest, NonFiniteWeightsAreRefusedAsTheHostLoaderRefusesThem) {
  const std::string path = TinyF32GgufWithWeight(std::numeric_limits<float>::infinity(), "inf");
  ASSERT_FALSE(path.empty());
  auto gpu = LoadGgufModelToGpu(path);
  auto host = LoadModel(path);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu.status(), host.status());
  EXPECT_NE(gpu.status().message().find(path + ": tensor blk.0.attn_q.weight has a non-finite "
                                               "value at element 100 (inf)"),
            std::string::npos)
      << gpu.status();
}

// 3.3962e38 is finite in fp32 (the host loader keeps it) but rounds to Inf in bf16, where it would
// make every logit NaN as an Inf weight does: both GPU paths refuse it, naming the tensor.
TEST(CudaModelLoaderTest, WeightsPastTheBf16RangeAreRefusedOnTheGpu) {
  const float past_bf16 = 3.3962e38f;
  const std::string path = TinyF32GgufWithWeight(past_bf16, "bf16_overflow");
  ASSERT_FALSE(path.empty());
  auto gpu = LoadGgufModelToGpu(path);  // fails before any device work
  auto host = LoadModel(path);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gpu.status().message().find(path + ": tensor blk.0.attn_q.weight has a value at "
                                               "element 100 (3.3962e+38) that is not finite in "
                                               "bfloat16"),
            std::string::npos)
      << gpu.status();
  ASSERT_TRUE(host.ok()) << host.status();
  if (CudaDeviceCount() > 0) {
    // The host loader may reorder q's rows for RoPE, so the element's index in the fused wqkv
    // is not asserted.
    auto uploaded = CudaModelWeights::Upload(*host->weights);
    EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(uploaded.status().message().find("tensor layers.0.wqkv has a value at element "),
              std::string::npos)
        << uploaded.status();
    EXPECT_NE(uploaded.status().message().find("(3.3962e+38) that is not finite in bfloat16"),
              std::string::npos)
        << uploaded.status();
  }
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

}  // namespace
}  // namespace lazyattn
