// `lazyattn-logits`: the last position's logits of one prompt, for comparisons against other
// implementations (tests/gpu/hf_logits_check.py runs it beside HF transformers).
//
//   lazyattn-logits --model PATH --tokens 1,2,3 --out FILE [--backend cpu|cuda|auto]
//                   [--cpu-activations fp32|int8] [--cpu-kv-cache f32|f16]
//
// Runs the prompt as one chunk in mode `full` (no cache) straight through the backend's runner
// and writes vocab_size little-endian float32 values to FILE. Exit status: 0, 2 usage, 1 failure.
// The CPU backend runs with fp32 activations and an fp32 KV cache unless told otherwise, unlike
// the worker (int8 and f16: engine.cpu_activations, engine.cpu_kv_cache): this tool exists to
// compare against fp32 references, and fp32 activations are the CPU form whose results do not
// depend on the prompt's length (kernels/include/quant_linear.h).
#include <fstream>
#include <iostream>
#include <numeric>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/include/quant_linear.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/runner_factory.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {
namespace {

int Fail(const absl::Status& s, int code) {
  std::cerr << "lazyattn-logits: " << s.message() << "\n";
  return code;
}

int Main(int argc, char** argv) {
  CliArgs args;
  args.Declare("model", CliArgs::Kind::kValue, "a .gguf file or an HF model directory");
  args.Declare("tokens", CliArgs::Kind::kValue, "comma-separated prompt token ids");
  args.Declare("out", CliArgs::Kind::kValue, "file for the float32 logits");
  args.Declare("backend", CliArgs::Kind::kValue, "cpu, cuda or auto (default)");
  args.Declare("cpu-activations", CliArgs::Kind::kValue,
               "cpu backend product inputs: fp32 (default here) or int8 (the worker's default)");
  args.Declare("cpu-kv-cache", CliArgs::Kind::kValue,
               "cpu backend KV element type: f32 (default here) or f16 (the worker's default)");
  if (absl::Status s = args.Parse(argc, argv, 1); !s.ok()) return Fail(s, 2);
  if (!args.Has("model") || !args.Has("tokens") || !args.Has("out")) {
    std::cerr << "lazyattn-logits: --model, --tokens and --out are required\n" << args.Help();
    return 2;
  }
  std::vector<int32_t> tokens;
  for (absl::string_view piece : absl::StrSplit(args.String("tokens"), ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return Fail(absl::InvalidArgumentError("--tokens: not an integer list"), 2);
    }
    tokens.push_back(id);
  }
  auto backend = ParseBackend(args.String("backend", "auto"));
  if (!backend.ok()) return Fail(backend.status(), 2);
  CpuActivations activations = CpuActivations::kFp32;
  if (!ParseCpuActivations(args.String("cpu-activations", "fp32"), &activations)) {
    return Fail(absl::InvalidArgumentError("--cpu-activations must be fp32 or int8"), 2);
  }
  SetCpuActivations(activations);
  KvCacheDtype kv_cache = KvCacheDtype::kF32;
  if (!ParseKvCacheDtype(args.String("cpu-kv-cache", "f32"), &kv_cache)) {
    return Fail(absl::InvalidArgumentError("--cpu-kv-cache must be f32 or f16"), 2);
  }
  SetCpuKvCacheDtype(kv_cache);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t blocks = (n + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize;
  // No tokenizer: the prompt comes as ids, and HF directories made for the check carry none.
  auto model = LoadServedModel(
      args.String("model"),
      {.runner = {.backend = *backend,
                  .kv_budget_bytes = std::max<int64_t>(blocks, 1) * 4 * (int64_t{1} << 20)},
       .load_tokenizer = false});
  if (!model.ok()) return Fail(model.status(), 1);
  ModelRunner* runner = model->runner.get();
  // A token outside the model's vocabulary is the caller's to fix, as a bad flag is (exit 2).
  for (const int32_t id : tokens) {
    if (id < 0 || id >= runner->config().vocab_size) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--tokens: id ", id, " outside the ",
                                                          "vocabulary [0, ",
                                                          runner->config().vocab_size, ")")),
                  2);
    }
  }
  if (runner->num_kv_blocks() < blocks) {
    return Fail(absl::ResourceExhaustedError("KV pool too small for the prompt"), 1);
  }
  std::vector<int64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<KvBlockEntry> table;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t valid = std::min<int64_t>(kDefaultKvBlockSize, n - b * kDefaultKvBlockSize);
    table.push_back(PackKvBlockEntry(static_cast<uint32_t>(b), 0, static_cast<uint32_t>(valid)));
  }
  const ForwardChunk chunk{
      .tokens = tokens, .kv_slots = slots, .block_table = table, .return_logits = true};
  auto logits = runner->Forward(std::span(&chunk, 1));
  if (!logits.ok()) return Fail(logits.status(), 1);
  if (logits->logits.empty()) {
    return Fail(absl::InternalError("the runner returned no logits for the last token"), 1);
  }
  std::ofstream out(args.String("out"), std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits->logits.data()),
            static_cast<std::streamsize>(logits->logits.size() * sizeof(float)));
  if (!out) return Fail(absl::InternalError("cannot write " + args.String("out")), 1);
  std::cerr << "lazyattn-logits: backend " << runner->backend_name() << ", " << n << " tokens, "
            << logits->logits.size() << " logits\n";
  return 0;
}

}  // namespace
}  // namespace lazyattn

int main(int argc, char** argv) { return lazyattn::Main(argc, argv); }
