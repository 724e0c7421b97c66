// The HTTP front's request ids (completion_handler.h, HttpRequestId): every answer of a
// completion endpoint says in X-Request-Id which id its access lines and its worker calls carry;
// a client's own valid X-Request-Id is that id, as gRPC's x-request-id metadata is.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "services/router/http/http_server_test_fixture.h"

namespace lazyattn::router {
namespace {

using http_test::HttpServerTest;

// The value of the reply's X-Request-Id header ("" when it has none).
std::string RequestIdOf(const std::string& reply) {
  const std::string name = "\r\nX-Request-Id: ";
  const size_t at = reply.find(name);
  if (at == std::string::npos || at > reply.find("\r\n\r\n")) return "";
  const size_t begin = at + name.size();
  return reply.substr(begin, reply.find("\r\n", begin) - begin);
}

// `request` as written on a new connection to `port`, and the whole reply.
std::string SendRaw(int port, const std::string& request) {
  const int fd = http_test::Connect(port);
  if (fd < 0) return "(no connection)";
  const bool sent =
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size());
  std::string reply = sent ? http_test::ReadAll(fd) : "(send failed)";
  close(fd);
  return reply;
}

constexpr char kBody[] = R"({"messages": [{"role": "user", "content": "Hi?"}]})";

TEST_F(HttpServerTest, AClientsValidRequestIdIsAnsweredAndSentToTheWorker) {
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string id = "client-Id_1.2:3";
  const std::string reply = Post("/v1/chat/completions", kBody, "X-Request-Id: " + id + "\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_EQ(RequestIdOf(reply), id) << reply;
  EXPECT_EQ(worker_.request_ids(), std::vector<std::string>{id});
}

TEST_F(HttpServerTest, WithoutAUsableRequestIdTheRouterMakesOneAndSaysWhich) {
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string too_long(129, 'a');
  const std::vector<std::string> headers = {
      "",                                            // none
      "X-Request-Id: has space\r\n",                 // outside [A-Za-z0-9._:-]
      "X-Request-Id: \r\n",                          // empty
      "X-Request-Id: " + too_long + "\r\n",          // over 128
      "X-Request-Id: one\r\nx-request-id: two\r\n",  // two: neither is the request's
      // Decoded by the library into a NUL, which must not end the value (a NUL sent as such is
      // refused 400: http_request_framing_test.cc).
      "X-Request-Id: a%00b\r\n",
  };
  for (size_t i = 0; i < headers.size(); ++i) {
    SCOPED_TRACE(i);
    const std::string reply = Post("/v1/chat/completions", kBody, headers[i]);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
    const std::string id = RequestIdOf(reply);
    EXPECT_TRUE(IsValidRequestId(id)) << reply;
    for (const char* sent : {"has", "one", "two", "a"}) EXPECT_NE(id, sent);
    ASSERT_EQ(worker_.request_ids().size(), i + 1);
    EXPECT_EQ(worker_.request_ids().back(), id);
  }
  // Fresh ids differ from request to request.
  EXPECT_NE(worker_.request_ids()[0], worker_.request_ids()[1]);
}

TEST_F(HttpServerTest, EveryChoiceOfARequestCarriesItsIdAndSoDoesARefusal) {
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string reply = Post(
      "/v1/completions", R"({"prompt": "Hi?", "n": 3})", "X-Request-Id: three-choices\r\n");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_EQ(RequestIdOf(reply), "three-choices");
  EXPECT_EQ(worker_.request_ids(),
            (std::vector<std::string>{"three-choices", "three-choices", "three-choices"}));

  // Refused before any worker call: the answer still names the id the router logged it under.
  const std::string refused =
      Post("/v1/completions", R"({"prompt": 7})", "X-Request-Id: refused-1\r\n");
  EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused;
  EXPECT_EQ(RequestIdOf(refused), "refused-1") << refused;
  EXPECT_EQ(worker_.request_ids().size(), 3u);
}

// Refusals made from the request's head (its framing, its method, its key) carried no id,
// although they are answers of the endpoint too.
TEST_F(HttpServerTest, ARefusalFromTheRequestsHeadCarriesItsIdToo) {
  StartRouter();
  StartHttp(Options(), nullptr);
  auto Exchange = [this](const std::string& request) { return SendRaw(http_->port(), request); };
  const std::string unsupported = Exchange(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: head-1\r\nContent-Type: "
      "text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi");
  EXPECT_EQ(unsupported.rfind("HTTP/1.1 415", 0), 0u) << unsupported;
  EXPECT_EQ(RequestIdOf(unsupported), "head-1") << unsupported;
  const std::string no_length = Exchange(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: head-2\r\nContent-Type: "
      "application/json\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(no_length.rfind("HTTP/1.1 411", 0), 0u) << no_length;
  EXPECT_EQ(RequestIdOf(no_length), "head-2") << no_length;
  const std::string wrong_method =
      Exchange("GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(wrong_method.rfind("HTTP/1.1 405", 0), 0u) << wrong_method;
  EXPECT_FALSE(RequestIdOf(wrong_method).empty()) << wrong_method;  // one made by the router
  EXPECT_TRUE(worker_.request_ids().empty());
}

// Refusals made while the body is read (its chunked framing, its size) are answers of the endpoint
// too, and carried no id.
TEST_F(HttpServerTest, ARefusalWhileTheBodyIsReadCarriesItsId) {
  StartRouter();
  HttpOptions options = Options();
  options.max_body_bytes = 64;
  StartHttp(options, nullptr);
  auto Exchange = [this](const std::string& request) { return SendRaw(http_->port(), request); };
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\nConnection: close\r\n";
  const std::string malformed =
      Exchange(head + "X-Request-Id: body-1\r\n\r\nzz\r\n{}\r\n0\r\n\r\n");
  EXPECT_EQ(malformed.rfind("HTTP/1.1 400", 0), 0u) << malformed;
  EXPECT_EQ(RequestIdOf(malformed), "body-1") << malformed;
  const std::string chunk(100, ' ');
  const std::string too_large =
      Exchange(head + "X-Request-Id: body-2\r\n\r\n64\r\n" + chunk + "\r\n0\r\n\r\n");
  EXPECT_EQ(too_large.rfind("HTTP/1.1 413", 0), 0u) << too_large;
  EXPECT_EQ(RequestIdOf(too_large), "body-2") << too_large;
  const std::string unnamed = Exchange(head + "\r\n64\r\n" + chunk + "\r\n0\r\n\r\n");
  EXPECT_EQ(unnamed.rfind("HTTP/1.1 413", 0), 0u) << unnamed;
  EXPECT_TRUE(IsValidRequestId(RequestIdOf(unnamed))) << unnamed;  // one made by the router
  EXPECT_TRUE(worker_.request_ids().empty());
}

}  // namespace
}  // namespace lazyattn::router
