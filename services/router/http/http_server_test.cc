// The HTTP listener over real sockets on 127.0.0.1, in front of a router with a scripted fake
// worker and a fake KV directory: what a hostile or idle client can make it hold, what its
// shutdown waits for, and the responses' log probabilities (several choices:
// http_choices_test.cc).
#include "services/router/http/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "services/router/http/api_key_file_for_test.h"
#include "services/router/http/http_server_test_fixture.h"
#include "services/router/server/fake_cluster_for_test.h"
#include "services/router/server/router_server.h"

namespace lazyattn::router {
namespace {

using http_test::Connect;
using http_test::HttpServerTest;
using http_test::JsonOf;
using http_test::OpenFds;
using http_test::ReadAll;
using http_test::ReadHead;
using testing::FakeKvdir;
using testing::FakeWorker;
using testing::RejectAll;
using testing::RouterOptionsForFakeKvdir;

TEST_F(HttpServerTest, RefusesAMissingKeyBeforeReadingTheBody) {
  StartRouter();
  StartHttp(Options(), std::make_shared<RejectAll>());
  const int fd = Connect(http_->port());
  ASSERT_GE(fd, 0);
  // Announces 3 MiB and sends none of it: the answer must not wait for the body.
  const std::string head = absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      3 << 20, "\r\n\r\n");
  ASSERT_EQ(write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  const absl::Time start = absl::Now();
  const std::string reply = ReadHead(fd);
  close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 401", 0), 0u) << reply;
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

// A field the router does not implement, set to a value that changes the answer, is refused as
// OpenAI refuses a bad field (400, invalid_request_error, `param` the field); a field it does not
// know is accepted and the request served.
TEST_F(HttpServerTest, AnUnsupportedFieldIs400NamingItAndAnUnknownOneIsServed) {
  StartRouter();
  StartHttp(Options(), nullptr);
  auto post = [&](const std::string& extra) {
    return Post("/v1/chat/completions",
                absl::StrCat(R"({"messages": [{"role": "user", "content": "Hi?"}], )"
                             R"("max_tokens": 4, )",
                             extra, "}"));
  };
  const std::string refused =
      post(R"("tools": [{"type": "function", "function": {"name": "lookup"}}])");
  EXPECT_EQ(refused.rfind("HTTP/1.1 400", 0), 0u) << refused;
  EXPECT_NE(refused.find(R"("type":"invalid_request_error")"), std::string::npos) << refused;
  EXPECT_NE(refused.find(R"("param":"tools")"), std::string::npos) << refused;
  EXPECT_NE(refused.find("tool calling is not supported"), std::string::npos) << refused;
  const std::string served = post(R"("x_client_trace": {"id": 7})");
  EXPECT_EQ(served.rfind("HTTP/1.1 200", 0), 0u) << served;
}

// A completion's echo: each choice's text begins with the prompt, whole or streamed (the prompt
// is each choice's first chunk); the usage is the worker's. n copies of a prompt larger than a
// body may be are refused, 400 naming echo.
TEST_F(HttpServerTest, CompletionEchoPutsThePromptBeforeTheText) {
  FakeWorker::Script script;
  script.tokens = {" a", " time"};
  worker_.SetScript(script);
  StartRouter();
  StartHttp(Options(), nullptr);
  auto whole = JsonOf(Post("/v1/completions", R"({"prompt": "Once upon", "echo": true, "n": 2})"));
  ASSERT_EQ(whole.size(), 1u);
  ASSERT_EQ(whole[0]["choices"].size(), 2u) << whole[0].dump();
  EXPECT_EQ(whole[0]["choices"][0]["text"], "Once upon a time");
  EXPECT_EQ(whole[0]["choices"][1]["text"], "Once upon a time");
  EXPECT_EQ(worker_.last_request().question(), "Once upon");  // the worker sees the prompt once

  std::map<int, std::string> texts;
  std::map<int, std::string> firsts;
  for (const auto& chunk :
       JsonOf(Post("/v1/completions", R"({"prompt": "Once upon", "echo": true, "n": 2,)"
                                      R"( "stream": true})"))) {
    const auto& choice = chunk["choices"][0];
    const int index = choice["index"];
    const std::string text = choice["text"];
    if (!firsts.contains(index)) firsts[index] = text;
    texts[index] += text;
  }
  EXPECT_EQ(texts, (std::map<int, std::string>{{0, "Once upon a time"}, {1, "Once upon a time"}}));
  EXPECT_EQ(firsts, (std::map<int, std::string>{{0, "Once upon"}, {1, "Once upon"}}));

  // Without echo, as before.
  whole = JsonOf(Post("/v1/completions", R"({"prompt": "Once upon"})"));
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0]["choices"][0]["text"], " a time");

