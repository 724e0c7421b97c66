// The prompt text around a RAG request's documents, with or without the model's chat template.
// Shared by the CLI and the worker service so both build the same prompt for the same request.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_CHAT_PROMPT_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_CHAT_PROMPT_H_

#include <string>

#include "absl/status/statusor.h"
#include "services/worker/model/tokenizer/tokenizer.h"

namespace lazyattn {

// With a chat template: the system turn and the start of the user turn go before the documents,
// the question and the assistant header after them, so the documents sit inside the user message
// (system_prefix + documents + question is the template rendered with the documents and the
// question as the user's content). Without: `system` before, `question` after, verbatim.
// The cut only says where documents go: in modes full and prefix the parts are tokenized as one
// text again (request_prep.h), so a question starting with whitespace tokenizes as in the whole.
// Limit: Llama-3 templates trim the user content; the question's trailing whitespace is trimmed,
// its leading whitespace is kept (it follows the documents, so it is not at the content's start).
struct PromptParts {
  std::string system_prefix;
  std::string question;
};

// Errors: the tokenizer's chat template is missing or not one of the supported families.
absl::StatusOr<PromptParts> BuildPrompt(const Tokenizer& tokenizer, bool chat,
                                        const std::string& system, const std::string& question);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_CHAT_PROMPT_H_
