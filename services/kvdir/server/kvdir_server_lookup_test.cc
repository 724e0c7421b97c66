// The directory's Lookup as a router calls it: the request's cache mode and offsets decide what
// counts as resident, and too many keys, bad offsets or an unknown mode are INVALID_ARGUMENT naming
// the field.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using testing::Entry;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::Key;
using testing::KvdirServerTest;
using testing::Pair;
using testing::WaitFor;

TEST_F(KvdirServerTest, LookupWithTooManyKeysIsInvalidArgumentNamingKeys) {
  Start(/*lease_ms=*/3000, /*max_keys=*/4);
  v1::LookupResponse response;
  EXPECT_TRUE(Lookup({1, 2, 3, 4}, &response).ok());
  const grpc::Status s = Lookup({1, 2, 3, 4, 5}, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("keys"));
  EXPECT_THAT(s.error_message(), HasSubstr("at most 4"));
}

// The request's mode and offsets decide what counts as resident (docs/kvdir.md).
TEST_F(KvdirServerTest, LookupCountsOnlyEntriesTheRequestsModeReuses) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 100, 37), Entry(2, 50)});  // key 1 in block mode at 37, key 2 position-free
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2}) == std::vector<Pair>{{"w1", 150}}; }));
  auto lookup = [&](v1::CacheMode mode, std::vector<int64_t> offsets) {
    v1::LookupRequest request;
    *request.add_keys() = Key(1);
    *request.add_keys() = Key(2);
    request.set_mode(mode);
    for (int64_t o : offsets) request.add_offsets(o);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::LookupResponse response;
    const grpc::Status s = stub_->Lookup(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (response.workers_size() != 1) {
      return absl::StrCat("workers: ", response.workers_size());
    }
    std::string out = std::to_string(response.workers(0).resident_tokens());
    for (bool b : response.workers(0).resident()) out += b ? " 1" : " 0";
    return out;
  };
  EXPECT_EQ(lookup(v1::CACHE_MODE_LAZY, {}), "50 0 1");
  EXPECT_EQ(lookup(v1::CACHE_MODE_BLOCK, {37, 2048}), "100 1 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_BLOCK, {0, 37}), "0 0 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_BLOCK, {}), "0 0 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_PREFIX, {}), "0 0 0");
  EXPECT_EQ(lookup(v1::CACHE_MODE_UNSPECIFIED, {}), "150 1 1");
  EXPECT_TRUE(w.Close().ok());
}

TEST_F(KvdirServerTest, LookupWithBadOffsetsOrModeIsInvalidArgumentNamingTheField) {
  Start();
  auto status = [&](int mode, std::vector<int64_t> offsets) {
    v1::LookupRequest request;
    *request.add_keys() = Key(1);
    *request.add_keys() = Key(2);
    request.set_mode(static_cast<v1::CacheMode>(mode));
    for (int64_t o : offsets) request.add_offsets(o);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::LookupResponse response;
    return stub_->Lookup(&ctx, request, &response);
  };
  grpc::Status s = status(v1::CACHE_MODE_BLOCK, {0});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("offsets: 1 offsets for 2 keys"));
  s = status(v1::CACHE_MODE_BLOCK, {0, -2});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("offsets[1]"));
  s = status(99, {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("mode: unknown cache mode 99"));
  EXPECT_TRUE(status(v1::CACHE_MODE_BLOCK, {-1, 0}).ok());
}

}  // namespace
}  // namespace lazyattn::kvdir
