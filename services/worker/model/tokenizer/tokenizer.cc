// Encoding (special-token partition, pre-tokenization, byte-level BPE merges) and decoding of
// a Tokenizer built by tokenizer_vocab.cc, and the streaming decoder.
#include "services/worker/model/tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/worker/model/tokenizer/tokenizer_internal.h"
#include "services/worker/model/tokenizer/unicode.h"

namespace lazyattn {

using tokenizer_internal::PairKey;
using tokenizer_internal::Sv;

// Scratch buffers for one Encode call, reused across words.
struct Tokenizer::Workspace {
  struct Node {
    int32_t id;  // symbol id; -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
    size_t end;  // end offset of the node's bytes in the text (tracked only when asked for)
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  // Max-heap order: lowest rank first, then leftmost (llama.cpp's llm_bigram_bpe::comparator).
  struct Lower {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  std::vector<uint32_t> cps;
  std::vector<size_t> cp_begin;  // byte offset of each code point in the text, plus the text's end
  std::vector<CodepointSpan> spans;
  std::vector<int32_t> symbols;
  std::vector<size_t> symbol_ends;  // per symbol: end offset of its byte (when tracking)
  std::vector<Node> nodes;
  std::vector<Candidate> heap;
  std::string word;
};

void Tokenizer::EmitSymbol(int32_t symbol, size_t end, std::vector<int32_t>* out,
                           std::vector<size_t>* ends) const {
  const size_t before = out->size();
  if (symbol < vocab_size()) {
    out->push_back(symbol);
  } else {
    const std::vector<int32_t>& ids = virtual_fallback_[symbol - vocab_size()];
    out->insert(out->end(), ids.begin(), ids.end());
  }
  if (ends != nullptr) ends->resize(ends->size() + (out->size() - before), end);
}

void Tokenizer::EncodeWord(Workspace* ws, std::vector<int32_t>* out,
                           std::vector<size_t>* ends) const {
  const std::vector<int32_t>& symbols = ws->symbols;
  const int32_t count = static_cast<int32_t>(symbols.size());
  const auto end_of = [&](int32_t i) { return ends != nullptr ? ws->symbol_ends[i] : 0; };
  if (count == 1) {
    EmitSymbol(symbols[0], end_of(0), out, ends);
    return;
  }
  auto& nodes = ws->nodes;
  auto& heap = ws->heap;
  nodes.resize(count);
  for (int32_t i = 0; i < count; ++i) {
    nodes[i] = {symbols[i], i - 1, i + 1 < count ? i + 1 : -1, end_of(i)};
  }
  heap.clear();
  const Workspace::Lower lower;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t lid = nodes[left].id;
    const int32_t rid = nodes[right].id;
    auto it = merges_.find(PairKey(lid, rid));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, right, lid, rid, it->second.result});
    std::push_heap(heap.begin(), heap.end(), lower);
  };
  for (int32_t i = 0; i + 1 < count; ++i) try_add(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower);
    const Workspace::Candidate c = heap.back();
    heap.pop_back();
    Workspace::Node& left = nodes[c.left];
    Workspace::Node& right = nodes[c.right];
    // Stale: one side was merged away or grew since the candidate was queued.
    if (left.id != c.left_id || right.id != c.right_id || left.next != c.right) continue;
    left.id = c.result;
    left.end = right.end;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) nodes[right.next].prev = c.left;
    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) EmitSymbol(nodes[i].id, nodes[i].end, out, ends);
}

