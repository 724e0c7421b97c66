// What the HTTP listener does with a request's head before any handler answers it, over real
// sockets on 127.0.0.1 in front of a router with a fake worker: headers (and a chunked body's size
// line) sent without end are cut at a byte cap, not buffered until the header timeout; a request
// answered without its body being read closes its connection, so the body cannot be read as a
// second request (CL.0 desync), whoever answered it (the library's own 414, 416 and 400 included);
// Range is not served; only JSON bodies are read; the messages about max_tokens, huge numbers and
// unknown models quote what the client sent; an unknown path names no field; a wrong method is
// a 405; and a header name that is no token is a 400 that closes the connection. The API key checks
// made from the head: http_request_keys_test.cc.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "services/router/http/http_request_head_test_fixture.h"
#include "services/router/http/http_server.h"
#include "services/router/http/raw_http_client_for_test.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router::http_test {
namespace {

using testing::CountResponses;
using testing::ReadHead;
using testing::ReadResponse;

// What came back while a sender thread streamed bytes at the router, until it closed.
struct FloodResult {
  std::string head;       // the response's head
  bool closed = false;    // the router closed the connection after it
  int64_t sent_at_reply;  // bytes sent when the head had come
  int64_t sent_total;     // bytes sent in all
};

constexpr int64_t kFloodBytes = int64_t{64} << 20;

// Sends `start`, then `unit` over and over (up to kFloodBytes) until the router stops taking
// them, while reading what it answers.
FloodResult Flood(int port, const std::string& start, const std::string& unit) {
  const int fd = Connect(port);
  FloodResult r;
  if (fd < 0) return r;
  std::atomic<int64_t> sent{0};
  std::thread sender([&] {
    if (!SendAll(fd, start)) return;
    std::string batch;
    while (batch.size() < (64 << 10)) batch += unit;
    while (sent.load() < kFloodBytes) {
      if (!SendAll(fd, batch)) return;
      sent += static_cast<int64_t>(batch.size());
    }
  });
  r.head = ReadHead(fd);
  r.sent_at_reply = sent.load();
  ReadAll(fd, &r.closed);
  // The router is gone: unblock a sender stuck in a full socket buffer.
  shutdown(fd, SHUT_RDWR);
  sender.join();
  r.sent_total = sent.load();
  close(fd);
  return r;
}

// Header lines sent for ever made the library store every one until the header timeout (~20 bytes
// of memory per byte sent); now the head is cut at http.max_header_bytes: 431, then closed.
TEST_F(HttpRequestHeadTest, HeadersBeyondTheCapAre431AndTheConnectionClosed) {
  StartHttp(Options());  // the default cap, 64 KiB
  const FloodResult r = Flood(http_->port(), "POST /v1/models HTTP/1.1\r\n", "a:b\r\n");
  EXPECT_EQ(r.head.rfind("HTTP/1.1 431", 0), 0u) << r.head;
  EXPECT_NE(r.head.find("Connection: close"), std::string::npos) << r.head;
  EXPECT_TRUE(r.closed);
  // Answered after about the cap (plus what the sockets' buffers hold), and cut off before the
  // sender's 64 MiB were all sent: the router never took them.
  EXPECT_LT(r.sent_at_reply, int64_t{32} << 20);
  EXPECT_LT(r.sent_total, kFloodBytes);

  // The error body names the key; a request line longer than the cap is closed unanswered.
  std::string head = "GET /v1/models HTTP/1.1\r\nHost: x\r\n";
  while (head.size() < (80 << 10)) head += "X-Pad: 0123456789abcdef0123456789abcdef\r\n";
  bool closed = false;
  std::string reply = Exchange(head + "\r\n", &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 431", 0), 0u) << reply.substr(0, 200);
  EXPECT_NE(reply.find("http.max_header_bytes (65536 bytes)"), std::string::npos) << reply;
  EXPECT_EQ(BodyOf(reply)["error"]["type"], "invalid_request_error") << reply;
  EXPECT_TRUE(closed);
  {
    // The router may close before the client has sent it all: the send's result is no matter.
    const int fd = Connect(http_->port());
    ASSERT_GE(fd, 0);
    (void)SendAll(fd, "GET /" + std::string(100 << 10, 'a') + " HTTP/1.1\r\n\r\n");
    closed = false;
    reply = ReadAll(fd, &closed);
    close(fd);
    EXPECT_EQ(reply, "");
    EXPECT_TRUE(closed);
  }

  // Headers within the cap are served, also when the cap is set lower.
  HttpOptions o = Options();
  o.max_header_bytes = 16 << 10;
  http_.reset();
  StartHttp(o);
  std::string within = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  while (within.size() < (15 << 10)) within += "X-Pad: 0123456789abcdef0123456789abcdef\r\n";
  reply = Exchange(within + "\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 200);
  reply = Exchange(head + "\r\n");
  EXPECT_NE(reply.find("http.max_header_bytes (16384 bytes)"), std::string::npos) << reply;
}

// The library grows a chunk-size line until its '\n' (and reads it only within the body timeout,
// here 60 s): a line past 4 KiB ends the body, 400, and the connection is closed.
TEST_F(HttpRequestHeadTest, AChunkSizeLineWithoutEndIsCutOff) {
  StartHttp(Options());
  const FloodResult r =
      Flood(http_->port(),
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n1;ext=",
            "abcdefgh");
  EXPECT_EQ(r.head.rfind("HTTP/1.1 400", 0), 0u) << r.head;
  EXPECT_NE(r.head.find("Connection: close"), std::string::npos) << r.head;
  EXPECT_TRUE(r.closed);
  EXPECT_LT(r.sent_at_reply, int64_t{32} << 20);
  EXPECT_LT(r.sent_total, kFloodBytes);

  // A chunked body in chunks of 1 to 3 bytes (the last byte of each is a one-byte read, as a
  // line's bytes are) is read as before.
  const std::string body = kChatBody;
  std::string chunks;
  for (size_t i = 0, n = 1; i < body.size(); i += n, n = n % 3 + 1) {
    const std::string piece = body.substr(i, n);
    absl::StrAppend(&chunks, absl::Hex(piece.size()), "\r\n", piece, "\r\n");
  }
  const std::string reply = Exchange(
      absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   "application/json\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
                   chunks, "0\r\n\r\n"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
}

// Each request carries kSmuggled as its body. Answered without that body being read, the
// connection must close: kept alive, the router read the body as a second request and answered
// it too (two responses on one connection).
TEST_F(HttpRequestHeadTest, ARequestAnsweredWithoutReadingItsBodyClosesTheConnection) {
  StartHttp(Options());
  const std::string body = kSmuggled;
  const std::string length = absl::StrCat("Content-Length: ", body.size(), "\r\n");
  struct Case {
    const char* what;
    std::string head;
    const char* status;
  };
  const std::vector<Case> cases = {
      {"URI over 8 KiB (the library's 414)",
       absl::StrCat("POST /v1/chat/completions?", std::string(9000, 'a'),
                    " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", length),
       "HTTP/1.1 414"},
      {"Range it cannot parse (the library's 416)",
       absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nRange: bytes=abc\r\n",
                    length),
       "HTTP/1.1 416"},
      {"header line over 8 KiB (the library's 400)",
       absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\n",
                    length, "X-Big: ", std::string(9000, 'b'), "\r\n"),
       "HTTP/1.1 400"},
      {"multipart body (the library's parser threw: 500)",
       absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "multipart/form-data; boundary=x\r\n",
                    length),
       "HTTP/1.1 415"},
      {"form body",
       absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/x-www-form-urlencoded\r\n",
                    length),
       "HTTP/1.1 415"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    bool closed = false;
    const std::string reply = Exchange(c.head + "\r\n" + body, &closed);
    EXPECT_EQ(reply.rfind(c.status, 0), 0u) << reply.substr(0, 300);
    EXPECT_EQ(CountResponses(reply), 1) << reply.substr(0, 600);
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply.substr(0, 300);
    EXPECT_TRUE(closed);
  }
}

// cpp-httplib keeps a header's name up to the colon as it comes: `Transfer-Encoding : chunked`
// was stored under "Transfer-Encoding ", so the router framed the body by its Content-Length,
// answered 400 with the connection kept, and served the chunked body's hidden request as a second
// one (a proxy that trims the name frames it as chunked). A name that is no token is refused now,
// the connection closed.
TEST_F(HttpRequestHeadTest, AHeaderNameThatIsNoTokenIs400AndClosesTheConnection) {
  StartHttp(Options());
  // A chunked body holding a whole second request, which a Content-Length of 4 cuts short.
  const std::string smuggled = kSmuggled;
  const std::string chunked =
      absl::StrCat(absl::Hex(smuggled.size()), "\r\n", smuggled, "\r\n0\r\n\r\n");
  struct Case {
    const char* what;
    std::string header;
    const char* quoted;
  };
  const std::vector<Case> cases = {
      {"space before the colon", "Transfer-Encoding : chunked", "\"Transfer-Encoding \""},
      {"tab before the colon", "Transfer-Encoding\t: chunked", "\"Transfer-Encoding\\x09\""},
      {"a separator in the name", "Content(Length): 4", "\"Content(Length)\""},
      {"a NUL in the name", std::string("X-A\0B: 1", 8), "\"X-A\\x00B\""},
      {"a control byte in the name",
       std::string("X-A\x01"
                   "B: 1"),
       "\"X-A\\x01B\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    bool closed = false;
    const std::string reply =
        Exchange(absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                              "application/json\r\nX-Request-Id: bad-name\r\n",
                              c.header, "\r\nContent-Length: 4\r\n\r\n", chunked),
                 &closed);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply.substr(0, 300);
    EXPECT_EQ(CountResponses(reply), 1) << reply.substr(0, 600);
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply.substr(0, 300);
    EXPECT_NE(reply.find("X-Request-Id: bad-name"), std::string::npos) << reply.substr(0, 300);
    EXPECT_TRUE(closed);
    EXPECT_EQ(BodyOf(reply)["error"]["message"],
              absl::StrCat("header ", c.quoted,
                           ": not a valid field name (RFC 9110: a token, with no whitespace "
                           "before the colon)"))
        << reply;
  }
  // The same on a path with no body to read.
  bool closed = false;
  const std::string health =
      Exchange("GET /health HTTP/1.1\r\nHost: x\r\nX-Forwarded-For : 1.2.3.4\r\n\r\n", &closed);
  EXPECT_EQ(health.rfind("HTTP/1.1 400", 0), 0u) << health;
  EXPECT_TRUE(closed);
  // Names of every token character are served.
  const std::string fine = Exchange(
      "GET /health HTTP/1.1\r\nHost: x\r\nX-!#$%&'*+-.^_`|~09az: 1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(fine.rfind("HTTP/1.1 200", 0), 0u) << fine;
}

// `close` among a Connection header's options closes the connection after the answer, as a lone
// `close` does (the library compared the whole value, so these connections stayed open).
TEST_F(HttpRequestHeadTest, CloseAmongConnectionOptionsClosesTheConnection) {
  StartHttp(Options());
  for (const char* connection : {"keep-alive, close", "Close", "te,close"}) {
    SCOPED_TRACE(connection);
    bool closed = false;
    const std::string reply = Exchange(
        absl::StrCat("GET /health HTTP/1.1\r\nHost: x\r\nConnection: ", connection, "\r\n\r\n"),
        &closed);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
    EXPECT_TRUE(closed);
  }
  // Kept alive otherwise: a second request on the same connection is answered.
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  const std::string keep = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
  ASSERT_TRUE(SendAll(fd, keep + keep));
  for (int i = 0; i < 2; ++i) {
    const std::string reply = ReadResponse(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << i << ": " << reply;
  }
  close(fd);
}

// RFC 9112 3.2: an HTTP/1.1 request needs exactly one Host header; HTTP/1.0 may omit it.
TEST_F(HttpRequestHeadTest, AnHttp11RequestWithoutOneHostIs400) {
  StartHttp(Options());
  const std::string body = kChatBody;
  for (const auto& [head, message] :
       {std::pair{std::string("GET /health HTTP/1.1\r\n"), "Host: required in an HTTP/1.1 request"},
        std::pair{std::string("GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n"),
                  "Host: given more than once"},
        std::pair{absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nContent-Type: "
                               "application/json\r\nContent-Length: ",
                               body.size(), "\r\n"),
                  "Host: required in an HTTP/1.1 request"}}) {
    SCOPED_TRACE(head);
    bool closed = false;
    const std::string reply = Exchange(absl::StrCat(head, "\r\n", body), &closed);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    EXPECT_EQ(BodyOf(reply)["error"]["message"], message) << reply;
    EXPECT_EQ(CountResponses(reply), 1) << reply;  // the body is not read as a next request
    EXPECT_TRUE(closed);
  }
  const std::string http10 = Exchange("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(http10.rfind("HTTP/1.1 200", 0), 0u) << http10;
}

// Every Content-Length counts: a GET with `Content-Length: 0` and a second one announcing a body
// kept its connection, and the body (to a front proxy that reads the last length, part of this
// request) was read as the next request.
TEST_F(HttpRequestHeadTest, ASecondContentLengthIsABodyAndClosesTheConnection) {
  StartHttp(Options());
  const std::string body = kSmuggled;
  for (const char* path : {"/health", "/v1/models", "/v1/chat/completions"}) {
    SCOPED_TRACE(path);
    bool closed = false;
    const std::string reply = Exchange(
        absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: ",
                     body.size(), "\r\n\r\n", body),
        &closed);
    EXPECT_EQ(CountResponses(reply), 1) << reply.substr(0, 600);
    EXPECT_TRUE(closed);
  }
}

// A JSON-only endpoint refuses another body type before reading it, in OpenAI's error shape; a
// JSON type with parameters, and no type at all, are served.
TEST_F(HttpRequestHeadTest, OnlyJsonBodiesAreRead) {
  StartHttp(Options());
  const std::string body = kChatBody;
  auto post = [&](const std::string& type_header) {
    return Exchange(absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", type_header,
                                 "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n",
                                 body));
  };
  const int calls = worker_.generate_calls();
  const std::string refused = post("Content-Type: multipart/form-data; boundary=x\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 415", 0), 0u) << refused;
  const nlohmann::json error = BodyOf(refused)["error"];
  EXPECT_EQ(error["type"], "invalid_request_error") << refused;
  EXPECT_EQ(error["code"], "unsupported_media_type") << refused;
  EXPECT_EQ(error["message"],
            "Content-Type: expected application/json, got \"multipart/form-data; boundary=x\"");
  EXPECT_EQ(worker_.generate_calls(), calls);
  for (const char* ok : {"Content-Type: application/json; charset=utf-8\r\n", ""}) {
    const std::string reply = post(ok);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << ok << reply;
  }
}

