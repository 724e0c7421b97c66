#include "services/worker/engine/chat_prompt.h"

#include <vector>

#include "common/status_macros.h"
#include "services/worker/model/tokenizer/chat_template.h"

namespace lazyattn {

absl::StatusOr<PromptParts> BuildPrompt(const Tokenizer& tokenizer, bool chat,
                                        const std::string& system, const std::string& question,
                                        bool has_documents) {
  if (!chat) return PromptParts{system, question};
  ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tokenizer.chat_template()));
  return CutChatPrompt(tmpl, system, question, has_documents);
}

absl::StatusOr<PromptParts> CutChatPrompt(const ChatTemplate& tmpl, const std::string& system,
                                          const std::string& question, bool has_documents) {
  // Render with a marker in front of the question as the user message and cut there: documents go
  // in front of the question inside the user turn. The question goes through the template (so
  // Llama-3's |trim takes its trailing whitespace, as it would of the whole user message).
  const std::string marker = "\x01lazyattn-user-content\x01";
  auto render = [&](const std::string& user) {
    std::vector<ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.push_back({"user", user});
    return tmpl.Apply(messages, /*add_generation_prompt=*/true);
  };
  ASSIGN_OR_RETURN(const std::string rendered, render(marker + question));
  const size_t at = rendered.find(marker);
  if (at == std::string::npos) {
    return absl::InternalError("chat template dropped the user message");
  }
  PromptParts parts{rendered.substr(0, at), rendered.substr(at + marker.size())};
  if (has_documents) return parts;
  // The question alone is the user message: render it so, and keep the cut before it (the
  // template changes only the message, so the text before the marker is its prefix).
  ASSIGN_OR_RETURN(const std::string alone, render(question));
  if (alone.compare(0, parts.system_prefix.size(), parts.system_prefix) != 0) {
    return absl::InternalError("chat template renders the text before the user message differently");
  }
  parts.question = alone.substr(parts.system_prefix.size());
  return parts;
}

}  // namespace lazyattn