void Tokenizer::EncodeRaw(std::string_view text, size_t base, Workspace* ws,
                          std::vector<int32_t>* out, std::vector<size_t>* ends) const {
  ws->cps.clear();
  ws->cp_begin.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    ws->cp_begin.push_back(pos);
    ws->cps.push_back(DecodeUtf8Lenient(text, &pos));
  }
  ws->cp_begin.push_back(text.size());
  ws->spans.clear();
  SplitWords(pre_, ws->cps, &ws->spans);
  std::string utf8;
  for (const CodepointSpan& span : ws->spans) {
    ws->symbols.clear();
    ws->symbol_ends.clear();
    utf8.clear();
    for (size_t i = span.begin; i < span.end; ++i) {
      const size_t before = utf8.size();
      AppendUtf8(ws->cps[i], &utf8);
      if (ends == nullptr) continue;
      // A well-formed character's bytes are the text's own; the U+FFFD standing for an invalid
      // byte ends where that byte does.
      const size_t begin = ws->cp_begin[i];
      const size_t end = ws->cp_begin[i + 1];
      const bool same = utf8.size() - before == end - begin;
      for (size_t k = 0; k < utf8.size() - before; ++k) {
        ws->symbol_ends.push_back(base + (same ? begin + k + 1 : end));
      }
    }
    for (unsigned char b : utf8) ws->symbols.push_back(byte_symbol_[b]);
    if (ignore_merges_) {
      ws->word.clear();
      for (unsigned char b : utf8) ws->word += byte_chars_[b];
      auto it = token_to_id_.find(ws->word);
      if (it != token_to_id_.end()) {
        out->push_back(it->second);
        if (ends != nullptr) ends->push_back(ws->symbol_ends.back());
        continue;
      }
    }
    EncodeWord(ws, out, ends);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  const TextPart part{text, parse_special};
  return EncodeParts(absl::MakeConstSpan(&part, 1));
}

