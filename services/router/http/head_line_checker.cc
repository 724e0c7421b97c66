#include "services/router/http/head_line_checker.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/router/http/http_syntax.h"

namespace lazyattn::router {
namespace {

// Of a line's start (a field's name), quoted in a message.
constexpr size_t kQuotedBytes = 32;

// cpp-httplib 0.11 percent-decodes every header value, so `Content-Length: 1%30` is 10 and
// `Transfer-Encoding: %63hunked` is chunked to the router while a proxy in front reads them as
// written. In these fields (framing, routing and credentials) a '%' has no legitimate use.
bool PercentDecodedBadly(absl::string_view name) {
  for (absl::string_view field : {"content-length", "transfer-encoding", "content-encoding",
                                 "content-type", "host", "authorization", "connection", "expect"}) {
    if (absl::EqualsIgnoreCase(name, field)) return true;
  }
  return false;
}

}  // namespace

void HeadLineChecker::Fail(std::string problem) {
  problem_ = std::move(problem);
  problem_line_ = line_;
}

std::string HeadLineChecker::Quoted() const {
  if (line_ == 0) return "the request line";
  return absl::StrCat(colon_ ? "header " : "header line ", QuoteBytes(start_, kQuotedBytes));
}

void HeadLineChecker::EndLine() {
  ++line_;
  line_bytes_ = 0;
  start_.clear();
  colon_ = false;
}

bool HeadLineChecker::Feed(char ch) {
  const unsigned char c = static_cast<unsigned char>(ch);
  if (done_) return !failed();
  if (failed()) {
    // Only where the library's lines end matters now (in_request_line): at a LF, bare or not.
    if (c == '\n') EndLine();
    return false;
  }
  if (cr_) {
    cr_ = false;
    if (c != '\n') {
      Fail(absl::StrCat(Quoted(), ": a CR not followed by LF (a bare CR)"));
      return false;
    }
    if (line_ > 0 && line_bytes_ == 0) {
      done_ = true;  // the blank line: the head ends
    } else if (line_ > 0 && !colon_) {
      Fail(absl::StrCat(Quoted(), ": no colon (a header line is name: value)"));
      EndLine();
      return false;
    } else {
      EndLine();
    }
    return true;
  }
  if (c == '\n') {
    Fail(line_ > 0 && line_bytes_ == 0
             ? std::string("the blank line after the headers is a bare LF, not CRLF")
             : absl::StrCat(Quoted(), ": ends in a bare LF, not CRLF"));
    EndLine();
    return false;
  }
  if (c == '\r') {
    cr_ = true;
    return true;
  }
  if (line_ == 0) {
    if (c < 0x20 || c == 0x7f) {
      Fail(absl::StrCat("the request line: holds the control byte \\x",
                        absl::Hex(c, absl::kZeroPad2)));
    }
  } else if (line_bytes_ == 0 && (c == ' ' || c == '\t')) {
    Fail(
        "a header line begins with a space or tab (obs-fold: a value folded over several lines "
        "is not accepted)");
  } else if (colon_) {
    if (c == '\0') Fail(absl::StrCat(Quoted(), ": a NUL byte in its value"));
    if (c == '%' && PercentDecodedBadly(start_)) {
      Fail(absl::StrCat(Quoted(), ": a '%' in its value (this field is read as written; ",
                        "percent-encoding is not accepted here)"));
    }
  } else if (c == ':') {
    colon_ = true;
  } else if (start_.size() <= kQuotedBytes) {
    start_ += static_cast<char>(c);
  }
  ++line_bytes_;
  return !failed();
}

}  // namespace lazyattn::router
