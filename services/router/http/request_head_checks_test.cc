// The checks made of a request's head before its body (request_head_checks.h), on requests built
// in memory: which answer each kind of request gets, which are left to routing, which say their
// connection closes, and how much of an unread body is dropped. The same paths over real sockets:
// http_request_head_test.cc, http_request_keys_test.cc.
#include "services/router/http/request_head_checks.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "services/router/http/api_key_file_for_test.h"

namespace lazyattn::router {
namespace {

using testing::KeyFile;
using Checked = httplib::Server::HandlerResponse;

constexpr int64_t kMaxBody = 1000;

httplib::Request Request(std::string method, std::string path,
                         std::vector<std::pair<std::string, std::string>> headers = {}) {
  httplib::Request req;
  req.method = std::move(method);
  req.path = std::move(path);
  req.version = "HTTP/1.1";
  req.headers.emplace("Host", "router");  // as every HTTP/1.1 request must have
  for (auto& [name, value] : headers) req.headers.emplace(name, value);
  return req;
}

struct Outcome {
  Checked checked;
  httplib::Response res;
  ApiCaller caller;
};

Outcome Check(const httplib::Request& req, grpc::AuthMetadataProcessor* processor = nullptr,
              bool draining = false) {
  Outcome out;
  out.caller = {"left from", "the last request"};
  out.checked = CheckBeforeBody(processor, draining, kMaxBody, req, out.res, &out.caller);
  return out;
}

bool SaysClose(const httplib::Response& res) {
  return res.get_header_value("Connection") == "close";
}

const std::vector<std::pair<std::string, std::string>> kJsonBody = {
    {"Content-Type", "application/json"}, {"Content-Length", "20"}};

TEST(RequestHeadChecksTest, AWrongMethodIs405WithAllowAndItsBodyUnread) {
  const Outcome post_models = Check(Request("POST", "/v1/models", kJsonBody));
  EXPECT_EQ(post_models.checked, Checked::Handled);
  EXPECT_EQ(post_models.res.status, 405);
  EXPECT_EQ(post_models.res.get_header_value("Allow"), "GET, HEAD");
  EXPECT_TRUE(SaysClose(post_models.res));  // the body stays unread

  const Outcome get_chat = Check(Request("GET", "/v1/chat/completions"));
  EXPECT_EQ(get_chat.res.status, 405);
  EXPECT_EQ(get_chat.res.get_header_value("Allow"), "POST");
  EXPECT_FALSE(SaysClose(get_chat.res));  // nothing unread: the connection may stay

  // /health takes GET and HEAD; /v1/models/ alone names no model and is no endpoint.
  EXPECT_EQ(Check(Request("DELETE", "/health")).res.status, 405);
  const Outcome bare = Check(Request("GET", "/v1/models/"));
  EXPECT_NE(bare.res.status, 405);
}

TEST(RequestHeadChecksTest, APathThatIsNoEndpointIsLeftToRoutingUnlessTheLibraryWouldReadItsBody) {
  // PUT and the like: the library reads their body for any path before its 404; refused unread.
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE"}) {
    SCOPED_TRACE(method);
    const Outcome out = Check(Request(method, "/nowhere", kJsonBody));
    EXPECT_EQ(out.checked, Checked::Handled);
    EXPECT_EQ(out.res.status, 404);
    EXPECT_TRUE(SaysClose(out.res));
  }
  const Outcome get = Check(Request("GET", "/nowhere"));
  EXPECT_EQ(get.checked, Checked::Unhandled);
  EXPECT_FALSE(SaysClose(get.res));
  // A GET's body is ignored by the library: left on the connection, it must close after.
  const Outcome get_with_body = Check(Request("GET", "/health", {{"Content-Length", "5"}}));
  EXPECT_EQ(get_with_body.checked, Checked::Unhandled);
  EXPECT_TRUE(SaysClose(get_with_body.res));
  // An open endpoint names no key.
  EXPECT_EQ(get.caller.key_name, "");
  EXPECT_EQ(get.caller.cache_namespace, "");
}

// cpp-httplib routes the path it decoded: `/v1/chat%2Fcompletions` reached the chat endpoint,
// though a proxy in front with rules per path saw another path. Refused, whatever the endpoint.
TEST(RequestHeadChecksTest, AnEncodedSlashInThePathIs400) {
  for (const char* target :
       {"/v1/chat%2Fcompletions", "/v1/chat%2fcompletions", "/v1/chat%5Ccompletions",
        "/v1%5c..%5cv1/completions", "/v1%2Fmodels/x", "/v1/models%2Fx", "/health%2F"}) {
    SCOPED_TRACE(target);
    httplib::Request req = Request("POST", "/v1/chat/completions", kJsonBody);
    req.target = target;
    const Outcome out = Check(req);
    EXPECT_EQ(out.checked, Checked::Handled);
    EXPECT_EQ(out.res.status, 400);
    EXPECT_TRUE(SaysClose(out.res));  // the body stays unread
    EXPECT_NE(out.res.body.find("in the path is not accepted"), std::string::npos) << out.res.body;
  }
  // In the query, or another escape, it is no slash of the path; a model id is one segment that
  // may hold an encoded slash (an HF id, org/name).
  for (const char* target : {"/health?next=%2Fv1", "/health%20", "/health%2", "/health%",
                             "/v1/models/org%2Fmodel?x=1", "/v1/models/meta-llama%2fLlama-3"}) {
    SCOPED_TRACE(target);
    httplib::Request req = Request("GET", "/health");
    req.target = target;
    EXPECT_EQ(Check(req).checked, Checked::Unhandled);
  }
}

TEST(RequestHeadChecksTest, ADrainingRouterRefusesEndpointsButNotHealth) {
  const Outcome chat = Check(Request("POST", "/v1/chat/completions", kJsonBody), nullptr, true);
  EXPECT_EQ(chat.checked, Checked::Handled);
  EXPECT_EQ(chat.res.status, 503);
  EXPECT_TRUE(SaysClose(chat.res));
  EXPECT_EQ(Check(Request("GET", "/v1/models"), nullptr, true).res.status, 503);
  EXPECT_EQ(Check(Request("GET", "/health"), nullptr, true).checked, Checked::Unhandled);
}

TEST(RequestHeadChecksTest, TheKeyIsCheckedForItsEndpointAndNamed) {
  KeyFile keys;
  ASSERT_NE(keys.processor(), nullptr);
  grpc::AuthMetadataProcessor* processor = keys.processor().get();
  std::vector<std::pair<std::string, std::string>> with_key = kJsonBody;
  with_key.emplace_back("Authorization", "Bearer lzk_good");
  const Outcome good = Check(Request("POST", "/v1/completions", with_key), processor);
  EXPECT_EQ(good.checked, Checked::Unhandled);
  EXPECT_EQ(good.caller.key_name, "good");
  EXPECT_EQ(good.caller.cache_namespace, "good");  // its own, by default

  const Outcome none = Check(Request("POST", "/v1/completions", kJsonBody), processor);
  EXPECT_EQ(none.checked, Checked::Handled);
  EXPECT_EQ(none.res.status, 401);
  EXPECT_EQ(none.res.get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_TRUE(SaysClose(none.res));
  EXPECT_EQ(none.caller.key_name, "");
  EXPECT_EQ(none.caller.cache_namespace, "");

  // HEAD is GET's endpoint and needs its key.
  EXPECT_EQ(Check(Request("HEAD", "/v1/models"), processor).res.status, 401);
  // The header is checked whole: a NUL does not end it.
  const Outcome cut = Check(
      Request("GET", "/v1/models", {{"Authorization", std::string("Bearer lzk_good\0x", 17)}}),
      processor);
  EXPECT_EQ(cut.res.status, 401);

  // Two credentials, whichever comes first: a proxy in front that keeps the last, or adds its
  // own, would authorize another key than the one checked here.
  for (const auto& [first, second] : {std::pair{"Bearer lzk_good", "Bearer lzk_other"},
                                      {"Bearer lzk_other", "Bearer lzk_good"},
                                      {"Bearer lzk_good", "Bearer lzk_good"}}) {
    std::vector<std::pair<std::string, std::string>> twice = kJsonBody;
    twice.emplace_back("Authorization", first);
    twice.emplace_back("authorization", second);
    const Outcome two = Check(Request("POST", "/v1/completions", twice), processor);
    EXPECT_EQ(two.checked, Checked::Handled);
    EXPECT_EQ(two.res.status, 400) << first << " then " << second;
    EXPECT_NE(two.res.body.find("Authorization: given more than once"), std::string::npos)
        << two.res.body;
    EXPECT_TRUE(SaysClose(two.res));
    EXPECT_EQ(two.caller.key_name, "");
  }
}

TEST(RequestHeadChecksTest, ACompletionsFramingIsCheckedBeforeItsBody) {
  const Outcome no_length =
      Check(Request("POST", "/v1/chat/completions", {{"Content-Type", "application/json"}}));
  EXPECT_EQ(no_length.res.status, 411);
  const Outcome too_large = Check(Request(
      "POST", "/v1/chat/completions",
      {{"Content-Type", "application/json"}, {"Content-Length", std::to_string(kMaxBody + 1)}}));
  EXPECT_EQ(too_large.res.status, 413);
  EXPECT_TRUE(SaysClose(too_large.res));
  const Outcome text = Check(Request("POST", "/v1/completions",
                                     {{"Content-Type", "text/plain"}, {"Content-Length", "3"}}));
  EXPECT_EQ(text.res.status, 415);
  const Outcome both = Check(Request("POST", "/v1/completions",
                                     {{"Content-Type", "application/json"},
                                      {"Content-Length", "3"},
                                      {"Transfer-Encoding", "chunked"}}));
  EXPECT_EQ(both.res.status, 400);
  const Outcome chunked =
      Check(Request("POST", "/v1/completions",
                    {{"Content-Type", "application/json"}, {"Transfer-Encoding", "chunked"}}));
  EXPECT_EQ(chunked.checked, Checked::Unhandled);  // counted as it is read
  const Outcome zstd = Check(Request("POST", "/v1/completions",
                                     {{"Content-Type", "application/json"},
                                      {"Content-Encoding", "zstd"},
                                      {"Content-Length", "3"}}));
  EXPECT_EQ(zstd.res.status, 415);
  EXPECT_TRUE(SaysClose(zstd.res));
  const Outcome gzip = Check(Request("POST", "/v1/completions",
                                     {{"Content-Type", "application/json"},
                                      {"Content-Encoding", "gzip"},
                                      {"Content-Length", "3"}}));
  EXPECT_EQ(gzip.checked, Checked::Unhandled);
}

TEST(RequestHeadChecksTest, RangeIsDropped) {
  httplib::Request req = Request("GET", "/health");
  req.ranges.emplace_back(0, 10);
  Check(req);
  EXPECT_TRUE(req.ranges.empty());
}

TEST(RequestHeadChecksTest, EveryContentLengthCountsAsABody) {
  EXPECT_FALSE(CarriesBody(Request("GET", "/health")));
  EXPECT_FALSE(CarriesBody(Request("GET", "/health", {{"Content-Length", "0"}})));
  EXPECT_TRUE(CarriesBody(Request("GET", "/health", {{"Content-Length", "1"}})));
  EXPECT_TRUE(
      CarriesBody(Request("GET", "/health", {{"Content-Length", "0"}, {"Content-Length", "42"}})));
  EXPECT_TRUE(CarriesBody(Request("GET", "/health", {{"Transfer-Encoding", "chunked"}})));
}

TEST(RequestHeadChecksTest, AnUnreadBodyIsDroppedAsFarAsItWasAnnounced) {
  EXPECT_EQ(UnreadBody(Request("GET", "/health"), 0, kMaxBody), 0);
  EXPECT_EQ(UnreadBody(Request("POST", "/x", {{"Content-Length", "100"}}), 40, kMaxBody),
            60 + kWireSlack);
  EXPECT_EQ(UnreadBody(Request("POST", "/x", {{"Content-Length", "100"}}), 500, kMaxBody),
            kWireSlack);
  // No usable length: the limit once more.
  EXPECT_EQ(UnreadBody(Request("POST", "/x", {{"Transfer-Encoding", "chunked"}}), 0, kMaxBody),
            kMaxBody + kWireSlack);
  EXPECT_EQ(UnreadBody(Request("POST", "/x", {{"Content-Length", "0"}, {"Content-Length", "42"}}),
                       0, kMaxBody),
            kMaxBody + kWireSlack);
  EXPECT_EQ(UnreadBody(Request("POST", "/x", {{"Content-Length", "-5"}}), 0, kMaxBody),
            kMaxBody + kWireSlack);
  // A length near INT64_MAX does not overflow.
  EXPECT_GT(
      UnreadBody(Request("POST", "/x", {{"Content-Length", "9223372036854775807"}}), 0, kMaxBody),
      0);
}

TEST(RequestHeadChecksTest, AnHttp10RequestClosesUnlessItAskedToKeepAlive) {
  httplib::Request req = Request("GET", "/health");
  req.version = "HTTP/1.0";
  EXPECT_TRUE(LibraryClosesAfterResponse(req));
  req.headers.emplace("Connection", "Keep-Alive");
  EXPECT_FALSE(LibraryClosesAfterResponse(req));
  EXPECT_FALSE(LibraryClosesAfterResponse(Request("GET", "/health")));
}

TEST(RequestHeadChecksTest, CloseCountsAmongAConnectionHeadersOptions) {
  EXPECT_FALSE(AsksToClose(Request("GET", "/health")));
  EXPECT_FALSE(AsksToClose(Request("GET", "/health", {{"Connection", "keep-alive"}})));
  EXPECT_FALSE(AsksToClose(Request("GET", "/health", {{"Connection", "closed, x-close"}})));
  EXPECT_TRUE(AsksToClose(Request("GET", "/health", {{"Connection", "close"}})));
  EXPECT_TRUE(AsksToClose(Request("GET", "/health", {{"Connection", "keep-alive, close"}})));
  EXPECT_TRUE(AsksToClose(Request("GET", "/health", {{"Connection", " Close ,te"}})));
  httplib::Request two = Request("GET", "/health", {{"Connection", "keep-alive"}});
  two.headers.emplace("Connection", "CLOSE");
  EXPECT_TRUE(AsksToClose(two));
}

TEST(RequestHeadChecksTest, OnlyTheTwoCompletionEndpointsAreCompletions) {
  EXPECT_TRUE(IsCompletion(Request("POST", "/v1/chat/completions")));
  EXPECT_TRUE(IsCompletion(Request("POST", "/v1/completions")));
  EXPECT_FALSE(IsCompletion(Request("GET", "/v1/completions")));
  EXPECT_FALSE(IsCompletion(Request("POST", "/v1/completions/")));
  EXPECT_FALSE(IsCompletion(Request("POST", "/v1/models")));
}

}  // namespace
}  // namespace lazyattn::router
