// CPU backend throughput on a real model: prefill tokens/s for an N-token prompt and decode
// tokens/s over M generated tokens, median of R runs. Prints a table and one JSON line (for
// tools/bench/cpu-vs-llamacpp, which puts it beside llama.cpp's numbers in docs/benchmarks.md).
//
//   lazyattn-bench-cpu --model PATH [--prompt-tokens 512] [--decode-tokens 128] [--repeats 3]
//                      [--threads N] [--fp32] [--activations int8|fp32] [--kv-cache f16|f32]
// --threads: kernel threads (default: physical cores); --fp32: the weights dequantized to fp32 at
// load (the backend's form before packed weights), for comparison; --activations: the decode
// products' activation precision (engine.cpu_activations, default int8); --kv-cache: the KV
// pools' element type (engine.cpu_kv_cache, default f16).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "kernels/include/cpu_threads.h"
#include "kernels/include/quant_linear.h"
#include "nlohmann/json.hpp"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/model/model_loader.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(int argc, char** argv) {
  CliArgs args;
  args.Declare("model", CliArgs::Kind::kValue, "a .gguf file or an HF model directory");
  args.Declare("prompt-tokens", CliArgs::Kind::kValue, "prompt length (default 512)");
  args.Declare("decode-tokens", CliArgs::Kind::kValue, "generated tokens per run (default 128)");
  args.Declare("repeats", CliArgs::Kind::kValue, "runs; the median is reported (default 3)");
  args.Declare("threads", CliArgs::Kind::kValue, "kernel threads (default: physical cores)");
  args.Declare("fp32", CliArgs::Kind::kSwitch, "dequantize the weights to fp32 at load");
  args.Declare("activations", CliArgs::Kind::kValue,
               "decode activations: int8 (default) or fp32 (engine.cpu_activations)");
  args.Declare("kv-cache", CliArgs::Kind::kValue,
               "KV element type: f16 (default) or f32 (engine.cpu_kv_cache)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok() || !args.Has("model")) {
    std::cerr << "usage: lazyattn-bench-cpu --model PATH [flags]\n" << args.Help();
    return 2;
  }
  const int64_t n_prompt = args.Int("prompt-tokens", 512).value_or(512);
  const int64_t n_decode = args.Int("decode-tokens", 128).value_or(128);
  const int64_t repeats = std::max<int64_t>(1, args.Int("repeats", 3).value_or(3));

  const int threads = static_cast<int>(args.Int("threads", 0).value_or(0));
  SetCpuKernelThreads(threads);
  CpuActivations activations = CpuActivations::kInt8;
  if (!ParseCpuActivations(args.String("activations", "int8"), &activations)) {
    std::cerr << "--activations: expected int8 or fp32, got \"" << args.String("activations", "")
              << "\"\n";
    return 2;
  }
  SetCpuActivations(activations);
  const std::string act_name(CpuActivationsName(activations));
  KvCacheDtype kv_cache = KvCacheDtype::kF16;
  if (!ParseKvCacheDtype(args.String("kv-cache", "f16"), &kv_cache)) {
    std::cerr << "--kv-cache: expected f16 or f32, got \"" << args.String("kv-cache", "") << "\"\n";
    return 2;
  }
  SetCpuKvCacheDtype(kv_cache);
  const std::string kv_name(KvCacheDtypeName(kv_cache));
  const bool fp32 = args.Has("fp32");
  auto model = LoadModel(args.String("model"), {.packed = !fp32});
  if (!model.ok()) {
    std::cerr << model.status().message() << "\n";
    return 1;
  }
  // A natural-text prompt of exactly n_prompt tokens.
  const std::string paragraph =
      "The history of computing is a story of abstractions built on abstractions. Engineers "
      "learned to hide the details of circuits behind instructions, instructions behind "
      "languages, and languages behind libraries, so that each generation could think about "
      "larger problems. ";
  std::vector<int32_t> prompt;
  while (static_cast<int64_t>(prompt.size()) < n_prompt) {
    auto ids = model->tokenizer->Encode(paragraph, false);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  prompt.resize(n_prompt);

  // Mode full and a fresh prompt each run (first token varied), so nothing is reused.
  Engine engine(model->weights.get(), model->tokenizer.get(),
                {.num_kv_blocks = (n_prompt + n_decode) / kDefaultKvBlockSize + 2,
                 .max_batch_tokens = static_cast<int>(std::max<int64_t>(n_prompt, 1))});
  std::vector<double> prefill_tps, decode_tps;
  std::fprintf(stderr, "threads %d, kernels %s, weights %s, activations %s, kv %s\n",
               CpuKernelThreads(), std::string(CpuIsaName(CpuKernelIsa())).c_str(),
               fp32 ? "fp32" : "packed", act_name.c_str(), kv_name.c_str());
  for (int64_t r = 0; r < repeats; ++r) {
    prompt[0] = static_cast<int32_t>(1000 + r);
    auto result =
        engine.Run({.question_token_ids = prompt,
                    .mode = CacheMode::kFull,
                    .sampling = {.max_tokens = static_cast<int>(n_decode), .ignore_eos = true}});
    if (!result.ok()) {
      std::cerr << result.status().message() << "\n";
      return 1;
    }
    if (result->usage.cached_tokens != 0) {
      std::cerr << "benchmark prompt was served from cache\n";
      return 1;
    }
    // TTFT here is the prefill (plus one sampling): prompt tokens per second of it.
    prefill_tps.push_back(n_prompt / (result->ttft_ms / 1000.0));
    decode_tps.push_back(result->decode_tokens_per_s);
  }
  const double prefill = Median(prefill_tps), decode = Median(decode_tps);
  std::printf("| engine | prompt tokens | prefill tokens/s | decode tokens | decode tokens/s |\n");
  std::printf("|---|---|---|---|---|\n");
  std::printf("| lazyattn cpu (%s, %s activations, %s KV) | %lld | %.1f | %lld | %.2f |\n",
              fp32 ? "fp32 weights" : "packed weights", act_name.c_str(), kv_name.c_str(),
              static_cast<long long>(n_prompt), prefill, static_cast<long long>(n_decode), decode);
  nlohmann::json out = {
      {"engine", "lazyattn-cpu"},
      {"prompt_tokens", n_prompt},
      {"decode_tokens", n_decode},
      {"repeats", repeats},
      {"threads", CpuKernelThreads()},
      {"weights", fp32 ? "fp32" : "packed"},
      {"activations", act_name},
      {"kv_cache", kv_name},
      {"kernels", std::string(CpuIsaName(CpuKernelIsa()))},
      {"min_prefill_tokens_per_s", *std::min_element(prefill_tps.begin(), prefill_tps.end())},
      {"max_decode_tokens_per_s", *std::max_element(decode_tps.begin(), decode_tps.end())},
      {"prefill_tokens_per_s", prefill},
      {"decode_tokens_per_s", decode}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Run(argc, argv); }
