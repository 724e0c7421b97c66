// The subcommands of `lazyattn` and what they share for output.
#ifndef LAZYATTN_TOOLS_CLI_COMMANDS_H_
#define LAZYATTN_TOOLS_CLI_COMMANDS_H_

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "services/worker/cache/cache_mode.h"
#include "services/worker/engine/request.h"

namespace lazyattn {

// Each returns the process exit status: 0 success, 1 failure, 2 usage error.
int GenerateCommand(int argc, char** argv);
int ReplayCommand(int argc, char** argv);
int ClientCommand(int argc, char** argv);
int TraceCommand(int argc, char** argv);
int HealthCommand(int argc, char** argv);
int PrefetchCommand(int argc, char** argv);

// Invalid input (exit status 2) rather than a failure of the engine.
inline bool IsUsageError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument;
}

// Prints "lazyattn: <message>" to stderr and returns `code`.
int CliFail(const absl::Status& status, int code = 1);

// token_ids, text, prompt_tokens, completion_tokens, cached_tokens, documents, documents_hit,
// finish_reason, ttft_ms, decode_tokens_per_s, mode, model.
nlohmann::json ResultJson(const RequestResult& result, const std::string& model, CacheMode mode);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_COMMANDS_H_
