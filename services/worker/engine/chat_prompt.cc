#include "services/worker/engine/chat_prompt.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", question});
  return CutChatMessages(tmpl, std::move(messages), has_documents);
}

absl::StatusOr<PromptParts> BuildChatPrompt(const Tokenizer& tokenizer,
                                            std::vector<ChatMessage> messages, bool has_documents) {
  ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::FromJinja(tokenizer.chat_template()));
  return CutChatMessages(tmpl, std::move(messages), has_documents);
}

absl::StatusOr<PromptParts> CutChatMessages(const ChatTemplate& tmpl,
                                            std::vector<ChatMessage> messages, bool has_documents) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: empty conversation");
  if (messages.back().role != "user") {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", messages.size() - 1, "].role: the last message must be a user "
                     "turn (generation answers it), got \"", messages.back().role, "\""));
  }
  // Render with a marker in front of the last user content and cut there: documents go in front
  // of it inside the user turn. The content goes through the template (so Llama-3's |trim takes
  // its trailing whitespace, as it would of the whole user message).
  const std::string marker = "\x01lazyattn-user-content\x01";
  const std::string content = messages.back().content;
  messages.back().content = marker + content;
  ASSIGN_OR_RETURN(const std::string rendered, tmpl.Apply(messages, /*add_generation_prompt=*/true));
  const size_t at = rendered.find(marker);
  if (at == std::string::npos) {
    return absl::InternalError("chat template dropped the user message");
  }
  PromptParts parts{rendered.substr(0, at), rendered.substr(at + marker.size())};
  if (has_documents) return parts;
  // The content alone is the user message: render it so, and keep the cut before it (the
  // template changes only the message, so the text before the marker is its prefix).
  messages.back().content = content;
  ASSIGN_OR_RETURN(const std::string alone, tmpl.Apply(messages, /*add_generation_prompt=*/true));
  if (alone.compare(0, parts.system_prefix.size(), parts.system_prefix) != 0) {
    return absl::InternalError("chat template renders the text before the user message differently");
  }
  parts.question = alone.substr(parts.system_prefix.size());
  return parts;
}

}  // namespace lazyattn
