// What the HTTP listener refuses of a request's framing where cpp-httplib 0.11 is lenient, over
// real sockets on 127.0.0.1 in front of a router with a fake worker: a chunked body's sizes,
// extensions and line ends (chunked_body_checker.h); a bare CR or a NUL in a header value, a header
// line without a colon or folded, a bare LF (head_line_checker.h); an encoded slash in the path.
// Each is answered 400 at once, naming what was wrong, and the connection closed. The checks on
// their own: chunked_body_checker_test.cc, head_line_checker_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/router/http/http_request_head_test_fixture.h"
#include "services/router/http/raw_http_client_for_test.h"

namespace lazyattn::router::http_test {
namespace {

using std::string_literals::operator""s;
using testing::CountResponses;
using testing::ReadResponse;

using HttpRequestFramingTest = HttpRequestHeadTest;

std::string ChunkedChatHead(bool close = true) {
  return absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
      close ? "Connection: close\r\n" : "", "Transfer-Encoding: chunked\r\n\r\n");
}

// The error's message in a reply, or "" when it holds none.
std::string MessageOf(const std::string& reply) {
  const nlohmann::json body = BodyOf(reply);
  if (!body.is_object() || !body.contains("error") || !body["error"]["message"].is_string()) {
    return "";
  }
  return body["error"]["message"].get<std::string>();
}

// A refusal of the framing: 400, the one response, `Connection: close`, and closed.
void ExpectRefused(const std::string& reply, bool closed) {
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply.substr(0, 400);
  EXPECT_EQ(CountResponses(reply), 1) << reply.substr(0, 600);
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply.substr(0, 400);
  EXPECT_TRUE(closed);
}

// cpp-httplib read a chunk size with strtoul (`0x4a`, `+4a`, ` 4a` were 74, `-5` was 2^64 - 5 and
// waited for the body timeout) and took anything but CRLF after a chunk's data as the body's end.
// Each is now a 400 at once that says what was wrong (the body timeout here is 60 s).
TEST_F(HttpRequestFramingTest, AChunkedBodyOutsideTheGrammarIs400AtOnce) {
  StartHttp(Options());
  const std::string chat = kChatBody;
  const std::string size = absl::StrCat(absl::Hex(chat.size()));
  struct Case {
    const char* what;
    std::string body;
    std::string problem;  // what the message says after its prefix
  };
  const std::vector<Case> cases = {
      {"0x prefix", absl::StrCat("0x", size, "\r\n", chat, "\r\n0\r\n\r\n"),
       "chunk size: \"x\" after its digits (no 0x prefix)"},
      {"plus sign", absl::StrCat("+", size, "\r\n", chat, "\r\n0\r\n\r\n"),
       "chunk size: expected a hex digit, got \"+\""},
      {"leading space", absl::StrCat(" ", size, "\r\n", chat, "\r\n0\r\n\r\n"),
       "chunk size: expected a hex digit, got \" \""},
      {"minus sign", absl::StrCat("-5\r\n", chat, "\r\n0\r\n\r\n"),
       "chunk size: expected a hex digit, got \"-\""},
      {"not hex", absl::StrCat("zz\r\n", chat, "\r\n0\r\n\r\n"),
       "chunk size: expected a hex digit, got \"z\""},
      {"overlong size", absl::StrCat("1000000000000000\r\n", chat, "\r\n0\r\n\r\n"),
       "chunk size: more than 15 significant hex digits"},
      {"junk after the data", absl::StrCat(size, "\r\n", chat, "XX0\r\n\r\n"),
       absl::StrCat("chunk data: expected CRLF after the chunk's ", chat.size(),
                    " bytes (its size), got \"X\"")},
      {"no CRLF after the data", absl::StrCat(size, "\r\n", chat, "0\r\n\r\n"),
       "chunk data: expected CRLF after the chunk's"},
      {"bare LF after the data", absl::StrCat(size, "\r\n", chat, "\n0\r\n\r\n"),
       "chunk data: followed by a bare LF, not CRLF"},
      {"bare LF after the size", absl::StrCat(size, "\n", chat, "\r\n0\r\n\r\n"),
       "chunk size line: ends in a bare LF, not CRLF"},
      {"whitespace without an extension", absl::StrCat(size, " \r\n", chat, "\r\n0\r\n\r\n"),
       "chunk extension: expected \";\" after whitespace"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const auto start = std::chrono::steady_clock::now();
    bool closed = false;
    const std::string reply = Exchange(ChunkedChatHead() + c.body, &closed);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    ExpectRefused(reply, closed);
    const std::string message = MessageOf(reply);
    EXPECT_EQ(message.rfind("body: malformed chunked encoding: " + c.problem, 0), 0u) << message;
    EXPECT_EQ(BodyOf(reply)["error"]["param"], "body") << reply;
  }
}

// What the grammar allows is read as before: extensions, upper-case digits, leading zeros, and a
// chunked request kept alive is followed by the next one.
TEST_F(HttpRequestFramingTest, AChunkedBodyInTheGrammarIsRead) {
  StartHttp(Options());
  const std::string chat = kChatBody;
  const std::string first = chat.substr(0, 10), rest = chat.substr(10);
  const std::string upper = absl::AsciiStrToUpper(absl::StrCat(absl::Hex(rest.size())));
  for (const std::string& body : {
           absl::StrCat("0", absl::Hex(first.size()), ";a=b ; c=\"d;e\"\r\n", first, "\r\n", upper,
                        "\r\n", rest, "\r\n000;end\r\n\r\n"),
           absl::StrCat("00000", absl::Hex(chat.size()), "\r\n", chat, "\r\n0\r\n\r\n"),
       }) {
    SCOPED_TRACE(body);
    const std::string reply = Exchange(ChunkedChatHead() + body);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  }
  // Two chunked requests on one connection: the check of the first ends with its body.
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  const std::string chunked = absl::StrCat(absl::Hex(chat.size()), "\r\n", chat, "\r\n0\r\n\r\n");
  ASSERT_TRUE(
      SendAll(fd, ChunkedChatHead(/*close=*/false) + chunked + ChunkedChatHead() + chunked));
  const std::string one = ReadResponse(fd);
  const std::string two = ReadResponse(fd);
  close(fd);
  EXPECT_EQ(one.rfind("HTTP/1.1 200", 0), 0u) << one;
  EXPECT_EQ(two.rfind("HTTP/1.1 200", 0), 0u) << two;
}

// cpp-httplib kept a bare CR or a NUL in a header value, dropped a header line without a colon
// (a folded line among them) and skipped a line ending in a bare LF: a proxy in front could read
// each of them otherwise (a CR as a line end: `X-A: a\rContent-Length: 0` is two fields there).
TEST_F(HttpRequestFramingTest, AMalformedHeaderLineIs400AndClosesTheConnection) {
  StartHttp(Options());
  const std::string chat = kChatBody;
  struct Case {
    const char* what;
    std::string header;  // a line among the chat request's headers
    std::string problem;
  };
  const std::vector<Case> cases = {
      {"bare CR in a value", "X-A: a\rContent-Length: 0\r\n",
       "header \"X-A\": a CR not followed by LF (a bare CR)"},
      {"NUL in a value", "X-A: a\0b\r\n"s, "header \"X-A\": a NUL byte in its value"},
      {"no colon", "NoColonHere\r\n",
       "header line \"NoColonHere\": no colon (a header line is name: value)"},
      {"folded value", "X-A: a\r\n b\r\n",
       "a header line begins with a space or tab (obs-fold: a value folded over several lines "
       "is not accepted)"},
      {"folded line with a colon", "X-A: a\r\n\tX-B: b\r\n",
       "a header line begins with a space or tab"},
      {"bare LF", "X-A: 1\n", "header \"X-A\": ends in a bare LF, not CRLF"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    bool closed = false;
    const std::string reply = Exchange(ChatHead(c.header, chat.size()) + chat, &closed);
    ExpectRefused(reply, closed);
    const std::string message = MessageOf(reply);
    EXPECT_EQ(message.rfind("the request does not parse as HTTP/1.1: " + c.problem, 0), 0u)
        << message;
    EXPECT_TRUE(BodyOf(reply)["error"]["param"].is_null()) << reply;
    EXPECT_EQ(BodyOf(reply)["error"]["code"], "invalid_argument") << reply;
  }
  // A bare CR in the request line: answered too (the line is read to its end first).
  bool closed = false;
  const std::string reply = Exchange("GET /he\ralth HTTP/1.1\r\nHost: x\r\n\r\n", &closed);
  ExpectRefused(reply, closed);
  EXPECT_EQ(MessageOf(reply),
            "the request does not parse as HTTP/1.1: the request line: a CR not followed by LF (a "
            "bare CR)")
      << reply;
}

// cpp-httplib routes the path it decoded: `POST /v1/chat%2Fcompletions` was served as a chat
// completion, where a proxy in front with rules per path saw another path.
TEST_F(HttpRequestFramingTest, AnEncodedSlashInThePathIs400) {
  StartHttp(Options());
  const std::string chat = kChatBody;
  for (const std::string path : {"/v1/chat%2Fcompletions", "/v1/chat%2fcompletions",
                                 "/v1/chat%5Ccompletions", "/v1/chat%5ccompletions"}) {
    SCOPED_TRACE(path);
    bool closed = false;
    const std::string reply = Exchange(
        absl::StrCat("POST ", path,
                     " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ",
                     chat.size(), "\r\n\r\n", chat, kSmuggled),
        &closed);
    ExpectRefused(reply, closed);
    EXPECT_EQ(MessageOf(reply),
              absl::StrCat("POST \"", path,
                           "\": an encoded slash or backslash (%2F, %5C) in the path is not "
                           "accepted; send the path with / as it is"))
        << reply;
  }
  bool closed = false;
  const std::string health = Exchange("GET /health%2F HTTP/1.1\r\nHost: x\r\n\r\n", &closed);
  ExpectRefused(health, closed);
  // In the query it is no slash of the path.
  const std::string query =
      Exchange("GET /health?next=%2Fv1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(query.rfind("HTTP/1.1 200", 0), 0u) << query;
}

}  // namespace
}  // namespace lazyattn::router::http_test