  // n x the prompt over http.max_body_bytes: refused before any worker call.
  http_.reset();
  HttpOptions small = Options();
  small.max_body_bytes = 4096;
  StartHttp(small, nullptr);
  const int calls = worker_.generate_calls();
  const std::string prompt(1000, 'p');
  const std::string reply = Post(
      "/v1/completions", absl::StrCat(R"({"prompt": ")", prompt, R"(", "echo": true, "n": 5})"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply.substr(0, 300);
  const auto refused = JsonOf(reply);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0]["error"]["param"], "echo") << reply;
  EXPECT_EQ(refused[0]["error"]["message"],
            "echo: n 5 copies of the prompt's 1000 bytes exceed http.max_body_bytes (4096); lower "
            "n or leave echo out");
  EXPECT_EQ(worker_.generate_calls(), calls);
}

// The chosen tokens' log probabilities come back in OpenAI's forms, whole and streamed: one
// entry per token with its bytes (the fake worker's tokens are its texts, log probabilities
// -0.5, -1.0, ...), also for a token whose text is held back; completions count text offsets.
TEST_F(HttpServerTest, LogprobsOfTheChosenTokensComeBackInOpenAisForms) {
  FakeWorker::Script script;
  script.tokens = {"Hel", "lo"};
  script.held_back_tail = "!";
  worker_.SetScript(script);
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string chat = R"({"messages": [{"role": "user", "content": "Hi?"}], "logprobs": true)";

  auto whole = JsonOf(Post("/v1/chat/completions", chat + "}"));
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0]["choices"][0]["message"]["content"], "Hello!");
  EXPECT_EQ(whole[0]["choices"][0]["logprobs"], nlohmann::json::parse(R"({"content": [
      {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108], "top_logprobs": []},
      {"token": "lo", "logprob": -1.0, "bytes": [108, 111], "top_logprobs": []}],
      "refusal": null})"))
      << whole[0].dump();

  std::vector<nlohmann::json> entries;
  std::string text;
  for (const auto& chunk : JsonOf(Post("/v1/chat/completions", chat + R"(, "stream": true})"))) {
    const auto& choice = chunk["choices"][0];
    if (choice["delta"].contains("content")) text += choice["delta"]["content"];
    if (!choice["logprobs"].is_null()) {
      for (const auto& e : choice["logprobs"]["content"]) entries.push_back(e);
    }
  }
  EXPECT_EQ(text, "Hello!");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0]["token"], "Hel");
  EXPECT_EQ(entries[1]["logprob"], -1.0);

  const std::string prompt = R"({"prompt": "Hi?", "logprobs": 0)";
  whole = JsonOf(Post("/v1/completions", prompt + "}"));
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0]["choices"][0]["logprobs"], nlohmann::json::parse(R"({
      "tokens": ["Hel", "lo"], "token_logprobs": [-0.5, -1.0], "top_logprobs": null,
      "text_offset": [0, 3]})"))
      << whole[0].dump();
  std::vector<int64_t> offsets;
  for (const auto& chunk : JsonOf(Post("/v1/completions", prompt + R"(, "stream": true})"))) {
    const auto& logprobs = chunk["choices"][0]["logprobs"];
    if (!logprobs.is_null()) offsets.push_back(logprobs["text_offset"][0]);
  }
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 3}));

  // Not asked for: null, as before.
  whole =
      JsonOf(Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi?"}]})"));
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_TRUE(whole[0]["choices"][0]["logprobs"].is_null());
}

