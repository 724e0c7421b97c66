// Bad input on a Publish stream ends it with the right status naming the field or the limit: a
// first message that is not Hello, malformed messages, and the bounds on workers, entries per
// worker and worker ids (refusals counted); nothing bad is applied.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::Entry;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::KvdirServerTest;
using testing::Pair;
using testing::WaitFor;

TEST_F(KvdirServerTest, FirstMessageMustBeHello) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Heartbeat();
  const grpc::Status s = w.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("hello"));
}

TEST_F(KvdirServerTest, MalformedMessagesEndTheStreamNamingTheField) {
  Start();
  {
    FakeWorker w(stub_.get(), "");
    w.Hello();
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id"));
  }
  {
    FakeWorker w(stub_.get(), "w1");
    w.Join({});
    v1::WorkerMessage m;
    m.mutable_event()->set_kind(v1::DocEvent::KIND_UNSPECIFIED);
    w.Send(m);
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("event.kind"));
  }
  {
    FakeWorker w(stub_.get(), "w2");
    w.Join({Entry(1, 10), Entry(2, -5)});
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries[1].tokens"));
  }
  // Both workers stay registered (their leases run), holding nothing: no bad entry was applied.
  EXPECT_THAT(Tokens({1}), ElementsAre(Pair("w1", 0), Pair("w2", 0)));
}

TEST_F(KvdirServerTest, BoundsEndTheStreamNamingTheLimitAndAreCounted) {
  KvdirOptions options;
  options.limits.max_workers = 1;
  options.limits.max_entries_per_worker = 3;
  options.limits.max_worker_id_length = 8;
  StartWith(options);
  FakeWorker w1(stub_.get(), "w1");
  w1.Join({Entry(1, 10), Entry(2, 20), Entry(3, 30)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 60}}; }));

  // A second worker when one is the maximum.
  FakeWorker w2(stub_.get(), "w2");
  ASSERT_TRUE(w2.Hello());
  grpc::Status s = w2.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_workers 1"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_workers"), 1);
  EXPECT_THAT(LiveWorkers(), ElementsAre("w1"));

  // Replacing an entry it holds is fine at the bound; a fourth entry is not, and drops them all.
  v1::WorkerMessage replace;
  replace.mutable_event()->set_kind(v1::DocEvent::STORED);
  *replace.mutable_event()->mutable_entry() = Entry(3, 31);
  ASSERT_TRUE(w1.Send(replace));
  ASSERT_TRUE(WaitFor([&] { return Tokens({3}) == std::vector<Pair>{{"w1", 31}}; }));
  ASSERT_TRUE(w1.Stored(4, 40));
  s = w1.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("event.stored"));
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_entries_per_worker (3)"));
  EXPECT_THAT(Tokens({1, 2, 3, 4}), ElementsAre(Pair("w1", 0)));  // registered, holding nothing
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries_per_worker"), 1);

  // A snapshot larger than the bound is refused whole.
  FakeWorker again(stub_.get(), "w1");
  again.Join({Entry(1, 1), Entry(2, 2), Entry(3, 3), Entry(4, 4)});
  s = again.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries: 4 entries"));
  EXPECT_THAT(Tokens({1, 2, 3, 4}), ElementsAre(Pair("w1", 0)));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries_per_worker"), 2);

  // Worker ids: too long, or outside the charset.
  for (const std::string& id : std::vector<std::string>{"worker-123", "w 1", std::string("w\0x", 3), "w/1"}) {
    FakeWorker bad(stub_.get(), id);
    ASSERT_TRUE(bad.Hello());
    s = bad.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id: expected 1 to 8"));
  }
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "worker_id"), 4);
  // Host:port ids (a worker's default) and bracketed IPv6 pass the charset.
  KvdirOptions wide;
  wide.limits.max_worker_id_length = 64;
  server_.reset();
  StartWith(wide);
  FakeWorker hostport(stub_.get(), "[::1]:7201");
  hostport.Join({});
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers() == std::vector<std::string>{"[::1]:7201"}; }));
  EXPECT_TRUE(hostport.Close().ok());
}

}  // namespace
}  // namespace lazyattn::kvdir
