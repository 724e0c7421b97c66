// RFC 9112 section 7.1's chunked framing as ChunkedBodyChecker reads it: every body is fed whole,
// a byte at a time and in two pieces, which must agree (the library's reads split a body
// anywhere). The same bodies over a socket: http_request_framing_test.cc.
#include "services/router/http/chunked_body_checker.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lazyattn::router {
namespace {

using std::string_literals::operator""s;

struct Outcome {
  bool ok;
  bool done;
  std::string problem;
};

Outcome Whole(const std::string& body) {
  ChunkedBodyChecker c;
  const bool ok = c.Feed(body.data(), body.size());
  return {ok, c.done(), c.problem()};
}

Outcome ByteByByte(const std::string& body) {
  ChunkedBodyChecker c;
  bool ok = true;
  for (char ch : body) ok = c.Feed(&ch, 1) && ok;
  return {ok, c.done(), c.problem()};
}

Outcome Halves(const std::string& body) {
  ChunkedBodyChecker c;
  const size_t half = body.size() / 2;
  bool ok = c.Feed(body.data(), half);
  ok = c.Feed(body.data() + half, body.size() - half) && ok;
  return {ok, c.done(), c.problem()};
}

// Checks that the three ways of feeding `body` agree, and returns the outcome.
Outcome Check(const std::string& body) {
  const Outcome whole = Whole(body);
  for (const Outcome& other : {ByteByByte(body), Halves(body)}) {
    EXPECT_EQ(other.ok, whole.ok);
    EXPECT_EQ(other.done, whole.done);
    EXPECT_EQ(other.problem, whole.problem);
  }
  return whole;
}

TEST(ChunkedBodyCheckerTest, AcceptsTheGrammar) {
  const std::vector<std::string> bodies = {
      "5\r\nhello\r\n0\r\n\r\n",
      "0\r\n\r\n",                                                           // empty
      "A\r\n0123456789\r\n1F\r\n" + std::string(31, 'x') + "\r\n0\r\n\r\n",  // upper case
      "a\r\n0123456789\r\n1f\r\n" + std::string(31, 'x') + "\r\n0\r\n\r\n",  // lower case
      "0005\r\nhello\r\n000\r\n\r\n",                                        // leading zeros
      "000000000000000000000001\r\nx\r\n0\r\n\r\n",                          // many of them
      "5;name\r\nhello\r\n0\r\n\r\n",                                        // extensions
      "5;a=b;c=\"q \\\" d\";e\r\nhello\r\n0;last=1\r\n\r\n",
      "5 ; a = b ;c\t=\t\"v\"\r\nhello\r\n0\r\n\r\n",       // BWS around ; and =
      "5;a=\"\"\r\nhello\r\n0\r\n\r\n",                     // an empty quoted value
      "5\r\nhello\r\n0\r\nX-Trailer: 1\r\nEmpty:\r\n\r\n",  // trailer fields
      "7\r\n0\r\n\r\nab\r\n0\r\n\r\n",                      // data that looks like framing
      "3\r\n\r\n\n\r\n0\r\n\r\n",                           // data of CR and LF
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(body);
    const Outcome o = Check(body);
    EXPECT_TRUE(o.ok) << o.problem;
    EXPECT_TRUE(o.done);
    EXPECT_EQ(o.problem, "");
  }
}

TEST(ChunkedBodyCheckerTest, RefusesWhatIsNotTheGrammar) {
  struct Case {
    std::string body;
    std::string problem;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"0x5\r\nhello\r\n0\r\n\r\n", "chunk size: \"x\" after its digits (no 0x prefix)"},
      {"+5\r\nhello\r\n0\r\n\r\n", "chunk size: expected a hex digit, got \"+\""},
      {" 5\r\nhello\r\n0\r\n\r\n", "chunk size: expected a hex digit, got \" \""},
      {"\t5\r\nhello\r\n0\r\n\r\n", "chunk size: expected a hex digit, got \"\\x09\""},
      {"-5\r\nhello\r\n0\r\n\r\n", "chunk size: expected a hex digit, got \"-\""},
      {"g\r\n", "chunk size: expected a hex digit, got \"g\""},
      {"5g\r\n", "chunk size: expected a hex digit, \";\" or CRLF, got \"g\""},
      {"\r\n", "chunk size: expected a hex digit, got \"\\x0d\""},  // no size at all
      {"1000000000000000\r\n", "chunk size: more than 15 significant hex digits"},
      {"0001000000000000000\r\n", "chunk size: more than 15 significant hex digits"},
      {"ffffffffffffffffffffffffffffffff\r\n", "more than 15 significant hex digits"},
      // What follows a chunk's data must be CRLF: the library dropped anything else.
      {"5\r\nhello0\r\n\r\n",
       "chunk data: expected CRLF after the chunk's 5 bytes (its size), got "
       "\"0\""},
      {"5\r\nhelloXX0\r\n\r\n", "expected CRLF after the chunk's 5 bytes (its size), got \"X\""},
      {"5\r\nhello\rX\r\n0\r\n\r\n", "chunk data: followed by a CR not followed by LF"},
      // Bare LF is no line end anywhere.
      {"5\nhello\n0\n\n", "chunk size line: ends in a bare LF, not CRLF"},
      {"5;a=b\nhello\r\n0\r\n\r\n", "chunk size line: ends in a bare LF, not CRLF"},
      {"5\r\nhello\n0\r\n\r\n", "chunk data: followed by a bare LF, not CRLF"},
      {"5\r\nhello\r\n0\r\n\n", "the body's last line: a bare LF, not CRLF"},
      {"0\r\nX: 1\n\r\n", "trailer field: its line ends in a bare LF, not CRLF"},
      // A bare CR.
      {"5\rhello", "chunk size line: a CR not followed by LF (a bare CR)"},
      {"0\r\n\rX", "the body's last line: a CR not followed by LF (a bare CR)"},
      {"0\r\nX: 1\rY: 2\r\n\r\n", "trailer field: a CR not followed by LF (a bare CR)"},
      // Extensions.
      {"5 \r\nhello\r\n0\r\n\r\n",
       "chunk extension: expected \";\" after whitespace, got \"\\x0d\""},
      {"5;\r\nhello\r\n0\r\n\r\n", "chunk extension: expected a name after \";\", got \"\\x0d\""},
      {"5;=b\r\n", "chunk extension: expected a name after \";\""},
      {"5;a b\r\n", "chunk extension: expected \"=\", \";\" or CRLF after a name, got \"b\""},
      {"5;a \r\n", "chunk extension: expected \"=\", \";\" or CRLF after a name"},
      {"5;a=\r\n", "chunk extension: expected a token or a quoted string after \"=\""},
      {"5;a=\"x\r\n", "chunk extension: a quoted value holds a control byte"},
      {"5;a=\"x\\\r\"\r\n", "chunk extension: a quoted value holds a control byte"},
      {"5;a=\"x\"y\r\n", "chunk extension: expected \";\" or CRLF after a value, got \"y\""},
      {"5;a=b\"\r\n", "chunk extension: expected \";\" or CRLF after a value, got \"\\x22\""},
      // Trailer fields.
      {"0\r\nX: 1\r\n folded\r\n\r\n", "trailer field: a line begins with a space or tab"},
      {"0\r\nNoColon\r\n\r\n", "trailer field: expected a name (a token) and a colon"},
      {"0\r\nX : 1\r\n\r\n", "trailer field: expected a name (a token) and a colon, got \" \""},
      {"0\r\nX: a\0b\r\n\r\n"s, "trailer field: a NUL byte in its value"},
      {"0\r\n:1\r\n\r\n", "the body's last line: expected CRLF or a trailer field, got \":\""},
      // Past the end.
      {"0\r\n\r\nX", "bytes after the final CRLF of the body"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const Outcome o = Check(c.body);
    EXPECT_FALSE(o.ok);
    EXPECT_FALSE(o.done);
    EXPECT_NE(o.problem.find(c.problem), std::string::npos) << o.problem;
  }
}

// A body cut short is no error here (the library's read then fails or waits for the rest), and a
// size of 15 significant digits, the most taken, is read.
TEST(ChunkedBodyCheckerTest, AnIncompleteBodyIsNotYetDone) {
  for (const std::string body :
       {"", "5", "5\r", "5\r\nhel", "5\r\nhello\r\n", "5\r\nhello\r\n0\r\n", "0\r\nX: 1\r\n",
        "5;a=\"x", "0000fffffffffffffff\r\n"}) {
    SCOPED_TRACE(body);
    const Outcome o = Check(body);
    EXPECT_TRUE(o.ok) << o.problem;
    EXPECT_FALSE(o.done);
  }
}

TEST(ChunkedBodyCheckerTest, SaysWhetherTrailerFieldsCame) {
  ChunkedBodyChecker with;
  const std::string trailer = "0\r\nX-T: 1\r\n\r\n";
  EXPECT_TRUE(with.Feed(trailer.data(), trailer.size()));
  EXPECT_TRUE(with.has_trailer());
  ChunkedBodyChecker without;
  const std::string plain = "1\r\nx\r\n0\r\n\r\n";
  EXPECT_TRUE(without.Feed(plain.data(), plain.size()));
  EXPECT_FALSE(without.has_trailer());
}

// Once broken, the framing stays broken: nothing fed after is read as a body.
TEST(ChunkedBodyCheckerTest, AFailureIsFinal) {
  ChunkedBodyChecker c;
  EXPECT_FALSE(c.Feed("+", 1));
  const std::string good = "5\r\nhello\r\n0\r\n\r\n";
  EXPECT_FALSE(c.Feed(good.data(), good.size()));
  EXPECT_FALSE(c.done());
  EXPECT_EQ(c.problem(),
            "chunk size: expected a hex digit, got \"+\" (a size is hex digits alone: no sign, no "
            "whitespace before it)");
}

}  // namespace
}  // namespace lazyattn::router
