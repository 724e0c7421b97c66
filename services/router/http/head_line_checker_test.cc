// What HeadLineChecker finds in a request's line and headers, fed a byte at a time as cpp-httplib
// reads them. The same heads over a socket: http_request_framing_test.cc.
#include "services/router/http/head_line_checker.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lazyattn::router {
namespace {

using std::string_literals::operator""s;

// Feeds all of `head`; the checker as it is then.
HeadLineChecker Fed(const std::string& head) {
  HeadLineChecker c;
  for (char ch : head) c.Feed(ch);
  return c;
}

TEST(HeadLineCheckerTest, AcceptsWellFormedHeads) {
  const std::vector<std::string> heads = {
      "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n",
      // A tab, other control bytes and bytes over 0x7f in a value: RFC 9110 lets them be kept.
      "GET / HTTP/1.1\r\nX-A: a\tb\x01"
      "c\x7f\xc3\xa9\r\nEmpty:\r\nNoSpace:1\r\n\r\n",
      // '%' in a field that is not about framing, routing or credentials.
      "GET / HTTP/1.1\r\nUser-Agent: a%20b\r\nX-Content-Length: 1%30\r\n\r\n",
      // A name that is no token is the parsed headers' check (request_head_checks.h).
      "GET / HTTP/1.1\r\nX\0A: 1\r\nX-B : 2\r\n\r\n"s,
  };
  for (const std::string& head : heads) {
    SCOPED_TRACE(head);
    const HeadLineChecker c = Fed(head);
    EXPECT_FALSE(c.failed()) << c.problem();
    EXPECT_TRUE(c.done());
  }
}

TEST(HeadLineCheckerTest, RefusesWhatTheLibraryLetsThroughOrDrops) {
  struct Case {
    const char* what;
    std::string head;
    std::string problem;
  };
  const std::vector<Case> cases = {
      {"bare CR in a value", "GET / HTTP/1.1\r\nX-A: a\rContent-Length: 0\r\n\r\n",
       "header \"X-A\": a CR not followed by LF (a bare CR)"},
      {"CR CR LF", "GET / HTTP/1.1\r\nX-A: a\r\r\n\r\n",
       "header \"X-A\": a CR not followed by LF (a bare CR)"},
      {"bare CR in a name", "GET / HTTP/1.1\r\nX\rA: 1\r\n\r\n",
       "header line \"X\": a CR not followed by LF (a bare CR)"},
      {"NUL in a value", "GET / HTTP/1.1\r\nX-A: a\0b\r\n\r\n"s,
       "header \"X-A\": a NUL byte in its value"},
      {"no colon", "GET / HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n",
       "header line \"NoColonHere\": no colon (a header line is name: value)"},
      {"obs-fold", "GET / HTTP/1.1\r\nX-A: a\r\n b\r\n\r\n",
       "a header line begins with a space or tab (obs-fold: a value folded over several lines is "
       "not accepted)"},
      {"obs-fold with a tab and a colon", "GET / HTTP/1.1\r\nHost: x\r\n\tX-B: 1\r\n\r\n",
       "a header line begins with a space or tab"},
      {"header line ending in LF", "GET / HTTP/1.1\r\nX-A: 1\nHost: x\r\n\r\n",
       "header \"X-A\": ends in a bare LF, not CRLF"},
      {"blank line of a bare LF", "GET / HTTP/1.1\r\nHost: x\r\n\n",
       "the blank line after the headers is a bare LF, not CRLF"},
      {"long name quoted cut", "GET / HTTP/1.1\r\n" + std::string(40, 'N') + "\r\n\r\n",
       "header line \"" + std::string(32, 'N') + "...\": no colon"},
      {"escaped bytes in a quoted name", "GET / HTTP/1.1\r\nA\"\x01\r\n\r\n",
       "header line \"A\\x22\\x01\": no colon"},
      // The library would percent-decode these values into 10, chunked and a different key.
      {"percent in Content-Length", "POST / HTTP/1.1\r\nContent-Length: 1%30\r\n\r\n",
       "header \"Content-Length\": a '%' in its value"},
      {"percent in Transfer-Encoding", "POST / HTTP/1.1\r\ntransfer-ENCODING: %63hunked\r\n\r\n",
       "header \"transfer-ENCODING\": a '%' in its value"},
      {"percent in Authorization", "GET / HTTP/1.1\r\nAuthorization: Bearer k%41\r\n\r\n",
       "header \"Authorization\": a '%' in its value"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const HeadLineChecker checker = Fed(c.head);
    EXPECT_TRUE(checker.failed());
    EXPECT_FALSE(checker.failed_in_request_line());
    EXPECT_EQ(checker.problem().substr(0, c.problem.size()), c.problem) << checker.problem();
  }
}

// A problem in the request line is found, but the line is followed to its end (the router lets
// the library finish it, so that it answers 400 instead of closing without a word).
TEST(HeadLineCheckerTest, FollowsABrokenRequestLineToItsEnd) {
  struct Case {
    std::string line;
    std::string problem;
    size_t found_at;  // the byte at which it is found
  };
  const std::vector<Case> cases = {
      {"GET /a\rb HTTP/1.1\r\n", "the request line: a CR not followed by LF (a bare CR)", 7},
      {"GET /a\tb HTTP/1.1\r\n", "the request line: holds the control byte \\x09", 6},
      {"GET /a\0b HTTP/1.1\r\n"s, "the request line: holds the control byte \\x00", 6},
      {"GET / HTTP/1.1\n", "the request line: ends in a bare LF, not CRLF", 14},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.problem);
    HeadLineChecker checker;
    for (size_t i = 0; i < c.line.size(); ++i) {
      EXPECT_EQ(checker.Feed(c.line[i]), i < c.found_at) << i;
      EXPECT_EQ(checker.in_request_line(), i + 1 < c.line.size()) << i;
    }
    EXPECT_TRUE(checker.failed_in_request_line());
    EXPECT_EQ(checker.problem(), c.problem);
    EXPECT_FALSE(checker.Feed('H'));  // the headers after it change nothing
    EXPECT_EQ(checker.problem(), c.problem);
  }
}

// After the blank line the head is over: what follows is the body, not this checker's.
TEST(HeadLineCheckerTest, StopsAtTheEndOfTheHead) {
  HeadLineChecker c = Fed("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(c.done());
  for (char ch : "\n\r\0 x"s) EXPECT_TRUE(c.Feed(ch));
  EXPECT_FALSE(c.failed());
}

}  // namespace
}  // namespace lazyattn::router
