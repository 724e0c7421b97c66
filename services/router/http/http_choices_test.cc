// The HTTP listener's OpenAI `n`: several choices, each its own worker call with seed + i, come
// back together or not at all, and a failing choice fails the whole response and cancels the
// others' calls. Over real sockets, in front of a router with a scripted fake worker.
#include <gtest/gtest.h>

#include <string>

#include "services/router/http/http_server_test_fixture.h"

namespace lazyattn::router {
namespace {

using http_test::HttpServerTest;
using http_test::JsonOf;
using testing::FakeWorker;

// OpenAI's `n`: each choice is its own worker call with seed + i, and comes back as choice i,
// whole (one object per choice, the prompt counted once in the usage) and streamed (chunks of
// the choices interleaved, each choice with its own role and finish chunks, one usage chunk).
TEST_F(HttpServerTest, SeveralChoicesComeBackWholeAndStreamedEachWithItsOwnSeed) {
  FakeWorker::Script script;
  script.tokens = {"Hel", "lo"};
  script.tokens_name_the_seed = true;
  script.token_interval = absl::Milliseconds(50);  // the choices' tokens interleave
  worker_.SetScript(script);
  StartRouter();
  StartHttp(Options(), nullptr);
  auto text_of = [](uint64_t seed) { return absl::StrCat("Hel#", seed, "lo#", seed); };

  auto whole = JsonOf(Post("/v1/chat/completions", R"({"messages": [{"role": "user",
      "content": "Hi?"}], "n": 3, "seed": 7, "logprobs": true})"));
  ASSERT_EQ(whole.size(), 1u);
  ASSERT_EQ(whole[0]["choices"].size(), 3u) << whole[0].dump();
  for (int i = 0; i < 3; ++i) {
    const auto& choice = whole[0]["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["message"]["content"], text_of(7 + i));
    EXPECT_EQ(choice["logprobs"]["content"].size(), 2u);
    EXPECT_EQ(choice["lazyattn"]["documents"], 0);
  }
  EXPECT_EQ(whole[0]["usage"]["completion_tokens"], 6);
  std::vector<uint64_t> seeds;
  for (const auto& request : worker_.requests()) seeds.push_back(request.sampling().seed());
  std::sort(seeds.begin(), seeds.end());
  EXPECT_EQ(seeds, (std::vector<uint64_t>{7, 8, 9}));

  const std::string reply = Post("/v1/completions", R"({"prompt": "Hi?", "n": 3, "seed": 7,
      "stream": true, "stream_options": {"include_usage": true}})");
  std::vector<std::string> texts(3);
  std::vector<int> finishes(3);
  std::vector<int> order;  // the choices' indexes, chunk after chunk
  int usage_chunks = 0;
  for (const auto& chunk : JsonOf(reply)) {
    if (chunk["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(chunk["usage"]["completion_tokens"], 6);
      continue;
    }
    const int i = chunk["choices"][0]["index"];
    ASSERT_TRUE(i >= 0 && i < 3) << chunk.dump();
    texts[i] += chunk["choices"][0]["text"];
    order.push_back(i);
    if (!chunk["choices"][0]["finish_reason"].is_null()) ++finishes[i];
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(texts[i], text_of(7 + i));
  EXPECT_EQ(finishes, (std::vector<int>{1, 1, 1}));
  // Interleaved as the tokens came (50 ms apart on every choice), not one choice after another.
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end())) << ::testing::PrintToString(order);
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_NE(reply.find("data: [DONE]"), std::string::npos);

  // Chat streams open every choice with its role; unseeded choices send no seed.
  std::vector<int> roles(2);
  for (const auto& chunk : JsonOf(Post("/v1/chat/completions", R"({"messages": [{"role": "user",
      "content": "Hi?"}], "n": 2, "stream": true})"))) {
    const auto& choice = chunk["choices"][0];
    if (choice["delta"].contains("role")) ++roles[choice["index"].get<int>()];
  }
  EXPECT_EQ(roles, (std::vector<int>{1, 1}));
  EXPECT_FALSE(worker_.last_request().sampling().has_seed());
}

