#include "services/router/http/chunked_body_checker.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/router/http/http_syntax.h"

namespace lazyattn::router {
namespace {

int HexValue(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsBlank(unsigned char c) { return c == ' ' || c == '\t'; }

// RFC 9110's qdtext, and what may follow a backslash in a quoted string.
bool IsQdText(unsigned char c) {
  return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) ||
         (c >= 0x5d && c <= 0x7e) || c >= 0x80;
}
bool IsQuotedPairChar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

std::string Quoted(unsigned char c) {
  const char byte = static_cast<char>(c);
  return QuoteBytes(std::string_view(&byte, 1), 1);
}
std::string Got(unsigned char c) { return absl::StrCat("got ", Quoted(c)); }

}  // namespace

void ChunkedBodyChecker::Fail(std::string problem) {
  if (problem_.empty()) problem_ = std::move(problem);
}

bool ChunkedBodyChecker::Feed(const char* data, size_t size) {
  size_t i = 0;
  while (i < size && !failed()) {
    if (state_ == State::kDone) {
      Fail("bytes after the final CRLF of the body");
    } else if (state_ == State::kData) {
      const uint64_t take = std::min<uint64_t>(left_, size - i);
      left_ -= take;
      i += static_cast<size_t>(take);
      if (left_ == 0) state_ = State::kDataCr;
    } else {
      Step(static_cast<unsigned char>(data[i++]));
    }
  }
  return !failed();
}

void ChunkedBodyChecker::Step(unsigned char c) {
  constexpr char kExtension[] = "chunk extension: expected ";
  // A LF where none may come: every line ends with CRLF (a bare LF is refused, never a line end).
  const bool lf_expected = state_ == State::kSizeLf || state_ == State::kDataLf ||
                           state_ == State::kTrailerLf || state_ == State::kFinalLf;
  if (c == '\n' && !lf_expected) {
    switch (state_) {
      case State::kDataCr:
        return Fail("chunk data: followed by a bare LF, not CRLF");
      case State::kTrailerStart:
        return Fail("the body's last line: a bare LF, not CRLF");
      case State::kTrailerName:
      case State::kTrailerValue:
        return Fail("trailer field: its line ends in a bare LF, not CRLF");
      default:
        return Fail("chunk size line: ends in a bare LF, not CRLF");
    }
  }
  switch (state_) {
    case State::kSizeStart:
    case State::kSize: {
      const int v = HexValue(c);
      if (v >= 0) {
        if (size_digits_ > 0 || v != 0) ++size_digits_;
        if (size_digits_ > kMaxSizeDigits) {
          return Fail(
              absl::StrCat("chunk size: more than ", kMaxSizeDigits, " significant hex digits"));
        }
        size_ = size_ * 16 + static_cast<uint64_t>(v);
        state_ = State::kSize;
      } else if (state_ == State::kSizeStart) {
        Fail(absl::StrCat("chunk size: expected a hex digit, ", Got(c),
                          " (a size is hex digits alone: no sign, no whitespace before it)"));
      } else if (c == ';') {
        state_ = State::kExtNameStart;
      } else if (IsBlank(c)) {
        state_ = State::kExtBws;
      } else if (c == '\r') {
        EndSizeLine();
      } else if (c == 'x' || c == 'X') {
        Fail(absl::StrCat("chunk size: ", Quoted(c), " after its digits (no 0x prefix)"));
      } else {
        Fail(absl::StrCat("chunk size: expected a hex digit, \";\" or CRLF, ", Got(c)));
      }
      return;
    }
    case State::kExtBws:
      if (c == ';') {
        state_ = State::kExtNameStart;
      } else if (!IsBlank(c)) {
        Fail(absl::StrCat(kExtension, "\";\" after whitespace, ", Got(c)));
      }
      return;
    case State::kExtNameStart:
      if (IsTokenChar(c)) {
        state_ = State::kExtName;
      } else if (!IsBlank(c)) {
        Fail(absl::StrCat(kExtension, "a name after \";\", ", Got(c)));
      }
      return;
    case State::kExtName:
    case State::kExtAfterName:
      if (state_ == State::kExtName && IsTokenChar(c)) return;
      if (c == '=') {
        state_ = State::kExtValueStart;
      } else if (c == ';') {
        state_ = State::kExtNameStart;
      } else if (IsBlank(c)) {
        state_ = State::kExtAfterName;
      } else if (c == '\r' && state_ == State::kExtName) {
        EndSizeLine();
      } else {
        Fail(absl::StrCat(kExtension, "\"=\", \";\" or CRLF after a name, ", Got(c)));
      }
      return;
    case State::kExtValueStart:
      if (c == '"') {
        state_ = State::kExtQuoted;
      } else if (IsTokenChar(c)) {
        state_ = State::kExtToken;
      } else if (!IsBlank(c)) {
        Fail(absl::StrCat(kExtension, "a token or a quoted string after \"=\", ", Got(c)));
      }
      return;
    case State::kExtToken:
    case State::kExtAfterValue:
      if (state_ == State::kExtToken && IsTokenChar(c)) return;
      if (c == ';') {
        state_ = State::kExtNameStart;
      } else if (IsBlank(c)) {
        state_ = State::kExtBws;
      } else if (c == '\r') {
        EndSizeLine();
      } else {
        Fail(absl::StrCat(kExtension, "\";\" or CRLF after a value, ", Got(c)));
      }
      return;
    case State::kExtQuoted:
      if (c == '"') {
        state_ = State::kExtAfterValue;
      } else if (c == '\\') {
        state_ = State::kExtQuotedPair;
      } else if (!IsQdText(c)) {
        Fail(absl::StrCat("chunk extension: a quoted value holds a control byte, ", Got(c)));
      }
      return;
    case State::kExtQuotedPair:
      if (!IsQuotedPairChar(c)) {
        Fail(absl::StrCat("chunk extension: a quoted value holds a control byte, ", Got(c)));
      }
      state_ = State::kExtQuoted;
      return;
    case State::kSizeLf:
      if (c != '\n') return Fail("chunk size line: a CR not followed by LF (a bare CR)");
      if (size_ == 0) {
        state_ = State::kTrailerStart;  // the last chunk
      } else {
        chunk_ = left_ = size_;
        state_ = State::kData;
      }
      return;
    case State::kDataCr:
      if (c != '\r') {
        Fail(absl::StrCat("chunk data: expected CRLF after the chunk's ", chunk_,
                          " bytes (its size), ", Got(c)));
      }
      state_ = State::kDataLf;
      return;
    case State::kDataLf:
      if (c != '\n') return Fail("chunk data: followed by a CR not followed by LF (a bare CR)");
      size_ = 0;
      size_digits_ = 0;
      state_ = State::kSizeStart;
      return;
    case State::kTrailerStart:
      if (c == '\r') {
        state_ = State::kFinalLf;
      } else if (IsBlank(c)) {
        Fail("trailer field: a line begins with a space or tab (obs-fold is not accepted)");
      } else if (IsTokenChar(c)) {
        has_trailer_ = true;
        state_ = State::kTrailerName;
      } else {
        Fail(absl::StrCat("the body's last line: expected CRLF or a trailer field, ", Got(c)));
      }
      return;
    case State::kTrailerName:
      if (c == ':') {
        state_ = State::kTrailerValue;
      } else if (!IsTokenChar(c)) {
        Fail(absl::StrCat("trailer field: expected a name (a token) and a colon, ", Got(c)));
      }
      return;
    case State::kTrailerValue:
      if (c == '\r') {
        state_ = State::kTrailerLf;
      } else if (c == '\0') {
        Fail("trailer field: a NUL byte in its value");
      }
      return;
    case State::kTrailerLf:
      if (c != '\n') return Fail("trailer field: a CR not followed by LF (a bare CR)");
      state_ = State::kTrailerStart;
      return;
    case State::kFinalLf:
      if (c != '\n') return Fail("the body's last line: a CR not followed by LF (a bare CR)");
      state_ = State::kDone;
      return;
    case State::kData:
    case State::kDone:
      return;  // Feed handles these
  }
}

}  // namespace lazyattn::router
