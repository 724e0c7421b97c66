#include "services/router/http/openai_logprobs.h"

#include <charconv>
#include <system_error>

#include "absl/strings/str_format.h"
#include "common/utf8.h"

namespace lazyattn::router {

using nlohmann::json;

std::optional<TokenLogprob> LogprobOf(const lazyattn::v1::TokenChunk& chunk) {
  if (chunk.token_id() < 0 || !chunk.has_logprob()) return std::nullopt;
  // A worker from before token_bytes sends the token's text only: the nearest there is.
  TokenLogprob entry{.bytes = chunk.token_bytes().empty() ? chunk.text() : chunk.token_bytes(),
                     .logprob = chunk.logprob()};
  entry.top_logprobs.reserve(chunk.top_logprobs_size());
  for (const lazyattn::v1::TopLogprob& t : chunk.top_logprobs()) {
    entry.top_logprobs.push_back({.bytes = t.token_bytes(), .logprob = t.logprob()});
  }
  return entry;
}

std::string TokenString(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    const size_t bad = FirstInvalidUtf8Byte(bytes);
    if (bad == std::string_view::npos) {
      out.append(bytes);
      break;
    }
    out.append(bytes.substr(0, bad));
    absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(bytes[bad]));
    bytes.remove_prefix(bad + 1);
  }
  return out;
}

namespace {

// The double that prints as the float's shortest round-trip form (-0.1f as -0.1, not as
// -0.10000000149011612), so clients see the value the worker computed, written as it would be.
double AsPrintedDouble(float value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  double out = value;
  if (error == std::errc()) std::from_chars(buffer, end, out);
  return out;
}

json ByteList(std::string_view bytes) {
  json list = json::array();
  for (char c : bytes) list.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return list;
}

}  // namespace

int64_t TextOffset::StartOf(std::string_view bytes) const {
  const bool continues = !bytes.empty() && continuation_bytes_due_ > 0 &&
                         (static_cast<unsigned char>(bytes.front()) & 0xC0) == 0x80;
  return bytes.empty() || continues ? characters_ : characters_ + bytes_of_character_;
}

void TextOffset::Add(std::string_view bytes) {
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if ((b & 0xC0) == 0x80 && continuation_bytes_due_ > 0) {
      ++bytes_of_character_;
      if (--continuation_bytes_due_ == 0) {
        ++characters_;  // the character's last byte
        bytes_of_character_ = 0;
      }
      continue;
    }
    // The character under way was cut short: each of its bytes shows as U+FFFD.
    characters_ += bytes_of_character_;
    bytes_of_character_ = 0;
    continuation_bytes_due_ = 0;
    if (b >= 0xC2 && b <= 0xDF) {
      continuation_bytes_due_ = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      continuation_bytes_due_ = 2;
    } else if (b >= 0xF0 && b <= 0xF4) {
      continuation_bytes_due_ = 3;
    }
    if (continuation_bytes_due_ > 0) {
      bytes_of_character_ = 1;
    } else {
      ++characters_;  // ASCII, or a byte no character starts with (one U+FFFD)
    }
  }
}

json ChatLogprobs(std::span<const TokenLogprob> tokens) {
  json content = json::array();
  for (const TokenLogprob& t : tokens) {
    json top = json::array();
    for (const TokenAlternative& a : t.top_logprobs) {
      top.push_back({{"token", TokenString(a.bytes)},
                     {"logprob", AsPrintedDouble(a.logprob)},
                     {"bytes", ByteList(a.bytes)}});
    }
    content.push_back({{"token", TokenString(t.bytes)},
                       {"logprob", AsPrintedDouble(t.logprob)},
                       {"bytes", ByteList(t.bytes)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json CompletionLogprobs(std::span<const TokenLogprob> tokens, TextOffset* offset,
                        bool alternatives) {
  json strings = json::array(), logprobs = json::array(), offsets = json::array();
  json top = alternatives ? json::array() : json(nullptr);
  for (const TokenLogprob& t : tokens) {
    std::string token = TokenString(t.bytes);
    if (alternatives) {
      json by_string = json::object();
      // emplace keeps a key's first value: the more likely token's (openai_logprobs.h).
      for (const TokenAlternative& a : t.top_logprobs) {
        by_string.emplace(TokenString(a.bytes), AsPrintedDouble(a.logprob));
      }
      by_string.emplace(token, AsPrintedDouble(t.logprob));
      top.push_back(std::move(by_string));
    }
    strings.push_back(std::move(token));
    logprobs.push_back(AsPrintedDouble(t.logprob));
    offsets.push_back(offset->StartOf(t.bytes));
    offset->Add(t.bytes);
  }
  return {{"tokens", std::move(strings)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace lazyattn::router