// A request's choices take their places together or not at all: with all but two of the
// router's places held, n = 3 is a 429 naming n that holds nothing and reaches no worker, and
// n = 2 then fits exactly.
TEST_F(HttpServerTest, ChoicesTakeTheirPlacesTogetherOrNotAtAll) {
  StartRouter();
  StartHttp(Options(), nullptr);
  RouterContext& router = router_->context();
  const int limit = router.options().max_inflight_requests;
  ASSERT_GE(limit, 3);
  ASSERT_TRUE(router.TryAdmit(limit - 2));
  const int calls = worker_.generate_calls();
  const std::string chat = R"({"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 4)";
  const std::string refused = Post("/v1/chat/completions", chat + R"(, "n": 3})");
  EXPECT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  EXPECT_NE(refused.find(absl::StrCat("n: 3 choices refused together: router busy: ", limit - 2,
                                      " requests in flight, 3 more would pass "
                                      "limits.max_inflight_requests (",
                                      limit, ")")),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.find(R"("param":"n")"), std::string::npos) << refused;
  EXPECT_EQ(router.InFlight(), limit - 2);
  EXPECT_EQ(worker_.generate_calls(), calls);
  const std::string served = Post("/v1/chat/completions", chat + R"(, "n": 2})");
  EXPECT_EQ(served.rfind("HTTP/1.1 200", 0), 0u) << served;
  EXPECT_EQ(worker_.generate_calls(), calls + 2);
  for (int i = 0; i < limit - 2; ++i) router.Release();
  EXPECT_TRUE(testing::WaitFor([&] { return router.InFlight() == 0; }));
}

// A choice that fails fails the whole response: before the stream began, with the error's HTTP
// status; after, with the stream's error event and no [DONE].
TEST_F(HttpServerTest, AFailingChoiceFailsTheWholeResponse) {
  FakeWorker::Script script;
  script.fail_before_first_token = grpc::StatusCode::INVALID_ARGUMENT;
  worker_.SetScript(script);
  StartRouter();
  StartHttp(Options(), nullptr);
  const std::string chat = R"({"messages": [{"role": "user", "content": "Hi?"}], "n": 2)";
  std::string reply = Post("/v1/chat/completions", chat + R"(, "stream": true})");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  reply = Post("/v1/chat/completions", chat + "}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;

  script = FakeWorker::Script();
  script.fail_after_tokens = 1;
  worker_.SetScript(script);
  reply = Post("/v1/chat/completions", chat + R"(, "stream": true})");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  const auto chunks = JsonOf(reply);
  ASSERT_FALSE(chunks.empty());
  EXPECT_TRUE(chunks.back().contains("error")) << reply;
  EXPECT_EQ(reply.find("data: [DONE]"), std::string::npos) << reply;
  reply = Post("/v1/chat/completions", chat + "}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;

  // One choice of three fails while the others wait after their first token: the stream ends
  // with the error event, and the others' worker calls are cancelled. A sibling's call may not
  // have reached the worker when the failure cancels it (then it never runs there), so what is
  // checked is that every sibling call the worker saw was cancelled.
  const auto expect_siblings_cancelled = [this](int calls_before, int cancellations_before) {
    const int siblings = worker_.generate_calls() - calls_before - 1;  // but the failing one
    EXPECT_TRUE(testing::WaitFor([&] {
      return worker_.cancellations() - cancellations_before >= siblings;
    })) << worker_.cancellations() - cancellations_before
        << " of " << siblings;
  };
  script = FakeWorker::Script();
  script.tokens = {"a", "b", "c"};
  script.fail_after_tokens = 1;
  script.fail_only_seed = 8;
  script.block_after_tokens = 1;
  worker_.SetScript(script);
  const std::string three = R"({"messages": [{"role": "user", "content": "Hi?"}], "n": 3,
      "seed": 7)";
  int calls = worker_.generate_calls(), cancellations = worker_.cancellations();
  reply = Post("/v1/chat/completions", three + R"(, "stream": true})");
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  ASSERT_FALSE(JsonOf(reply).empty()) << reply;
  EXPECT_TRUE(JsonOf(reply).back().contains("error")) << reply;
  EXPECT_EQ(reply.find("data: [DONE]"), std::string::npos) << reply;
  expect_siblings_cancelled(calls, cancellations);
  // Not streamed, the same: the whole request fails, and the two others are cancelled too.
  calls = worker_.generate_calls();
  cancellations = worker_.cancellations();
  reply = Post("/v1/chat/completions", three + "}");
  EXPECT_EQ(reply.rfind("HTTP/1.1 503", 0), 0u) << reply;
  expect_siblings_cancelled(calls, cancellations);
}

}  // namespace
}  // namespace lazyattn::router
