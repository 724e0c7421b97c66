#include "services/worker/engine/chat_prompt.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/worker/model/tokenizer/chat_template.h"

namespace lazyattn {
namespace {

constexpr int kMarkerAttempts = 4;

// Every marker starts with the stem and ends with \x01: "\x01lazyattn-user-content\x01", or
// "\x01lazyattn-user-content-<salt>-<n>\x01" when a message holds that.
constexpr char kMarkerStem[] = "\x01lazyattn-user-content";
constexpr size_t kMarkerStemBytes = sizeof(kMarkerStem) - 1;
// The longest tail a marker has ("-<salt>-<n>" in decimal); longer text is no marker.
constexpr size_t kMaxMarkerTail = 48;

// The tails of the markers the messages hold ("" for the plain one), found in one pass over
// their bytes: a search per candidate marker would cost the conversation's size per candidate,
// and a conversation made of numbered markers would make that quadratic (megabytes: minutes).
absl::flat_hash_set<std::string> MarkerTailsHeld(const std::vector<ChatMessage>& messages) {
  absl::flat_hash_set<std::string> held;
  for (const ChatMessage& m : messages) {
    const std::string& text = m.content;
    for (size_t at = text.find(kMarkerStem); at != std::string::npos;
         at = text.find(kMarkerStem, at + 1)) {
      // Up to the next \x01, which starts the next stem if nothing closes this one before it:
      // the scans do not overlap.
      const size_t tail = at + kMarkerStemBytes;
      const size_t close = text.find('\x01', tail);
      if (close == std::string::npos) break;
      if (close - tail <= kMaxMarkerTail) held.insert(text.substr(tail, close - tail));
    }
  }
  return held;
}

// A marker none of the messages holds; `salt` starts a retry among other markers. Ends after at
// most held.size() + 1 candidates.
std::string UnusedMarker(const absl::flat_hash_set<std::string>& held, int salt) {
  if (salt == 0 && !held.contains("")) return absl::StrCat(kMarkerStem, "\x01");
  for (size_t n = 0;; ++n) {
    std::string tail = absl::StrCat("-", salt, "-", n);
    if (!held.contains(tail)) return absl::StrCat(kMarkerStem, tail, "\x01");
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
  const absl::flat_hash_set<std::string> held = MarkerTailsHeld(messages);
  for (int attempt = 0; attempt < kMarkerAttempts && at == std::string::npos; ++attempt) {
    marker = UnusedMarker(held, attempt);
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
