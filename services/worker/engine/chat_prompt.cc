#include "services/worker/engine/chat_prompt.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/model/tokenizer/chat_template.h"

namespace lazyattn {
namespace {

constexpr int kMarkerAttempts = 4;

// "\x01lazyattn-user-content\x01", or one with numbers when a message holds that text. The
// search ends: each marker a message holds takes 20-odd of its bytes. `salt` starts a retry
// among other markers.
std::string UnusedMarker(const std::vector<ChatMessage>& messages, int salt) {
  for (size_t n = 0;; ++n) {
    const std::string marker =
        n == 0 && salt == 0 ? std::string("\x01lazyattn-user-content\x01")
                            : absl::StrCat("\x01lazyattn-user-content-", salt, "-", n, "\x01");
    bool used = false;
    for (const ChatMessage& m : messages)
      used = used || m.content.find(marker) != std::string::npos;
    if (!used) return marker;
  }
}

}  // namespace

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
  // its trailing whitespace, as it would of the whole user message). The marker is one no message
  // holds and the rendering holds once: a client's text that contains the usual marker (a system
  // message, an earlier turn) must not move the cut.
  const std::string content = messages.back().content;
  std::string marker;
  std::string rendered;
  size_t at = std::string::npos;
  for (int attempt = 0; attempt < kMarkerAttempts && at == std::string::npos; ++attempt) {
    marker = UnusedMarker(messages, attempt);
    messages.back().content = marker + content;
    ASSIGN_OR_RETURN(rendered, tmpl.Apply(messages, /*add_generation_prompt=*/true));
    at = rendered.find(marker);
    if (at == std::string::npos) {
      return absl::InternalError("chat template dropped the user message");
    }
    if (rendered.find(marker, at + 1) != std::string::npos)
      at = std::string::npos;  // template text
  }
  if (at == std::string::npos) {
    return absl::InternalError("chat template renders every marker of the user message twice");
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
