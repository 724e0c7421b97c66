// The prompt text around a RAG request's documents, with or without the model's chat template.
// Shared by the CLI and the worker service so both build the same prompt for the same request.
#ifndef LAZYATTN_SERVICES_WORKER_ENGINE_CHAT_PROMPT_H_
#define LAZYATTN_SERVICES_WORKER_ENGINE_CHAT_PROMPT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/tokenizer/chat_template.h"
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

// `has_documents`: whether documents will stand between the two parts. Without documents the
// question is the whole user message, and the template treats it so (Llama-3's |trim takes its
// leading whitespace too, as HF's apply_chat_template does); with documents only its trailing
// whitespace ends the message.
// Errors: the tokenizer's chat template is missing or not one of the supported families.
absl::StatusOr<PromptParts> BuildPrompt(const Tokenizer& tokenizer, bool chat,
                                        const std::string& system, const std::string& question,
                                        bool has_documents = true);
// The same cut for a given template (BuildPrompt with chat).
absl::StatusOr<PromptParts> CutChatPrompt(const ChatTemplate& tmpl, const std::string& system,
                                          const std::string& question, bool has_documents);

// Multi-turn: the whole conversation rendered by the template, cut at the start of the LAST
// message's content, which must be a user turn (generation answers it). system_prefix holds every
// earlier turn and the last turn's header, so a conversation's history is the shared prefix and
// the documents sit at the start of the last user message; question is that message's content,
// its end and the generation prompt. `has_documents` as above, for the last message.
// Errors: InvalidArgument naming `messages` for an empty list or a last message that is not a
// user turn; the template's own errors otherwise.
absl::StatusOr<PromptParts> CutChatMessages(const ChatTemplate& tmpl,
                                            std::vector<ChatMessage> messages, bool has_documents);
// CutChatMessages with the tokenizer's template.
absl::StatusOr<PromptParts> BuildChatPrompt(const Tokenizer& tokenizer,
                                            std::vector<ChatMessage> messages, bool has_documents);

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_ENGINE_CHAT_PROMPT_H_
