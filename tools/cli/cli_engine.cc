#include "tools/cli/cli_engine.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/include/quant_linear.h"
#include "kernels/include/sampling.h"
#include "services/worker/model/model_loader.h"

namespace lazyattn {

void DeclareSamplingFlags(CliArgs& args) {
  args.Declare("max-tokens", CliArgs::Kind::kValue, "tokens to generate at most (default 128)");
  args.Declare("temperature", CliArgs::Kind::kValue, "0 = greedy (default 0)");
  args.Declare("top-k", CliArgs::Kind::kValue, "keep the k most likely tokens (0 = off)");
  args.Declare("top-p", CliArgs::Kind::kValue, "nucleus sampling mass (1 = off)");
  args.Declare("seed", CliArgs::Kind::kValue,
               "random seed for sampling: the same seed repeats the tokens (default: a fresh one)");
  args.Declare("min-p", CliArgs::Kind::kValue, "keep tokens with p >= min_p * p(most likely) (0 = off)");
  args.Declare("repetition-penalty", CliArgs::Kind::kValue,
               "> 1 discourages the prompt's and output's tokens (1 = off)");
  args.Declare("presence-penalty", CliArgs::Kind::kValue,
               "[-2, 2], subtracted once from every generated token's logit (0 = off)");
  args.Declare("frequency-penalty", CliArgs::Kind::kValue,
               "[-2, 2], subtracted per occurrence in the output (0 = off)");
  args.Declare("logprobs", CliArgs::Kind::kSwitch,
               "report each generated token's log-probability (with --json)");
  args.Declare("top-logprobs", CliArgs::Kind::kValue,
               "with --logprobs: also each position's N most likely tokens, N in [0, 20] (--json)");
  args.Declare("stop", CliArgs::Kind::kRepeated, "stop before this string");
  args.Declare("ignore-eos", CliArgs::Kind::kSwitch, "keep generating past end-of-generation");
}

absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args) {
  SamplingParams p;
  ASSIGN_OR_RETURN(int64_t max_tokens, args.Int("max-tokens", 128));
  ASSIGN_OR_RETURN(double temperature, args.Double("temperature", 0.0));
  ASSIGN_OR_RETURN(int64_t top_k, args.Int("top-k", 0));
  ASSIGN_OR_RETURN(double top_p, args.Double("top-p", 1.0));
  ASSIGN_OR_RETURN(double min_p, args.Double("min-p", 0.0));
  ASSIGN_OR_RETURN(double repetition_penalty, args.Double("repetition-penalty", 1.0));
  ASSIGN_OR_RETURN(double presence_penalty, args.Double("presence-penalty", 0.0));
  ASSIGN_OR_RETURN(double frequency_penalty, args.Double("frequency-penalty", 0.0));
  ASSIGN_OR_RETURN(int64_t top_logprobs, args.Int("top-logprobs", 0));
  p.max_tokens = static_cast<int>(max_tokens);
  p.temperature = static_cast<float>(temperature);
  p.top_k = static_cast<int>(top_k);
  p.top_p = static_cast<float>(top_p);
  if (args.Has("seed")) {  // absent: unseeded, the engine draws a fresh seed
    ASSIGN_OR_RETURN(int64_t seed, args.Int("seed", 0));
    p.seed = static_cast<uint64_t>(seed);
  }
  p.min_p = static_cast<float>(min_p);
  p.repetition_penalty = static_cast<float>(repetition_penalty);
  p.presence_penalty = static_cast<float>(presence_penalty);
  p.frequency_penalty = static_cast<float>(frequency_penalty);
  p.logprobs = args.Has("logprobs");
  // Bounded here so the int narrowing below cannot wrap; the engine checks the rest.
  if (top_logprobs < 0 || top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top-logprobs ", top_logprobs, ": must be in [0, ", kMaxTopLogprobs, "]"));
  }
  p.top_logprobs = static_cast<int>(top_logprobs);
  p.stop = args.Strings("stop");
  p.ignore_eos = args.Has("ignore-eos");
  return p;
}

void DeclareBackendFlags(CliArgs& args) {
  args.Declare("backend", CliArgs::Kind::kValue,
               "cpu, cuda, or auto (the GPU when one is visible; default)");
  args.Declare("kv-budget", CliArgs::Kind::kValue, "KV cache bytes (default 512 MiB)");
  args.Declare("cpu-activations", CliArgs::Kind::kValue,
               "cpu backend decode inputs: int8 (default) or fp32 (engine.cpu_activations)");
  args.Declare("cpu-kv-cache", CliArgs::Kind::kValue,
               "cpu backend KV element type: f16 (default) or f32 (engine.cpu_kv_cache)");
}

absl::StatusOr<ServedModel> ServedModelFromArgs(const CliArgs& args, int* exit_code) {
  *exit_code = 2;
  ASSIGN_OR_RETURN(const Backend backend, ParseBackend(args.String("backend", "auto")));
  ASSIGN_OR_RETURN(const int64_t budget, args.Int("kv-budget", int64_t{512} << 20));
  if (budget < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError("--kv-budget must be at least 1 MiB");
  }
  CpuActivations activations = CpuActivations::kInt8;
  if (!ParseCpuActivations(args.String("cpu-activations", "int8"), &activations)) {
    return absl::InvalidArgumentError("--cpu-activations must be int8 or fp32");
  }
  SetCpuActivations(activations);
  KvCacheDtype kv_cache = KvCacheDtype::kF16;
  if (!ParseKvCacheDtype(args.String("cpu-kv-cache", "f16"), &kv_cache)) {
    return absl::InvalidArgumentError("--cpu-kv-cache must be f16 or f32");
  }
  SetCpuKvCacheDtype(kv_cache);
  ModelLoadStage stage = ModelLoadStage::kModel;
  absl::StatusOr<ServedModel> model = LoadServedModel(
      args.String("model"), {.runner = {.backend = backend, .kv_budget_bytes = budget}}, &stage);
  if (!model.ok()) {
    const bool usage = stage == ModelLoadStage::kBackend &&
                       model.status().code() == absl::StatusCode::kInvalidArgument;
    // A --model that names a missing, malformed or unsupported file is the caller's to fix, as a
    // bad flag is; running out of memory or a device failure is not.
    const bool bad_model = stage == ModelLoadStage::kModel && IsModelFileError(model.status());
    *exit_code = usage || bad_model ? 2 : 1;
    return model.status();
  }
  *exit_code = 0;
  std::cerr << "lazyattn: backend " << model->runner->backend_name() << ", "
            << model->runner->num_kv_blocks() << " KV blocks\n";
  return model;
}

std::unique_ptr<Engine> EngineFor(ServedModel& model) {
  // A GPU step is cheap per token only when it is large (chunked prefill of 8,192 tokens, as the
  // H200 benchmarks use); the CPU keeps the engine's default.
  EngineOptions options;
  if (model.runner->backend_name() == "cuda") options.max_batch_tokens = 8192;
  return std::make_unique<Engine>(std::move(model.runner), model.fingerprint, model.tokenizer.get(),
                                  options);
}

}  // namespace lazyattn