// A valid Range made a non-streamed completion a 206 with a slice of its JSON; Range is ignored
// now, and the whole response comes back.
TEST_F(HttpRequestHeadTest, RangeIsIgnored) {
  StartHttp(Options());
  const std::string body = kChatBody;
  const std::string reply = Exchange(absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Range: bytes=0-9\r\nConnection: close\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body));
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_EQ(reply.find("Content-Range"), std::string::npos) << reply;
  EXPECT_EQ(BodyOf(reply)["object"], "chat.completion") << reply;
  const std::string head = Exchange(
      "HEAD /v1/models HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_NE(head.find("Accept-Ranges: none"), std::string::npos) << head;
  EXPECT_EQ(head.find("Accept-Ranges: bytes"), std::string::npos) << head;
}

// A 404 for a path that is no endpoint names no field: its `param` was whatever the message began
// with up to a colon, the client's path ("https" for an absolute-form target).
TEST_F(HttpRequestHeadTest, AnUnknownPathNamesNoField) {
  StartHttp(Options());
  for (const char* target : {"https://evil/v1/models", "foo:%20bar", "/v1/nowhere"}) {
    SCOPED_TRACE(target);
    const std::string reply =
        Exchange(absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    EXPECT_EQ(reply.rfind("HTTP/1.1 404", 0), 0u) << reply;
    const nlohmann::json error = BodyOf(reply)["error"];
    EXPECT_EQ(error["code"], "not_found") << reply;
    EXPECT_TRUE(error["param"].is_null()) << reply;
  }
}

// What the library could not parse (a request line of another version, a bare LF) is answered
// 400 with a message that says so, naming no field; a chunked body with trailer fields names
// `body` and says they are not accepted.
TEST_F(HttpRequestHeadTest, WhatDoesNotParseAsHttp11IsSaidSo) {
  StartHttp(Options());
  const std::string trailer = Exchange(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: 1\r\n\r\n");
  EXPECT_EQ(trailer.rfind("HTTP/1.1 400", 0), 0u) << trailer;
  EXPECT_EQ(BodyOf(trailer)["error"]["param"], "body") << trailer;
  EXPECT_NE(BodyOf(trailer)["error"]["message"].get<std::string>().find("trailer fields"),
            std::string::npos)
      << trailer;
  for (const std::string& request : {std::string("GET /health HTTP/2.0\r\nHost: x\r\n\r\n"),
                                     std::string("GET /health HTTP/1.1\nHost: x\n\n")}) {
    SCOPED_TRACE(request);
    const std::string reply = Exchange(request);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    const nlohmann::json error = BodyOf(reply)["error"];
    EXPECT_EQ(error["code"], "invalid_argument") << reply;
    EXPECT_TRUE(error["param"].is_null()) << reply;
    EXPECT_EQ(
        error["message"].get<std::string>().rfind("the request does not parse as HTTP/1.1", 0), 0u)
        << reply;
  }
  // A header line over the library's line limit (a long bearer token, say) is one that does not
  // parse; the message says the limit, which nothing else would tell the client.
  const std::string long_line = Exchange(absl::StrCat(
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", std::string(8300, 'b'), "\r\n\r\n"));
  EXPECT_EQ(long_line.rfind("HTTP/1.1 400", 0), 0u) << long_line.substr(0, 300);
  EXPECT_NE(BodyOf(long_line)["error"]["message"].get<std::string>().find(
                "or a header line (each at most 8192 bytes)"),
            std::string::npos)
      << long_line.substr(0, 600);
  // A Range the library cannot parse: its 416 says so (it said "HTTP status 416 for ...").
  const std::string range = Exchange(
      "GET /health HTTP/1.1\r\nHost: x\r\nRange: bytes=abc\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(range.rfind("HTTP/1.1 416", 0), 0u) << range;
  EXPECT_EQ(BodyOf(range)["error"]["message"],
            "Range: does not parse (the router serves no ranges; send none)")
      << range;
  EXPECT_EQ(BodyOf(range)["error"]["code"], "range_not_satisfiable") << range;
}

// An unknown model is quoted as any string the client sent, cut to 32 bytes (it was quoted to
// the router's 64, or to 128 bytes by GET /v1/models/{id}).
TEST_F(HttpRequestHeadTest, AnUnknownModelIsQuotedCutShort) {
  StartHttp(Options());
  const std::string model(200, 'm');
  const std::string body = absl::StrCat(R"({"model": ")", model,
                                        R"(", "messages": [{"role": "user", "content": "Hi?"}]})");
  const std::string retrieve =
      absl::StrCat("GET /v1/models/", model, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  for (const std::string& request : {ChatHead("", body.size()) + body, retrieve}) {
    SCOPED_TRACE(request.substr(0, 20));
    const std::string reply = Exchange(request);
    EXPECT_EQ(reply.rfind("HTTP/1.1 404", 0), 0u) << reply;
    const nlohmann::json error = BodyOf(reply)["error"];
    EXPECT_EQ(error["code"], "model_not_found") << reply;
    EXPECT_EQ(error["param"], "model") << reply;
    const std::string message = error.value("message", "");
    EXPECT_EQ(
        message.rfind(absl::StrCat("model: \"", std::string(32, 'm'), "...\" is not served"), 0),
        0u)
        << message;
  }
  // The ids served, as GET /v1/models lists them.
  const std::string reply = Exchange(ChatHead("", body.size()) + body);
  EXPECT_NE(reply.find("served: fake-model (GET /v1/models lists them)"), std::string::npos)
      << reply;
}

// The 400s about max_tokens name the field the client used and quote the value it sent (a value
// beyond int32 was quoted as 2147483647, max_completion_tokens named max_tokens), and a number
// beyond a double's range is named as sent (it was "body: not valid JSON").
TEST_F(HttpRequestHeadTest, ErrorsQuoteTheFieldAndTheValueAsSent) {
  StartHttp(Options());
  const std::string user = R"({"messages": [{"role": "user", "content": "Hi?"}], )";
  struct Case {
    std::string fields;
    const char* param;
    const char* message;
  };
  for (const Case& c :
       std::vector<Case>{{R"("max_tokens": 10000000000})", "max_tokens",
                          "max_tokens: 10000000000 outside [1, 4096]"},
                         {R"("max_completion_tokens": 5000})", "max_completion_tokens",
                          "max_completion_tokens: 5000 outside [1, 4096]"},
                         {R"("n": 1e400})", "n", "n: 1e400 is out of range"}}) {
    SCOPED_TRACE(c.fields);
    const std::string body = user + c.fields;
    const std::string reply = Exchange(absl::StrCat(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Connection: close\r\nContent-Length: ",
        body.size(), "\r\n\r\n", body));
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    const nlohmann::json error = BodyOf(reply)["error"];
    EXPECT_EQ(error["param"], c.param) << reply;
    EXPECT_EQ(error["message"].get<std::string>().rfind(c.message, 0), 0u) << reply;
  }
}

// An endpoint asked with a method it does not take is a 405 naming the methods it does (Allow),
// not a 404 saying the endpoint does not exist; a path that is no endpoint stays a 404. The
// library's 414 says what was too long (its message quoted an empty path).
TEST_F(HttpRequestHeadTest, WrongMethodIs405AndLongUriIsNamed) {
  StartHttp(Options());
  struct Case {
    std::string request;  // its line and the headers that differ
    const char* status;
    const char* allow;  // null: no Allow header
    const char* code;
  };
  const std::string body = kChatBody;
  const std::string length = absl::StrCat("Content-Length: ", body.size(), "\r\n");
  for (const Case& c : std::vector<Case>{
           {"GET /v1/chat/completions HTTP/1.1\r\n", "HTTP/1.1 405", "Allow: POST",
            "method_not_allowed"},
           {"GET /v1/completions?stream=true HTTP/1.1\r\n", "HTTP/1.1 405", "Allow: POST",
            "method_not_allowed"},
           // The library itself answered TRACE 400 and OPTIONS 404.
           {"TRACE /v1/chat/completions HTTP/1.1\r\n", "HTTP/1.1 405", "Allow: POST",
            "method_not_allowed"},
           {"OPTIONS /v1/models HTTP/1.1\r\n", "HTTP/1.1 405", "Allow: GET, HEAD",
            "method_not_allowed"},
           // With a body it does not read, kept alive or not: closed after the answer.
           {absl::StrCat("POST /v1/models HTTP/1.1\r\n", length), "HTTP/1.1 405",
            "Allow: GET, HEAD", "method_not_allowed"},
           {absl::StrCat("PUT /v1/models/fake-model HTTP/1.1\r\n", length), "HTTP/1.1 405",
            "Allow: GET, HEAD", "method_not_allowed"},
           {"DELETE /health HTTP/1.1\r\nContent-Length: 0\r\n", "HTTP/1.1 405", "Allow: GET, HEAD",
            "method_not_allowed"},
           {"GET /v1/models/ HTTP/1.1\r\n", "HTTP/1.1 404", nullptr, "not_found"},
           {"GET /v1/nowhere HTTP/1.1\r\n", "HTTP/1.1 404", nullptr, "not_found"},
           {absl::StrCat("GET /v1/models?", std::string(9000, 'a'), " HTTP/1.1\r\n"),
            "HTTP/1.1 414", nullptr, "uri_too_long"}}) {
    SCOPED_TRACE(c.request.substr(0, 40));
    const bool has_body = c.request.find(length) != std::string::npos;
    bool closed = false;
    // A request with a body asks to keep the connection: the router must close it anyway.
    const std::string reply =
        Exchange(absl::StrCat(c.request, "Host: x\r\n", has_body ? "" : "Connection: close\r\n",
                              "\r\n", has_body ? body : ""),
                 &closed);
    EXPECT_EQ(reply.rfind(c.status, 0), 0u) << reply.substr(0, 300);
    const size_t head_end = reply.find("\r\n\r\n");
    const std::string head = reply.substr(0, head_end);
    EXPECT_EQ(head.find("\r\nAllow: ") != std::string::npos, c.allow != nullptr) << head;
    if (c.allow != nullptr) {
      EXPECT_NE(head.find(c.allow), std::string::npos) << head;
    }
    const nlohmann::json error = BodyOf(reply)["error"];
    EXPECT_EQ(error["code"], c.code) << reply.substr(0, 600);
    EXPECT_EQ(error["type"], c.status == std::string("HTTP/1.1 404") ? "not_found_error"
                                                                     : "invalid_request_error");
    EXPECT_EQ(CountResponses(reply), 1);
    EXPECT_TRUE(closed);
    EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
    EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
    if (c.code == std::string("uri_too_long")) {
      EXPECT_EQ(error["message"], "the request line is longer than 8192 bytes") << reply;
    }
  }
  // HEAD gets the same 405, without a body.
  const std::string head_reply =
      Exchange("HEAD /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(head_reply.rfind("HTTP/1.1 405", 0), 0u) << head_reply;
  EXPECT_NE(head_reply.find("Allow: POST"), std::string::npos) << head_reply;
}

// An HTTP/1.0 request that does not ask to keep its connection has it closed after the answer
// (by the library): the answer says `Connection: close`, not the library's Keep-Alive.
TEST_F(HttpRequestHeadTest, AnHttp10AnswerSaysItCloses) {
  StartHttp(Options());
  bool closed = false;
  const std::string reply = Exchange("GET /health HTTP/1.0\r\nHost: x\r\n\r\n", &closed);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  const std::string head = reply.substr(0, reply.find("\r\n\r\n"));
  EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
  EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
  EXPECT_TRUE(closed);
}

// HTTP/1.0 has no chunked encoding: a stream asked over it came back chunked, which such a client
// reads as garbage. It is sent as it comes, ended by closing the connection, kept-alive or not;
// over HTTP/1.1 it stays chunked.
TEST_F(HttpRequestHeadTest, AStreamOverHttp10EndsAtCloseNotInChunks) {
  StartHttp(Options());
  const std::string body =
      R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8, "stream": true})";
  for (const char* version_and_connection :
       {"HTTP/1.0\r\n", "HTTP/1.0\r\nConnection: Keep-Alive\r\n",
        "HTTP/1.1\r\nConnection: close\r\n"}) {
    SCOPED_TRACE(version_and_connection);
    const bool http10 = absl::StartsWith(version_and_connection, "HTTP/1.0");
    bool closed = false;
    const std::string reply = Exchange(
        absl::StrCat("POST /v1/chat/completions ", version_and_connection,
                     "Host: x\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                     "\r\n\r\n", body),
        &closed);
    const size_t head_end = reply.find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << reply;
    const std::string head = reply.substr(0, head_end);
    EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
    EXPECT_NE(head.find("Content-Type: text/event-stream"), std::string::npos) << head;
    EXPECT_EQ(head.find("Transfer-Encoding: chunked") != std::string::npos, !http10) << head;
    EXPECT_EQ(head.find("Content-Length"), std::string::npos) << head;
    if (http10) {
      EXPECT_NE(head.find("\r\nConnection: close"), std::string::npos) << head;
      EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
      // The body is the events themselves, with no chunk sizes between them.
      const std::string events = reply.substr(head_end + 4);
      EXPECT_EQ(events.rfind("data: {", 0), 0u) << events;
      EXPECT_TRUE(absl::EndsWith(events, "data: [DONE]\n\n")) << events;
      EXPECT_TRUE(closed);
    } else {
      EXPECT_TRUE(absl::EndsWith(reply, "0\r\n\r\n")) << reply;  // the last chunk
    }
  }
}

}  // namespace
}  // namespace lazyattn::router::http_test
