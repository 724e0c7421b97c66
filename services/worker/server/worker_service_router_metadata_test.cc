// What the router sends with a call as metadata, and what the worker does with it: the router's
// request id in the worker's log lines, the model the call was routed for (another model is
// refused), PrefillProgress events only when the router asks for them, and the API key's cache
// namespace, which with the request's cache_salt scopes the KV the call shares.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/document_key.h"
#include "common/log.h"
#include "common/worker_call_trailer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/server/worker_service.h"
#include "services/worker/server/worker_service_test_fixture.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using testing::kDocs;
using testing::TextDoc;
using testing::WorkerServiceTest;

// The router sends its request id as x-request-id metadata (forwarding_call.cc); the worker's
// own lines about that request carry it, so one search finds the request at both ends.
TEST_F(WorkerServiceTest, LogLinesAboutARequestCarryTheRoutersRequestId) {
  StartServer();
  const std::string path = absl::StrCat(::testing::TempDir(), "/worker-log-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  SetLogSinkForTest(fd);
  const auto generate = [&](const std::string& id, const v1::GenerateRequest& request) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(kRequestIdKey, id);
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  const grpc::Status served = generate("router-req-4711", Request(kDocs, 2));
  v1::GenerateRequest bad = Request(kDocs, 2);
  bad.mutable_documents(1)->set_text("");
  const grpc::Status refused = generate("router-req-4712", bad);
  SetLogSinkForTest(STDERR_FILENO);
  close(fd);
  EXPECT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  std::string served_line, refused_line, line;
  std::ifstream in(path);
  while (std::getline(in, line)) {
    if (line.find("request_id=router-req-4711") != std::string::npos) served_line = line;
    if (line.find("request_id=router-req-4712") != std::string::npos) refused_line = line;
  }
  EXPECT_THAT(served_line, HasSubstr(" worker: request "));
  EXPECT_THAT(served_line, HasSubstr("status=ok"));
  EXPECT_THAT(served_line, HasSubstr("tokens=2"));
  EXPECT_THAT(refused_line, HasSubstr("request refused"));
  EXPECT_THAT(refused_line, HasSubstr("status=invalid_argument"));
  EXPECT_THAT(refused_line, HasSubstr("documents[1]"));
  ExpectIdle();
}

// The router names the model it routed a call for; a worker holding other weights (restarted with
// a new model at the same address) refuses with UNAVAILABLE, which the router fails over.
TEST_F(WorkerServiceTest, RefusesCallsRoutedForAnotherModel) {
  StartServer();
  v1::WorkerStatus status;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Status(&ctx, v1::WorkerStatusRequest(), &status).ok());
  }
  const std::string mine = ExpectedModelValue(status.model().model_fingerprint(),
                                              status.model().tokenizer_fingerprint());
  const auto generate = [&](const std::string& expected) {
    grpc::ClientContext ctx;
    if (!expected.empty()) ctx.AddMetadata(kExpectedModelKey, expected);
    auto reader = stub_->Generate(&ctx, Request(kDocs, 2));
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  EXPECT_TRUE(generate(mine).ok());
  EXPECT_TRUE(generate("").ok());  // a direct client names no model
  const grpc::Status other = generate(ExpectedModelValue("0123abcd", "tok"));
  EXPECT_EQ(other.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(other.error_message(), HasSubstr("routed for model 0123abcd/tok"));
  // A hostile value (4 KB, not a fingerprint) is refused the same way and not echoed whole.
  const grpc::Status huge = generate(std::string(4000, 'x'));
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(huge.error_message().size(), 600u);
  grpc::ClientContext ctx;
  ctx.AddMetadata(kExpectedModelKey, ExpectedModelValue("0123abcd", "tok"));
  v1::PrefetchRequest prefetch;
  prefetch.add_documents()->set_text("A document to warm.");
  v1::PrefetchResponse response;
  EXPECT_EQ(stub_->Prefetch(&ctx, prefetch, &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  ExpectIdle();
}

// A router asks for PrefillProgress events (its first-token timeout restarts on each): a prompt
// of many steps sends at least one, each before the first token, with the prompt tokens ready so
// far; a direct client that does not ask gets none.
TEST_F(WorkerServiceTest, PrefillProgressOnlyWhenAskedAndOnlyBeforeTheFirstToken) {
  StartServer(/*slow=*/true);
  const auto generate = [&](bool ask) {
    grpc::ClientContext ctx;
    if (ask) ctx.AddMetadata(kPrefillProgressKey, kPrefillProgressValue);
    // ~1,500 byte tokens: over 20 steps of 64 before the first token.
    v1::GenerateRequest request =
        Request({std::string(1500, 'a') + " fresh " + (ask ? "1" : "2")}, 3);
    auto reader = stub_->Generate(&ctx, request);
    std::vector<int64_t> progress;
    int tokens = 0, progress_after_tokens = 0;
    int64_t prompt_tokens = 0;
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      if (m.has_prefill_progress()) {
        progress.push_back(m.prefill_progress().prompt_tokens_ready());
        if (tokens > 0) ++progress_after_tokens;
      }
      if (m.has_token() && m.token().token_id() >= 0) ++tokens;
      if (m.has_final()) prompt_tokens = m.final().usage().prompt_tokens();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(tokens, 3);
    EXPECT_EQ(progress_after_tokens, 0);
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
    for (int64_t ready : progress) {
      EXPECT_GT(ready, 0);
      EXPECT_LT(ready, prompt_tokens);
    }
    return progress.size();
  };
  EXPECT_GE(generate(true), 1u);
  EXPECT_EQ(generate(false), 0u);
  ExpectIdle();
}

// A request that waits for admission behind a running one hears, when its router asked for
// progress, `queued` events while the engine works through the running request (the router's
// first-token timeout restarts on each), then its tokens.
TEST_F(WorkerServiceTest, AQueuedRequestSendsQueuedEventsWhileTheEngineWorks) {
  max_running_ = 1;
  StartServer(/*slow=*/true);
  grpc::ClientContext running_ctx;
  auto running = stub_->Generate(&running_ctx, Request(kDocs, 3000));
  v1::GenerateResponse first;
  ASSERT_TRUE(running->Read(&first));  // admitted: it holds the only running slot
  std::thread drain_running([&] {
    v1::GenerateResponse m;
    while (running->Read(&m)) {
    }
    (void)running->Finish();
  });

  grpc::ClientContext ctx;
  ctx.AddMetadata(kPrefillProgressKey, kPrefillProgressValue);
  auto reader = stub_->Generate(&ctx, Request({"a queued request's own document"}, 3));
  int queued = 0, tokens = 0, queued_after_tokens = 0;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    if (m.has_prefill_progress() && m.prefill_progress().queued()) {
      EXPECT_EQ(m.prefill_progress().prompt_tokens_ready(), 0);
      if (tokens > 0) ++queued_after_tokens;
      // Heard while waiting: let it run (the running request would take far longer).
      if (++queued == 2) running_ctx.TryCancel();
    }
    if (m.has_token() && m.token().token_id() >= 0) ++tokens;
  }
  const grpc::Status status = reader->Finish();
  drain_running.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_GE(queued, 2);
  EXPECT_EQ(tokens, 3);
  EXPECT_EQ(queued_after_tokens, 0);
  ExpectIdle();
}

// Documents a call caches are hit only by calls of the same cache namespace (metadata) and salt
// (request): prefetched under one namespace, another namespace, the shared scope and another salt
// of the same namespace compute them again; the same scope hits them.
TEST_F(WorkerServiceTest, TheCacheNamespaceAndSaltScopeTheKvACallShares) {
  StartServer();
  const auto generate = [&](const std::string& cache_namespace, const std::string& salt) {
    grpc::ClientContext ctx;
    if (!cache_namespace.empty()) ctx.AddMetadata(kCacheNamespaceMetadata, cache_namespace);
    v1::GenerateRequest request = Request({kDocs[0], kDocs[1]}, 2);
    request.set_cache_salt(salt);
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse m;
    int64_t hits = -1;
    while (reader->Read(&m)) {
      if (m.has_final()) hits = m.final().usage().documents_hit();
    }
    const grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    return hits;
  };
  v1::PrefetchRequest prefetch;
  *prefetch.add_documents() = TextDoc(kDocs[0]);
  *prefetch.add_documents() = TextDoc(kDocs[1]);
  grpc::ClientContext ctx;
  ctx.AddMetadata(kCacheNamespaceMetadata, "acme");
  v1::PrefetchResponse prefetched;
  ASSERT_TRUE(stub_->Prefetch(&ctx, prefetch, &prefetched).ok());
  EXPECT_GT(prefetched.computed_tokens(), 0);

  EXPECT_EQ(generate("other", ""), 0);
  EXPECT_EQ(generate("", ""), 0);
  EXPECT_EQ(generate("acme", "user-1"), 0);
  EXPECT_EQ(generate("acme", ""), 2);
  EXPECT_EQ(generate("acme", "user-1"), 2);  // its own scope, cached by its first call
  ExpectIdle();
}

}  // namespace
}  // namespace lazyattn