// The alternatives come back in OpenAI's forms, whole and streamed: chat's top_logprobs list per
// entry, completions' object per token. The fake worker's alternatives (fake_cluster_for_test.h)
// are the token itself, then "alt1" one nat less likely.
TEST_F(HttpServerTest, TopLogprobsComeBackInOpenAisForms) {
  FakeWorker::Script script;
  script.tokens = {"Hel", "lo"};
  worker_.SetScript(script);
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string chat =
      R"({"messages": [{"role": "user", "content": "Hi?"}], "logprobs": true, "top_logprobs": 2)";

  auto whole = JsonOf(Post("/v1/chat/completions", chat + "}"));
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(worker_.last_request().sampling().top_logprobs(), 2);
  const nlohmann::json content = nlohmann::json::parse(R"([
      {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108], "top_logprobs": [
        {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]},
        {"token": "alt1", "logprob": -1.5, "bytes": [97, 108, 116, 49]}]},
      {"token": "lo", "logprob": -1.0, "bytes": [108, 111], "top_logprobs": [
        {"token": "lo", "logprob": -1.0, "bytes": [108, 111]},
        {"token": "alt1", "logprob": -2.0, "bytes": [97, 108, 116, 49]}]}])");
  EXPECT_EQ(whole[0]["choices"][0]["logprobs"]["content"], content) << whole[0].dump();

  nlohmann::json streamed = nlohmann::json::array();
  for (const auto& chunk : JsonOf(Post("/v1/chat/completions", chat + R"(, "stream": true})"))) {
    const auto& logprobs = chunk["choices"][0]["logprobs"];
    if (!logprobs.is_null()) {
      for (const auto& e : logprobs["content"]) streamed.push_back(e);
    }
  }
  EXPECT_EQ(streamed, content);

  const std::string prompt = R"({"prompt": "Hi?", "logprobs": 2)";
  const nlohmann::json top =
      nlohmann::json::parse(R"([{"Hel": -0.5, "alt1": -1.5}, {"lo": -1.0, "alt1": -2.0}])");
  whole = JsonOf(Post("/v1/completions", prompt + "}"));
  ASSERT_EQ(whole.size(), 1u);
  const nlohmann::json& logprobs = whole[0]["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["top_logprobs"], top) << whole[0].dump();
  EXPECT_EQ(logprobs["tokens"], nlohmann::json::parse(R"(["Hel", "lo"])"));
  EXPECT_EQ(logprobs["token_logprobs"], nlohmann::json::parse("[-0.5, -1.0]"));
  EXPECT_EQ(logprobs["text_offset"], nlohmann::json::parse("[0, 3]"));
  streamed = nlohmann::json::array();
  for (const auto& chunk : JsonOf(Post("/v1/completions", prompt + R"(, "stream": true})"))) {
    const auto& logprobs = chunk["choices"][0]["logprobs"];
    if (!logprobs.is_null()) {
      ASSERT_EQ(logprobs["top_logprobs"].size(), 1u) << chunk.dump();
      streamed.push_back(logprobs["top_logprobs"][0]);
    }
  }
  EXPECT_EQ(streamed, top);
}

