// Pieces the `lazyattn` commands share: flags for sampling and the KV budget, building an engine,
// and turning (system, documents, question) into an EngineRequest with or without a chat template.
#ifndef LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_
#define LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/model_loader.h"
#include "tools/cli/cli_args.h"

namespace lazyattn {

// Declares --max-tokens --temperature --top-k --top-p --seed --stop --ignore-eos.
void DeclareSamplingFlags(CliArgs& args);
absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args);

// Blocks for a KV budget in bytes (fp32 K and V of every layer, 16-token blocks).
int64_t KvBlocksForBudget(const ModelConfig& config, int64_t budget_bytes);

// The request text around the documents. With a chat template: the system turn and the start of
// the user turn go before the documents, the question and the assistant header after them, so the
// documents sit inside the user message. Without: `system` before, `question` after, verbatim.
struct PromptParts {
  std::string system_prefix;
  std::string question;
};
absl::StatusOr<PromptParts> BuildPrompt(const Tokenizer& tokenizer, bool chat,
                                        const std::string& system, const std::string& question);

absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_CLI_ENGINE_H_