std::vector<int32_t> Tokenizer::EncodeParts(absl::Span<const TextPart> parts,
                                            std::vector<size_t>* part_of_token) const {
  std::vector<int32_t> out;
  if (part_of_token != nullptr) part_of_token->clear();
  // part_end[i]: end offset of part i in the joined text.
  std::vector<size_t> part_end;
  part_end.reserve(parts.size());
  size_t total = 0;
  bool any_special = false;
  bool all_special = true;
  for (const TextPart& p : parts) {
    total += p.text.size();
    part_end.push_back(total);
    if (!p.text.empty()) {
      any_special = any_special || p.parse_special;
      all_special = all_special && p.parse_special;
    }
  }
  if (total == 0) return out;
  std::string joined_storage;
  std::string_view text;
  if (parts.size() == 1) {
    text = parts[0].text;
  } else {
    joined_storage.reserve(total);
    for (const TextPart& p : parts) joined_storage.append(p.text.data(), p.text.size());
    text = joined_storage;
  }
  // Whether bytes [begin, end) lie wholly inside parts with parse_special.
  const auto special_allowed = [&](size_t begin, size_t end) {
    if (all_special) return true;
    size_t i = static_cast<size_t>(
        std::upper_bound(part_end.begin(), part_end.end(), begin) - part_end.begin());
    for (; i < parts.size(); ++i) {
      if (!parts[i].parse_special && !parts[i].text.empty()) return false;
      if (part_end[i] >= end) return true;
    }
    return true;
  };

  struct Fragment {
    int32_t token;  // -1: raw text [begin, end)
    size_t begin;
    size_t end;
  };
  std::vector<Fragment> fragments = {{-1, 0, text.size()}};
  std::vector<Fragment> next;
  for (int32_t id : special_tokens_) {
    const bool needs_special = (attrs_[id] & (kAttrControl | kAttrUnknown)) != 0;
    if (needs_special && !any_special) continue;
    const std::string& needle = tokens_[id];
    // The first acceptable occurrence of the token in [pos, end), or npos.
    const auto find = [&](size_t pos, size_t end) {
      const std::string_view region = text.substr(0, end);
      for (size_t at = region.find(needle, pos); at != std::string_view::npos;
           at = region.find(needle, at + 1)) {
        if (!needs_special || special_allowed(at, at + needle.size())) return at;
      }
      return std::string_view::npos;
    };
    bool found = false;
    for (const Fragment& f : fragments) {
      if (f.token < 0 && find(f.begin, f.end) != std::string_view::npos) {
        found = true;
        break;
      }
    }
    if (!found) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (true) {
        const size_t match = find(pos, f.end);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({-1, pos, match});
        next.push_back({id, match, match + needle.size()});
        pos = match + needle.size();
      }
      if (pos < f.end) next.push_back({-1, pos, f.end});
    }
    fragments.swap(next);
  }
  Workspace ws;
  std::vector<size_t> ends;
  std::vector<size_t>* ends_ptr = part_of_token != nullptr ? &ends : nullptr;
  out.reserve(text.size() / 3 + 8);
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      if (ends_ptr != nullptr) ends.push_back(f.end);
    } else {
      EncodeRaw(text.substr(f.begin, f.end - f.begin), f.begin, &ws, &out, ends_ptr);
    }
  }
  if (part_of_token != nullptr) {
    // Token ends never decrease, so one forward walk over the parts maps them.
    part_of_token->reserve(out.size());
    size_t part = 0;
    for (size_t end : ends) {
      while (part + 1 < parts.size() && part_end[part] < end) ++part;
      part_of_token->push_back(part);
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::EncodeWithSpecials(std::string_view text,
                                                   bool parse_special) const {
  std::vector<int32_t> ids = Encode(text, parse_special);
  if (add_bos_ && (ids.empty() || ids.front() != bos_id_)) ids.insert(ids.begin(), bos_id_);
  if (add_eos_) ids.push_back(eos_id_);
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool render_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (!IsValid(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
    if (!render_special && IsControl(id)) continue;
    out += pieces_[id];
  }
  return out;
}

int64_t Tokenizer::MinTokensFor(std::string_view text) const {
  if (!merges_closed_) return 0;
  // Encode replaces bytes that are not UTF-8 by U+FFFD, whose bytes may have no token: no bound
  // then. (A U+FFFD in the text itself takes its three bytes.)
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    if (DecodeUtf8Lenient(text, &pos) == 0xFFFD && pos - start != 3) return 0;
  }
  int64_t kept = 0;
  for (unsigned char b : text) kept += ByteHasToken(b) ? 1 : 0;
  return kept / static_cast<int64_t>(2 * max_token_bytes_);
}

std::string_view Tokenizer::TokenPiece(int32_t id) const {
  return IsValid(id) ? std::string_view(pieces_[id]) : std::string_view();
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  return IsValid(id) ? std::string_view(tokens_[id]) : std::string_view();
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view token_text) const {
  auto it = token_to_id_.find(Sv(token_text));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (!IsValid(id)) return TokenType::kUndefined;
  const uint8_t a = attrs_[id];
  if (a & kAttrControl) return TokenType::kControl;
  if (a & kAttrUserDefined) return TokenType::kUserDefined;
  if (a & kAttrUnknown) return TokenType::kUnknown;
  if (a & kAttrNormal) return TokenType::kNormal;
  if (a & kAttrByte) return TokenType::kByte;
  if (a & kAttrUnused) return TokenType::kUnused;
  return TokenType::kUndefined;
}

bool Tokenizer::IsControl(int32_t id) const {
  return IsValid(id) && (attrs_[id] & (kAttrControl | kAttrUnknown)) != 0;
}

absl::StatusOr<std::string> StreamingDecoder::Push(int32_t id) {
  if (!tokenizer_->IsValid(id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token id ", id, " is outside the vocabulary [0, ", tokenizer_->vocab_size(), ")"));
  }
  if (!options_.render_special && tokenizer_->IsControl(id)) return std::string();
  pending_ += tokenizer_->TokenPiece(id);
  return TakeComplete(Utf8CompletePrefixLength(pending_));
}

std::string StreamingDecoder::Flush() { return TakeComplete(pending_.size()); }

std::string StreamingDecoder::TakeComplete(size_t n) {
  std::string out;
  if (options_.replace_invalid) {
    // Lenient decoding turns every byte that is not part of a well-formed sequence into U+FFFD.
    const std::string_view head(pending_.data(), n);
    size_t pos = 0;
    while (pos < head.size()) AppendUtf8(DecodeUtf8Lenient(head, &pos), &out);
  } else {
    out.assign(pending_, 0, n);
  }
  pending_.erase(0, n);
  return out;
}

}  // namespace lazyattn