// Counts of alternatives out of bounds, and top_logprobs without logprobs, are 400 naming the
// field; no worker is asked.
TEST_F(HttpServerTest, TopLogprobsOutOfBoundsAre400NamingTheField) {
  StartRouter();
  StartHttp(Options(), nullptr);
  const int calls = worker_.generate_calls();
  struct Case {
    const char* path;
    std::string body;
    const char* param;
    const char* message;
  };
  const std::string user = R"("messages": [{"role": "user", "content": "Hi?"}])";
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{" + user + R"(, "logprobs": true, "top_logprobs": 21})",
       "top_logprobs", "expected an integer in [0, 20], got 21"},
      {"/v1/chat/completions", "{" + user + R"(, "logprobs": true, "top_logprobs": -1})",
       "top_logprobs", "expected an integer in [0, 20], got -1"},
      {"/v1/chat/completions", "{" + user + R"(, "top_logprobs": 2})", "top_logprobs",
       "needs logprobs: true"},
      {"/v1/chat/completions", "{" + user + R"(, "logprobs": true, "top_logprobs": 2.5})",
       "top_logprobs", "expected an integer, got 2.5"},
      {"/v1/completions", R"({"prompt": "Hi?", "logprobs": 21})", "logprobs",
       "expected an integer in [0, 20], got 21"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const std::string reply = Post(c.path, c.body);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    const auto body = JsonOf(reply);
    ASSERT_EQ(body.size(), 1u);
    EXPECT_EQ(body[0]["error"]["param"], c.param) << reply;
    EXPECT_NE(body[0]["error"]["message"].get<std::string>().find(c.message), std::string::npos)
        << reply;
  }
  EXPECT_EQ(worker_.generate_calls(), calls);
}

// A response that is not streamed holds every choice's log-probability entries until its end:
// n x max_tokens x (1 + alternatives) over http.max_logprob_entries is a 400 naming the field,
// before any worker is asked; the same request streamed is served (its entries go as they come).
TEST_F(HttpServerTest, LogprobsOverTheBoundOfAWholeResponseAre400AndServedStreamed) {
  StartRouter();
  StartHttp(Options(), nullptr);  // the default bound, 1048576
  const int calls = worker_.generate_calls();
  // 128 x 4096 x 21 = 11010048 entries: gigabytes of JSON if it were served whole.
  const std::string huge =
      R"({"messages": [{"role": "user", "content": "Hi?"}], "n": 128, "max_tokens": 4096, )"
      R"("logprobs": true, "top_logprobs": 20, "logit_bias": {"2": -100})";
  std::string reply = Post("/v1/chat/completions", huge + "}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  auto body = JsonOf(reply);
  ASSERT_EQ(body.size(), 1u);
  EXPECT_EQ(body[0]["error"]["type"], "invalid_request_error") << reply;
  EXPECT_EQ(body[0]["error"]["param"], "top_logprobs") << reply;
  EXPECT_EQ(body[0]["error"]["code"], "invalid_argument") << reply;
  const std::string message = body[0]["error"]["message"];
  EXPECT_TRUE(absl::StrContains(message, "11010048")) << message;
  EXPECT_TRUE(absl::StrContains(message, "1048576 (http.max_logprob_entries)")) << message;
  EXPECT_TRUE(absl::StrContains(message, "stream: true, which has no such bound")) << message;
  EXPECT_EQ(worker_.generate_calls(), calls);

  reply = Post("/v1/chat/completions", huge + R"(, "stream": true})");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply.substr(0, 500);
  EXPECT_TRUE(absl::StrContains(reply, "data: [DONE]")) << reply.substr(0, 500);
  EXPECT_EQ(worker_.generate_calls(), calls + 128);

  // At the bound is served; one choice more is refused. A completion's `logprobs: k` counts k
  // alternatives; a request without max_tokens counts limits.max_tokens (4096 by default).
  http_.reset();
  HttpOptions small = Options();
  small.max_logprob_entries = 100;
  StartHttp(small, nullptr);
  const std::string chat =
      R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 10, "logprobs": true, )"
      R"("top_logprobs": 4, )";
  reply = Post("/v1/chat/completions", chat + R"("n": 2})");  // 2 x 10 x 5 = 100
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  body = JsonOf(reply);
  ASSERT_EQ(body.size(), 1u);
  ASSERT_EQ(body[0]["choices"].size(), 2u) << reply;
  EXPECT_FALSE(body[0]["choices"][1]["logprobs"]["content"].empty()) << reply;

  struct Case {
    const char* path;
    std::string body;
    const char* param;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"/v1/chat/completions", chat + R"("n": 3})", "top_logprobs",
       "n 3 x max_tokens 10 x (1 + top_logprobs 4) = 150 entries, over the router's bound of 100"},
      {"/v1/completions", R"({"prompt": "Hi?", "max_tokens": 10, "logprobs": 10})", "logprobs",
       "n 1 x max_tokens 10 x (1 + logprobs 10) = 110 entries"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "Hi?"}], )"
       R"("logprobs": true})",
       "logprobs", "max_tokens 4096 (limits.max_tokens, as none is set) x (1 + top_logprobs 0)"},
  };
  const int before = worker_.generate_calls();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    reply = Post(c.path, c.body);
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    body = JsonOf(reply);
    ASSERT_EQ(body.size(), 1u);
    EXPECT_EQ(body[0]["error"]["param"], c.param) << reply;
    EXPECT_TRUE(absl::StrContains(body[0]["error"]["message"].get<std::string>(), c.message))
        << reply;
    // Streamed, the same request is served.
    std::string streamed = c.body;
    streamed.back() = ',';
    streamed += R"( "stream": true})";
    reply = Post(c.path, streamed);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
    EXPECT_TRUE(absl::StrContains(reply, "data: [DONE]")) << reply;
  }
  EXPECT_EQ(worker_.generate_calls(), before + 3 + 1 + 1);  // only the streamed ones
}

