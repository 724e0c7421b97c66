// The API key checks the HTTP listener makes from a request's head, over real sockets on
// 127.0.0.1 in front of a router with a fake worker: HEAD takes GET's key check; the Authorization
// header is checked whole; and the key is checked before a body is invited with 100 Continue,
// for that request only.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/router/http/api_key_file_for_test.h"
#include "services/router/http/http_request_head_test_fixture.h"

namespace lazyattn::router::http_test {
namespace {

using testing::KeyFile;
using testing::ReadHead;
using testing::RejectAll;

// cpp-httplib serves HEAD with the GET handler: HEAD /v1/models skipped the key check (and the
// key's rate limit) that GET /v1/models has. Both are refused without a key now, for the list and
// for one model of it; /health stays open.
TEST_F(HttpRequestHeadTest, HeadNeedsTheKeyGetNeeds) {
  StartHttp(Options(), std::make_shared<RejectAll>());
  for (const char* method : {"GET", "HEAD"}) {
    SCOPED_TRACE(method);
    for (const char* path : {"/v1/models", "/v1/models/fake-model", "/v1/models/unknown"}) {
      SCOPED_TRACE(path);
      const std::string reply = Exchange(
          absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
      EXPECT_EQ(reply.rfind("HTTP/1.1 401", 0), 0u) << reply;
      EXPECT_NE(reply.find("WWW-Authenticate: Bearer"), std::string::npos) << reply;
    }
    const std::string health =
        Exchange(absl::StrCat(method, " /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  }
}

// cpp-httplib hands a header's value to get_header_value's callers as a C string, so a NUL cut
// `Authorization: Bearer <key>\0<anything>` to the key, which was admitted. The whole value is
// checked now: it is no key's, 401 as for any wrong key.
TEST_F(HttpRequestHeadTest, AnAuthorizationValueIsCheckedWhole) {
  KeyFile keys;
  StartHttp(Options(), keys.processor());
  const std::string models = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  const std::string good = Exchange(models + "Authorization: Bearer lzk_good\r\n\r\n");
  EXPECT_EQ(good.rfind("HTTP/1.1 200", 0), 0u) << good;
  const std::string wrong = Exchange(models + "Authorization: Bearer lzk_bad\r\n\r\n");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 401", 0), 0u) << wrong;
  // A NUL after a good key would end the value for get_header_value; neither a NUL sent as such
  // nor one percent-encoded (cpp-httplib decodes header values) reaches the key check: both are
  // refused with the request's head (head_line_checker.h).
  const std::string raw_nul = Exchange(models + "Authorization: Bearer lzk_good" +
                                       std::string(1, '\0') + "whatever\r\n\r\n");
  EXPECT_EQ(raw_nul.rfind("HTTP/1.1 400", 0), 0u) << raw_nul;
  EXPECT_NE(raw_nul.find("a NUL byte in its value"), std::string::npos) << raw_nul;
  const std::string encoded_nul =
      Exchange(models + "Authorization: Bearer lzk_good%00whatever\r\n\r\n");
  EXPECT_EQ(encoded_nul.rfind("HTTP/1.1 400", 0), 0u) << encoded_nul;
  EXPECT_NE(encoded_nul.find("a '%' in its value"), std::string::npos) << encoded_nul;
  // The header's name in any case, as HTTP has it.
  const std::string lower = Exchange(models + "authorization: Bearer lzk_good\r\n\r\n");
  EXPECT_EQ(lower.rfind("HTTP/1.1 200", 0), 0u) << lower;
}

// A client that sent Authorization in another form was told it was "missing", in gRPC's words
// ("metadata"); the message now says what is wrong with what came, and "missing" only when
// nothing did. A second credential under a name with a space before its colon is refused as a
// name that is no token (http_request_head_test.cc), not served on the first.
TEST_F(HttpRequestHeadTest, ARefusedAuthorizationSaysWhatCame) {
  KeyFile keys;
  StartHttp(Options(), keys.processor());
  const std::string models = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  for (const char* value : {"Basic bHprX2dvb2Q6", "Bearer", "Bearer ", "lzk_good"}) {
    SCOPED_TRACE(value);
    const std::string reply = Exchange(models + "Authorization: " + value + "\r\n\r\n");
    EXPECT_EQ(reply.rfind("HTTP/1.1 401", 0), 0u) << reply;
    EXPECT_EQ(BodyOf(reply)["error"]["message"],
              "authorization: not of the form `Bearer <API key>`; send `authorization: Bearer "
              "<API key>` (lazyattn client: --api-key or LAZYATTN_API_KEY)")
        << reply;
  }
  const std::string none = Exchange(models + "\r\n");
  EXPECT_EQ(none.rfind("HTTP/1.1 401", 0), 0u) << none;
  EXPECT_EQ(BodyOf(none)["error"]["message"],
            "authorization: missing; send `authorization: Bearer <API key>` (lazyattn client: "
            "--api-key or LAZYATTN_API_KEY)")
      << none;
  const std::string second =
      Exchange(models + "Authorization: Bearer lzk_good\r\nAuthorization : Bearer lzk_bad\r\n\r\n");
  EXPECT_EQ(second.rfind("HTTP/1.1 400", 0), 0u) << second;
}

// The key is checked before the body is read, `Expect: 100-continue` included: a client without
// a valid key was invited to send its body (100 Continue), which was read before the 401. It
// gets the 401 at once now, the same as without Expect; a valid key is invited, and counted
// against its rate once, not once per check.
TEST_F(HttpRequestHeadTest, ExpectContinueChecksTheKeyFirst) {
  KeyFile keys;
  StartHttp(Options(), keys.processor());
  const std::string body = kChatBody;
  const std::string expect = "Expect: 100-continue\r\n";
  for (const char* key : {"", "Authorization: Bearer lzk_bad\r\n"}) {
    SCOPED_TRACE(key);
    const std::string plain = Exchange(ChatHead(key, body.size()) + body);
    ASSERT_EQ(plain.rfind("HTTP/1.1 401", 0), 0u) << plain;
    const int fd = Connect(http_->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, ChatHead(key + expect, body.size())));
    bool closed = false;
    const std::string reply = ReadAll(fd, &closed);
    close(fd);
    EXPECT_EQ(reply.rfind("HTTP/1.1 401", 0), 0u) << reply;
    EXPECT_EQ(reply.find("100 Continue"), std::string::npos) << reply;
    EXPECT_NE(reply.find("WWW-Authenticate: Bearer"), std::string::npos) << reply;
    EXPECT_EQ(BodyOf(reply), BodyOf(plain)) << reply;
    EXPECT_TRUE(closed);
  }
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, ChatHead("Authorization: Bearer lzk_once\r\n" + expect, body.size())));
  EXPECT_EQ(ReadHead(fd).rfind("HTTP/1.1 100 Continue", 0), 0u);
  ASSERT_TRUE(SendAll(fd, body));
  const std::string served = ReadAll(fd);
  close(fd);
  EXPECT_EQ(served.rfind("HTTP/1.1 200", 0), 0u) << served;
  // Its one request is spent: the next is refused by its rate, before its body.
  const std::string next =
      Exchange(ChatHead("Authorization: Bearer lzk_once\r\n" + expect, body.size()));
  EXPECT_EQ(next.rfind("HTTP/1.1 429", 0), 0u) << next;
  // A body no endpoint reads is not invited either; the refusal is in OpenAI's shape. That holds
  // for endpoints that take a request without a body too (with a valid key, and without one where
  // none is needed).
  const std::string good = "Authorization: Bearer lzk_good\r\n";
  for (const auto& [line, status] : {std::pair{"POST /v1/nowhere HTTP/1.1\r\n", "HTTP/1.1 404"},
                                     std::pair{"POST /v1/models HTTP/1.1\r\n", "HTTP/1.1 405"},
                                     std::pair{"GET /v1/models HTTP/1.1\r\n", "HTTP/1.1 400"},
                                     std::pair{"GET /health HTTP/1.1\r\n", "HTTP/1.1 400"}}) {
    SCOPED_TRACE(line);
    const std::string reply = Exchange(absl::StrCat(
        line, "Host: x\r\n", good, expect, "Content-Length: 5\r\nConnection: close\r\n\r\n"));
    EXPECT_EQ(reply.rfind(status, 0), 0u) << reply;
    EXPECT_EQ(reply.find("100 Continue"), std::string::npos) << reply;
    EXPECT_TRUE(BodyOf(reply)["error"].is_object()) << reply;
  }
}

// A request admitted by the `Expect: 100-continue` check is not checked again when it is routed;
// that must never carry over to the next request of the connection: a request without a key
// after it, kept alive or pipelined, is refused.
TEST_F(HttpRequestHeadTest, AKeyCheckedBeforeContinueCoversOnlyItsOwnRequest) {
  KeyFile keys;
  StartHttp(Options(), keys.processor());
  const std::string body = kChatBody;
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                       "Content-Type: application/json\r\n"
                                       "Authorization: Bearer lzk_good\r\n"
                                       "Expect: 100-continue\r\nContent-Length: ",
                                       body.size(), "\r\n\r\n")));
  EXPECT_EQ(ReadHead(fd).rfind("HTTP/1.1 100 Continue", 0), 0u);
  // The body, and right behind it a keyless request on the same connection.
  ASSERT_TRUE(
      SendAll(fd, body + "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string replies = ReadAll(fd);
  close(fd);
  EXPECT_EQ(replies.rfind("HTTP/1.1 200", 0), 0u) << replies;
  const size_t second = replies.find("HTTP/1.1 ", 1);
  ASSERT_NE(second, std::string::npos) << replies;
  EXPECT_EQ(replies.compare(second, 12, "HTTP/1.1 401"), 0) << replies.substr(second);
}

// The key's cache namespace (its name here) reaches the worker beside the request, and the
// client's cache_salt inside it: KV is shared only within both (common/document_key.h).
TEST_F(HttpRequestHeadTest, TheKeysCacheNamespaceAndTheSaltReachTheWorker) {
  KeyFile keys;
  StartHttp(Options(), keys.processor());
  const std::string body =
      R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8, "cache_salt": "u1"})";
  const std::string reply =
      Exchange(ChatHead("Authorization: Bearer lzk_good\r\n", body.size()) + body);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_EQ(worker_.cache_namespaces(), std::vector<std::string>{"good"});
  EXPECT_EQ(worker_.last_request().cache_salt(), "u1");
}

}  // namespace
}  // namespace lazyattn::router::http_test
