#include "services/worker/engine/request_prep.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lazyattn {
namespace {

std::string DocName(size_t i, const EngineDocument& d) {
  return d.id.empty() ? absl::StrCat("documents[", i, "]")
                      : absl::StrCat("documents[", i, "] (id \"", d.id, "\")");
}

}  // namespace

absl::StatusOr<PreparedRequest> PrepareRequest(const EngineRequest& req, const Tokenizer& tok,
                                               const ModelConfig& config,
                                               const ModelIdentity& identity,
                                               const RequestLimits& limits,
                                               const PrepMemory& memory) {
  RETURN_IF_ERROR(ValidateSamplingParams(req.sampling, config.vocab_size));
  if (static_cast<int>(req.documents.size()) > limits.max_documents) {
    return absl::InvalidArgumentError(absl::StrCat("documents: ", req.documents.size(),
                                                   " documents exceed the limit of ",
                                                   limits.max_documents));
  }
  PreparedRequest p;
  p.mode = req.mode;
  p.sampling = req.sampling;
  p.deadline = req.deadline;
  // The prompt starts with the system prefix, so BOS (for models that want it) goes there, even
  // when the prefix text is empty.
  p.system_prefix = tok.EncodeWithSpecials(req.system_prefix, /*parse_special=*/true);
  for (size_t i = 0; i < req.documents.size(); ++i) {
    const EngineDocument& d = req.documents[i];
    PreparedRequest::Document doc;
    doc.id = d.id;
    if (d.token_ids) {
      doc.tokens = *d.token_ids;
      for (size_t j = 0; j < doc.tokens.size(); ++j) {
        if (doc.tokens[j] < 0 || doc.tokens[j] >= config.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat(
              DocName(i, d), ".token_ids[", j, "] = ", doc.tokens[j],
              " is outside the vocabulary [0, ", config.vocab_size, ")"));
        }
      }
      const auto sha256 = [&] {
        return DocumentKeyFromTokens(identity.model_fingerprint, identity.tokenizer_fingerprint,
                                     doc.tokens);
      };
      doc.key = memory.keys != nullptr ? memory.keys->KeyOf(doc.tokens, sha256) : sha256();
    } else {
      doc.key = DocumentKeyFromText(identity.model_fingerprint, identity.tokenizer_fingerprint,
                                    d.text);
      DocumentTokenCache* const cache = memory.token_ids;
      if (auto cached = cache != nullptr ? cache->Find(doc.key) : std::nullopt) {
        doc.tokens = std::move(*cached);  // the key names this tokenizer and this exact text
      } else {
        // Documents are data: special-token text inside them stays literal.
        doc.tokens = tok.Encode(d.text, /*parse_special=*/false);
        if (cache != nullptr && !doc.tokens.empty()) cache->Insert(doc.key, doc.tokens);
      }
    }
    if (doc.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(DocName(i, d), ": empty document"));
    }
    if (static_cast<int64_t>(doc.tokens.size()) >= config.max_positions) {
      return absl::InvalidArgumentError(absl::StrCat(DocName(i, d), ": ", doc.tokens.size(),
                                                     " tokens exceed the model's context of ",
                                                     config.max_positions));
    }
    p.documents.push_back(std::move(doc));
  }
  if (req.question_token_ids) {
    p.question = *req.question_token_ids;
    for (size_t j = 0; j < p.question.size(); ++j) {
      if (p.question[j] < 0 || p.question[j] >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("question_token_ids[", j, "] = ",
                                                       p.question[j], " is outside the vocabulary"));
      }
    }
  } else {
    p.question = tok.Encode(req.question, /*parse_special=*/true);
  }
  if (p.question.empty()) {
    return absl::InvalidArgumentError("question: must not be empty (generation starts after it)");
  }
  if (p.prompt_tokens() >= config.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", p.prompt_tokens(),
                                                   " tokens leave no room in the model's context of ",
                                                   config.max_positions));
  }
  return p;
}

}  // namespace lazyattn
