// Documents reused across requests: the same documents in another order hit the cache, Prefetch
// computes documents once and then reports them cached, and Status reports the worker's identity,
// model, load and cache.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lazyattn/v1/worker.grpc.pb.h"
#include "services/worker/server/worker_service.h"
#include "services/worker/server/worker_service_test_fixture.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;
using testing::kDocs;
using testing::MetricValue;
using testing::StreamResult;
using testing::TextDoc;
using testing::WorkerServiceTest;

TEST_F(WorkerServiceTest, SameDocumentsInAnotherOrderHitTheCache) {
  StartServer();
  const StreamResult first = Generate(Request(kDocs, 4));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const StreamResult second = Generate(Request({kDocs[2], kDocs[0], kDocs[1]}, 4));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  ASSERT_TRUE(second.final.has_value());
  const v1::Usage& u = second.final->usage();
  EXPECT_EQ(u.documents_hit(), 3);
  int64_t doc_tokens = 0;
  for (const std::string& d : kDocs) doc_tokens += static_cast<int64_t>(d.size());  // bytes
  EXPECT_GE(u.cached_tokens(), doc_tokens);
  ExpectIdle();
  const v1::WorkerStatus s = Status();
  EXPECT_EQ(s.cached_documents(), 3);
  EXPECT_GT(s.cached_blocks(), 0);
  server_->RefreshMetrics();
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_hit_tokens_total",
                        {{"mode", "lazy"}}),
            static_cast<double>(doc_tokens));
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_lookup_tokens_total",
                        {{"mode", "lazy"}}),
            2.0 * doc_tokens);
  // The second request's documents were not tokenized again (the engine's token cache).
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_prep_total",
                        {{"document", "text"}, {"result", "computed"}}),
            3.0);
  EXPECT_EQ(MetricValue(*server_->registry(), "lazyattn_worker_document_prep_total",
                        {{"document", "text"}, {"result", "reused"}}),
            3.0);
}

TEST_F(WorkerServiceTest, PrefetchComputesOnceThenReportsCachedTokens) {
  StartServer();
  v1::PrefetchRequest p;
  *p.add_documents() = TextDoc(kDocs[0]);
  *p.add_documents() = TextDoc(kDocs[1]);
  const int64_t tokens = static_cast<int64_t>(kDocs[0].size() + kDocs[1].size());
  {
    grpc::ClientContext ctx;
    v1::PrefetchResponse r;
    ASSERT_TRUE(stub_->Prefetch(&ctx, p, &r).ok());
    EXPECT_EQ(r.computed_tokens(), tokens);
    EXPECT_EQ(r.cached_tokens(), 0);
    EXPECT_THAT(r.workers(), ::testing::ElementsAre("worker-under-test"));
  }
  {
    grpc::ClientContext ctx;
    v1::PrefetchResponse r;
    ASSERT_TRUE(stub_->Prefetch(&ctx, p, &r).ok());
    EXPECT_EQ(r.computed_tokens(), 0);
    EXPECT_EQ(r.cached_tokens(), tokens);
  }
  const StreamResult g = Generate(Request({kDocs[1], kDocs[2], kDocs[0]}, 2));
  ASSERT_TRUE(g.final.has_value()) << g.status.error_message();
  EXPECT_EQ(g.final->usage().documents_hit(), 2);
  {
    p.set_cache_mode(v1::CACHE_MODE_FULL);
    grpc::ClientContext ctx;
    v1::PrefetchResponse r;
    const grpc::Status s = stub_->Prefetch(&ctx, p, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("cache_mode"));
  }
  ExpectIdle();
}

TEST_F(WorkerServiceTest, StatusReportsIdentityModelAndLoad) {
  StartServer();
  const v1::WorkerStatus s = Status();
  EXPECT_EQ(s.worker_id(), "worker-under-test");
  EXPECT_EQ(s.address(), absl::StrCat("127.0.0.1:", server_->port()));
  EXPECT_EQ(s.model().name(), "tiny-test");
  EXPECT_EQ(s.model().vocab_size(), 300);
  EXPECT_EQ(s.model().max_documents(), 4);
  EXPECT_EQ(s.model().model_fingerprint(), server_->engine().identity().model_fingerprint);
  EXPECT_EQ(s.load().total_blocks(), 512);
  EXPECT_EQ(s.load().free_blocks(), 512);
  EXPECT_EQ(s.referenced_blocks(), 0);
  EXPECT_EQ(s.cached_documents(), 0);
}

}  // namespace
}  // namespace lazyattn
