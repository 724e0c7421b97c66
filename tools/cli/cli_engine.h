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
#include "services/worker/model/model_loader.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {

// Declares --max-tokens --temperature --top-k --top-p --seed --stop --ignore-eos.
void DeclareSamplingFlags(CliArgs& args);
absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args);

// Declares --backend (cpu | cuda | auto, default auto) and --kv-budget BYTES (default 512 MiB).
void DeclareBackendFlags(CliArgs& args);
// An engine over the loaded model on the backend the flags pick. The model must outlive it.
absl::StatusOr<std::unique_ptr<Engine>> EngineFromArgs(const CliArgs& args,
                                                        const LoadedModel& model);

// KvBlocksForBudget (kv_cache_cpu.h) and BuildPrompt (chat_prompt.h) live with the engine: the
// worker service shares them.

absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_