// logit_bias reaches the worker as SamplingParams.logit_bias from both endpoints; what the shared
// validator refuses in it (a bias out of [-100, 100], an id outside the fake's vocabulary of 1000,
// more than limits.max_logit_bias entries) is a 400 naming logit_bias and the key, and no worker
// is asked.
TEST_F(HttpServerTest, LogitBiasReachesTheWorkerAndItsBoundsAre400NamingIt) {
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string user = R"("messages": [{"role": "user", "content": "Hi?"}])";
  for (const std::string& body :
       {"{" + user + R"(, "logit_bias": {"7": 100, "42": -2.5}})",
        std::string(R"({"prompt": "Hi?", "logit_bias": {"7": 100, "42": -2.5}})")}) {
    SCOPED_TRACE(body);
    const std::string path =
        absl::StrContains(body, "prompt") ? "/v1/completions" : "/v1/chat/completions";
    const std::string reply = Post(path, body);
    EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
    const v1::GenerateRequest sent = worker_.last_request();
    const auto& bias = sent.sampling().logit_bias();
    ASSERT_EQ(bias.size(), 2u);
    EXPECT_EQ(bias.at(7), 100.0f);
    EXPECT_EQ(bias.at(42), -2.5f);
  }
  const int calls = worker_.generate_calls();
  std::string many = "{";
  for (int i = 0; i <= 300; ++i) absl::StrAppend(&many, i == 0 ? "" : ", ", "\"", i, "\": 1");
  many += "}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"7": 101})", R"(logit_bias: key \"7\": bias 101 outside [-100, 100])"},
      {R"({"1000": 1})",
       R"(logit_bias: key \"1000\": token id 1000 outside the vocabulary (size 1000))"},
      {R"({"-1": 1})", R"(logit_bias: key \"-1\": negative token id -1)"},
      {R"({"abc": 1})", "logit_bias: expected token ids as keys"},
      {many, "logit_bias: 301 entries, the limit is 300 (limits.max_logit_bias)"},
  };
  for (const auto& [bias, message] : cases) {
    SCOPED_TRACE(bias.substr(0, 40));
    const std::string reply =
        Post("/v1/chat/completions", "{" + user + R"(, "logit_bias": )" + bias + "}");
    EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
    const auto body = JsonOf(reply);
    ASSERT_EQ(body.size(), 1u);
    EXPECT_EQ(body[0]["error"]["type"], "invalid_request_error") << reply;
    EXPECT_EQ(body[0]["error"]["param"], "logit_bias") << reply;
    EXPECT_NE(body[0]["error"].dump().find(message), std::string::npos) << reply;
  }
  EXPECT_EQ(worker_.generate_calls(), calls);
}

