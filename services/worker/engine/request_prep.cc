#include "services/worker/engine/request_prep.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lazyattn {
namespace {

// A document's field as the APIs name it (documents[i].text or documents[i].tokens), first in a
// message so that the HTTP API's `param` names it.
std::string DocField(size_t i, const EngineDocument& d) {
  return absl::StrCat("documents[", i, "]", d.token_ids ? ".tokens" : ".text");
}

// Which document the client called it, to end a message with.
std::string DocIdNote(const EngineDocument& d) {
  return d.id.empty() ? "" : absl::StrCat(" (document \"", d.id, "\")");
}

// Modes full and prefix: re-tokenizes the prompt as the one text the model reads, so that a word
// spanning a boundary (the template's "user\n" followed by a question starting with "\n  ", a
// document ending in a space followed by one starting with a letter) is one token, as HF and
// llama.cpp tokenize the rendered prompt. The text between two boundaries that cannot be
// re-tokenized -- token-id documents or question, and the EOS a model with add_eos gets after the
// system prefix -- is tokenized as a whole; each token goes to the part that holds its last byte.
// Special-token text stays literal inside documents (EncodeParts).
void TokenizeAsWhole(const EngineRequest& req, const Tokenizer& tok, PreparedRequest* p) {
  const size_t n_docs = req.documents.size();
  // Parts in prompt order: 0 the system prefix, 1..n_docs the documents, n_docs + 1 the question.
  const size_t n_parts = n_docs + 2;
  const auto is_text = [&](size_t k) {
    if (k == 0) return true;
    if (k <= n_docs) return !req.documents[k - 1].token_ids.has_value();
    return !req.question_token_ids.has_value();
  };
  const auto part_tokens = [&](size_t k) -> std::vector<int32_t>& {
    if (k == 0) return p->system_prefix;
    if (k <= n_docs) return p->documents[k - 1].tokens;
    return p->question;
  };
  size_t k = 0;
  while (k < n_parts) {
    if (!is_text(k)) {
      ++k;  // token ids stay as given
      continue;
    }
    std::vector<Tokenizer::TextPart> run;
    std::vector<size_t> run_parts;
    for (; k < n_parts && is_text(k); ++k) {
      if (k == 0) {
        run.push_back({req.system_prefix, true});
      } else if (k <= n_docs) {
        run.push_back({req.documents[k - 1].text, false});
      } else {
        run.push_back({req.question, true});
      }
      run_parts.push_back(k);
      if (k == 0 && tok.add_eos()) {
        ++k;
        break;  // the EOS after the system prefix ends the run
      }
    }
    std::vector<size_t> owner;
    const std::vector<int32_t> ids = tok.EncodeParts(run, &owner);
    for (size_t part : run_parts) part_tokens(part).clear();
    for (size_t i = 0; i < ids.size(); ++i) part_tokens(run_parts[owner[i]]).push_back(ids[i]);
    if (run_parts.front() == 0) {
      // What EncodeWithSpecials does to the system prefix alone, on the whole text.
      if (tok.add_bos() && (ids.empty() || ids.front() != tok.bos_id())) {
        p->system_prefix.insert(p->system_prefix.begin(), tok.bos_id());
      }
      if (tok.add_eos()) p->system_prefix.push_back(tok.eos_id());
    }
  }
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
  // A prompt whose text alone is far past the context is refused before it is tokenized:
  // encoding a 16 MB conversation took a submitting thread 1.3 s, only to refuse it after (the
  // router does not tokenize, so any client can send one). Tokenizer::MinTokensFor is a lower
  // bound, so nothing that fits is refused here; token ids are checked exactly below, cheaply.
  int64_t at_least = tok.MinTokensFor(req.system_prefix);
  int64_t text_bytes = static_cast<int64_t>(req.system_prefix.size());
  for (size_t i = 0; i < req.documents.size(); ++i) {
    const EngineDocument& d = req.documents[i];
    if (d.token_ids) continue;
    const int64_t doc_at_least = tok.MinTokensFor(d.text);
    if (doc_at_least >= config.max_positions) {  // one document alone: name it
      return absl::InvalidArgumentError(
          absl::StrCat(DocField(i, d), ": at least ", doc_at_least, " tokens (", d.text.size(),
                       " bytes, not tokenized) exceed the model's context of ",
                       config.max_positions, DocIdNote(d)));
    }
    at_least += doc_at_least;
    text_bytes += static_cast<int64_t>(d.text.size());
  }
  if (!req.question_token_ids) {
    at_least += tok.MinTokensFor(req.question);
    text_bytes += static_cast<int64_t>(req.question.size());
  }
  if (at_least >= config.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt: its text alone (", text_bytes, " bytes, not tokenized) makes at least ", at_least,
        " tokens and leaves no room in the model's context of ", config.max_positions));
  }
  PreparedRequest p;
  p.mode = req.mode;
  p.sampling = req.sampling;
  p.prefetch = req.prefetch;
  p.deadline = req.deadline;
  p.prefix_scope = PrefixScopeWords(req.cache_scope);
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
              DocField(i, d), ".ids[", j, "]: ", doc.tokens[j], " is outside the vocabulary [0, ",
              config.vocab_size, ")", DocIdNote(d)));
        }
      }
      // Refused before the key memo sees it: a document past the context would only evict
      // memos of documents that can be served.
      if (static_cast<int64_t>(doc.tokens.size()) >= config.max_positions) {
        return absl::InvalidArgumentError(absl::StrCat(DocField(i, d), ": ", doc.tokens.size(),
                                                       " tokens exceed the model's context of ",
                                                       config.max_positions, DocIdNote(d)));
      }
      const auto sha256 = [&] {
        return DocumentKeyFromTokens(identity.model_fingerprint, identity.tokenizer_fingerprint,
                                     doc.tokens);
      };
      doc.key = ScopedDocumentKey(memory.keys != nullptr
                                      ? memory.keys->KeyOf(doc.tokens, sha256, p.prefix_scope)
                                      : sha256(),
                                  req.cache_scope);
    } else {
      // Scoped before the token cache sees it: how long tokenizing takes must not tell one scope
      // which texts another sent.
      doc.key = ScopedDocumentKey(
          DocumentKeyFromText(identity.model_fingerprint, identity.tokenizer_fingerprint, d.text),
          req.cache_scope);
      DocumentTokenCache* const cache = memory.token_ids;
      if (auto cached = cache != nullptr ? cache->Find(doc.key) : std::nullopt) {
        doc.tokens = std::move(*cached);  // the key names this tokenizer and this exact text
      } else {
        // Documents are data: special-token text inside them stays literal.
        doc.tokens = tok.Encode(d.text, /*parse_special=*/false);
        // Only a document that can be served: one past the context is refused below, and kept
        // here it would evict the tokens of documents that can.
        if (cache != nullptr && !doc.tokens.empty() &&
            static_cast<int64_t>(doc.tokens.size()) < config.max_positions) {
          cache->Insert(doc.key, doc.tokens);
        }
      }
    }
    if (doc.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(DocField(i, d), ": empty document", DocIdNote(d)));
    }
    if (static_cast<int64_t>(doc.tokens.size()) >= config.max_positions) {
      return absl::InvalidArgumentError(absl::StrCat(DocField(i, d), ": ", doc.tokens.size(),
                                                     " tokens exceed the model's context of ",
                                                     config.max_positions, DocIdNote(d)));
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
  // The checks above hold for each part alone, in every mode; now the tokens the model reads.
  if (!EncodesDocumentsAlone(req.mode)) TokenizeAsWhole(req, tok, &p);
  if (p.prompt_tokens() >= config.max_positions) {
    return absl::InvalidArgumentError(PromptTooLongMessage(p, config));
  }
  return p;
}

}  // namespace lazyattn
