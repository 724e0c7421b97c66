#include "services/worker/engine/chat_prompt.h"

#include <vector>

#include "common/status_macros.h"
#include "services/worker/model/tokenizer/chat_template.h"

namespace lazyattn {

absl::StatusOr<PromptParts> BuildPrompt(const Tokenizer& tokenizer, bool chat,
                                        const std::string& system, const std::string& question) {
  if (!chat) return PromptParts{system, question};
  ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tokenizer.chat_template()));
  // Render with a marker in front of the question as the user message and cut there: documents go
  // in front of the question inside the user turn. The question goes through the template (so
  // Llama-3's |trim takes its trailing whitespace, as it would of the whole user message).
  const std::string marker = "\x01lazyattn-user-content\x01";
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", marker + question});
  ASSIGN_OR_RETURN(std::string rendered, tmpl.Apply(messages, /*add_generation_prompt=*/true));
  const size_t at = rendered.find(marker);
  if (at == std::string::npos) {
    return absl::InternalError("chat template dropped the user message");
  }
  return PromptParts{rendered.substr(0, at), rendered.substr(at + marker.size())};
}

}  // namespace lazyattn