// Biases that no live worker applies (one older than logit_bias advertises 0) are the client's
// error: a 400 naming logit_bias and the most a worker applies, and nothing of the cluster (no
// worker id or address) in the message.
TEST_F(HttpServerTest, LogitBiasNoWorkerAppliesIsA400NamingNoWorker) {
  worker_.SetMaxLogitBias(0);
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string reply =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Hi?"}], "logit_bias": {"7": 1, "8": 2}})");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  const auto body = JsonOf(reply);
  ASSERT_EQ(body.size(), 1u);
  EXPECT_EQ(body[0]["error"]["param"], "logit_bias") << reply;
  EXPECT_EQ(body[0]["error"]["code"], "failed_precondition") << reply;
  EXPECT_EQ(body[0]["error"]["message"],
            "logit_bias: the request has 2 entries, and no live worker of its model applies more "
            "than 0 (ModelInfo.max_logit_bias, which GetModelInfo reports)")
      << reply;
  EXPECT_EQ(reply.find(worker_.address()), std::string::npos) << reply;
  EXPECT_EQ(worker_.generate_calls(), 0);
}

TEST_F(HttpServerTest, IdleConnectionsBeyondTheQueuesHoldNoSocket) {
  StartRouter();
  HttpOptions o = Options();
  o.threads = 1;
  o.max_queued_connections = 2;
  StartHttp(o, nullptr);
  const int before = OpenFds();
  std::vector<int> clients;
  for (int i = 0; i < 60; ++i) {
    const int fd = Connect(http_->port());
    if (fd >= 0) clients.push_back(fd);  // else refused: the kernel's backlog is full
  }
  absl::SleepFor(absl::Milliseconds(500));  // let the listener accept what it will
  const int server_side = OpenFds() - before - static_cast<int>(clients.size());
  // One served, two queued, one being answered 503 and two waiting for it, one in the accepting
  // thread; slack for gRPC's own descriptors. Unbounded, it would be all 60.
  EXPECT_LE(server_side, 12) << clients.size() << " clients";
  for (int fd : clients) close(fd);
}

TEST_F(HttpServerTest, ShutdownLetsAStreamFinishWithinTheGraceAndWaitsForItsCall) {
  StartRouter();
  FakeWorker::Script script;
  script.block = true;
  worker_.SetScript(script);
  StartHttp(Options(), nullptr);
  std::string reply;
  std::thread client([&] {
    const int fd = Connect(http_->port());
    const std::string body =
        R"({"messages": [{"role": "user", "content": "Hi?"}], "stream": true, "max_tokens": 8})";
    const std::string request = absl::StrCat(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Connection: close\r\nContent-Length: ",
        body.size(), "\r\n\r\n", body);
    (void)!write(fd, request.data(), request.size());
    reply = ReadAll(fd);
    close(fd);
  });
  ASSERT_TRUE(worker_.WaitForCalls(1, absl::Seconds(10)));
  std::thread unblock([&] {
    absl::SleepFor(absl::Seconds(1));  // well past the old 250 ms cut
    worker_.Unblock();
  });
  http_->Shutdown(absl::Seconds(20));
  unblock.join();
  client.join();
  EXPECT_EQ(http_->live_calls(), 0);
  EXPECT_NE(reply.find(" world"), std::string::npos) << reply;
  EXPECT_NE(reply.find("[DONE]"), std::string::npos) << reply;
}

}  // namespace
}  // namespace lazyattn::router
