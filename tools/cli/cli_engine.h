// Pieces the `lazyattn` commands share: flags for sampling and the KV budget, building an engine,
// and turning (system, documents, question) into an EngineRequest with or without a chat template.
#ifndef LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_
#define LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/engine/chat_prompt.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/kv_cache_cpu.h"
#include "services/worker/engine/runner_factory.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {

// Declares --max-tokens --temperature --top-k --top-p --seed --stop --ignore-eos.
void DeclareSamplingFlags(CliArgs& args);
absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args);

// Declares --backend (cpu | cuda | auto, default auto), --kv-budget BYTES (default 512 MiB) and
// --cpu-activations (int8 | fp32, default int8: applied process-wide by ServedModelFromArgs).
void DeclareBackendFlags(CliArgs& args);
// The model of --model on the backend --backend and --kv-budget pick (LoadServedModel: a GGUF
// file on cuda is dequantized on the GPU without an fp32 host copy). On failure `exit_code` is
// set to the command's exit status: 2 for a usage error (a bad flag, or a backend the flags
// cannot have) or a --model whose files are missing, malformed or unsupported (IsModelFileError),
// 1 otherwise (out of memory, no GPU).
absl::StatusOr<ServedModel> ServedModelFromArgs(const CliArgs& args, int* exit_code);
// An engine over the model's runner (moved out of `model`), its fingerprint and its tokenizer.
// `model` must outlive the engine (the CPU runner borrows its host weights).
std::unique_ptr<Engine> EngineFor(ServedModel& model);

// KvBlocksForBudget (kv_cache_cpu.h) and BuildPrompt (chat_prompt.h) live with the engine: the
// worker service shares them.

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_
