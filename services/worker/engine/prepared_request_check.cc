// PreparedRequest's size and the core's own check of a prepared request (engine_core.h):
// what the model cannot compute is refused before it is queued.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/worker/engine/engine_core.h"

namespace lazyattn {

int64_t PreparedRequest::prompt_tokens() const {
  int64_t n = static_cast<int64_t>(system_prefix.size() + question.size());
  for (const auto& d : documents) n += static_cast<int64_t>(d.tokens.size());
  return n;
}

namespace {

// The first token of `tokens` outside [0, vocab), as "NAME[i] = id ..."; empty when none is.
std::string FirstTokenOutside(const std::vector<int32_t>& tokens, int64_t vocab,
                              absl::string_view name) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::StrCat(name, "[", i, "] = ", tokens[i], " is outside the vocabulary of ", vocab);
    }
  }
  return "";
}

}  // namespace

absl::Status CheckPreparedRequest(const PreparedRequest& r, const ModelConfig& config) {
  // What the model cannot compute: an embedding row that does not exist, a rotation past the
  // rope tables, a document segment of no tokens (a zero-length job is never done), nothing to
  // generate after. O(prompt tokens), small beside the prefill they precede.
  std::string bad = FirstTokenOutside(r.system_prefix, config.vocab_size, "system_prefix");
  for (size_t i = 0; bad.empty() && i < r.documents.size(); ++i) {
    // Modes full and prefix read the prompt as one text, where a short document's bytes may all
    // belong to the next one's first token: empty there, and harmless (admission joins them).
    if (r.documents[i].tokens.empty() && EncodesDocumentsAlone(r.mode)) {
      return absl::InvalidArgumentError(absl::StrCat("documents[", i, "]: no tokens"));
    }
    bad = FirstTokenOutside(r.documents[i].tokens, config.vocab_size,
                            absl::StrCat("documents[", i, "].tokens"));
  }
  if (bad.empty()) bad = FirstTokenOutside(r.question, config.vocab_size, "question");
  if (!bad.empty()) return absl::InvalidArgumentError(bad);
  if (r.question.empty()) return absl::InvalidArgumentError("question: no tokens");
  if (r.prompt_tokens() >= config.max_positions) {
    return absl::InvalidArgumentError(PromptTooLongMessage(r, config));
  }
  return absl::OkStatus();
}

std::string PromptTooLongMessage(const PreparedRequest& r, const ModelConfig& config) {
  if (r.prefetch) {
    return absl::StrCat("documents: ", r.prompt_tokens(),
                        " tokens together leave no room in the model's context of ",
                        config.max_positions,
                        " (one Prefetch caches its documents as one prompt; send them in "
                        "separate calls)");
  }
  return absl::StrCat("prompt: ", r.prompt_tokens(),
                      " tokens leave no room in the model's context of ", config.max_positions);
}

}  // namespace lazyattn
