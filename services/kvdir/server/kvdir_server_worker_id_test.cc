// One live worker per id, over real gRPC: a second live process with the same id is refused naming
// the id and where it runs (by address, or by the peer host when both advertise one address), the
// first keeps working, and the second takes the id over once the first is gone. Likewise one live
// worker per advertised address.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kvdir_stream_trailer.h"
#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using testing::Entry;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::KvdirServerTest;
using testing::Pair;
using testing::WaitFor;

// Two live processes with one worker id (a copied --worker-id): the second is refused naming
// the id and where it runs, instead of the two taking the id from each other in turn.
TEST_F(KvdirServerTest, ASecondLiveWorkerWithTheSameIdIsRefusedAndTheFirstKeepsWorking) {
  Start();
  FakeWorker holder(stub_.get(), "w1");
  holder.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));

  FakeWorker copy(stub_.get(), "w1");
  ASSERT_TRUE(copy.Hello(/*epoch=*/2, "10.0.0.9:7000"));
  const grpc::Status s = copy.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id: \"w1\" is held by a live "
                                           "worker at w1:7000"));
  EXPECT_THAT(s.error_message(), HasSubstr("10.0.0.9:7000"));
  EXPECT_THAT(s.error_message(), HasSubstr("own worker id"));
  EXPECT_EQ(copy.Trailer(kWorkerIdHolderKey), "w1:7000");
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "worker_id_in_use"), 1);
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "not_certificate_id"), 0);

  // The holder's session, address and entries are intact: its next event and heartbeat are
  // applied (a replaced session would have its stream ended ABORTED), and it closes cleanly.
  ASSERT_TRUE(holder.Stored(2, 20));
  ASSERT_TRUE(holder.Heartbeat(/*running=*/5));
  ASSERT_TRUE(WaitFor([&] {
    v1::LookupResponse r;
    return Lookup({1, 2}, &r).ok() && r.workers_size() == 1 &&
           r.workers(0).resident_tokens() == 30 &&
           r.workers(0).worker().load().running_requests() == 5;
  }));
  v1::LookupResponse r;
  ASSERT_TRUE(Lookup({1, 2}, &r).ok());
  ASSERT_EQ(r.workers_size(), 1);
  EXPECT_EQ(r.workers(0).worker().address(), "w1:7000");
  EXPECT_TRUE(holder.Close().ok());

  // Once the holder is gone the other process takes the id over at once (its retry).
  FakeWorker retry(stub_.get(), "w1");
  retry.Join({Entry(3, 30)}, /*epoch=*/2, "10.0.0.9:7000");
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 30}}; }));
  ASSERT_TRUE(Lookup({}, &r).ok());
  ASSERT_EQ(r.workers_size(), 1);
  EXPECT_EQ(r.workers(0).worker().address(), "10.0.0.9:7000");
  EXPECT_TRUE(retry.Close().ok());
}

// Whether this machine has an IPv6 loopback (containers may run without one).
bool HaveIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// Two copies that also advertise one address (a compose service scaled to two: both say
// w1:7000) on two hosts: the hosts their streams come from tell them apart. To kvdir listening
// on [::], a client dialling 127.0.0.1 and one dialling [::1] are two peer hosts (127.0.0.2 would
// not do: Linux connects to it from 127.0.0.1).
TEST_F(KvdirServerTest, ACopyAdvertisingTheHoldersAddressFromAnotherHostIsRefused) {
  if (!HaveIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback to connect from a second host";
  StartWith(KvdirOptions{}, "[::]:0");
  FakeWorker holder(stub_.get(), "w1");  // from 127.0.0.1
  holder.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));

  auto other_host = v1::KvDirectory::NewStub(grpc::CreateChannel(
      absl::StrCat("[::1]:", server_->port()), grpc::InsecureChannelCredentials()));
  FakeWorker copy(other_host.get(), "w1");
  ASSERT_TRUE(copy.Hello(/*epoch=*/2));  // the holder's address, w1:7000
  const grpc::Status s = copy.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("\"w1\" is held by a live worker at w1:7000 (connected from 127.0.0.1); "
                        "this hello came from w1:7000 (connected from [::1]): two processes "
                        "advertise one address from two hosts"));
  EXPECT_THAT(s.error_message(), HasSubstr("own worker id"));
  EXPECT_EQ(copy.Trailer(kWorkerIdHolderKey), "w1:7000");
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "worker_id_in_use"), 1);

  // The holder keeps its session and entries: its next event is applied, it closes cleanly.
  ASSERT_TRUE(holder.Stored(2, 20));
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2}) == std::vector<Pair>{{"w1", 30}}; }));
  EXPECT_TRUE(holder.Close().ok());

  // Once the holder is gone the copy on the other host takes the id over (its retry).
  FakeWorker retry(other_host.get(), "w1");
  retry.Join({Entry(3, 30)}, /*epoch=*/2);
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 30}}; }));
  EXPECT_TRUE(retry.Close().ok());
}

// Another worker id advertising a live worker's address (a copied advertise_address, or a peer
// trying to take another worker's requests) is refused naming the field and the holder.
TEST_F(KvdirServerTest, AnotherWorkerAdvertisingALiveWorkersAddressIsRefused) {
  Start();
  FakeWorker holder(stub_.get(), "w1");
  holder.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));
  FakeWorker claimant(stub_.get(), "w9");
  ASSERT_TRUE(claimant.Hello(/*epoch=*/3, "w1:7000"));
  const grpc::Status s = claimant.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("hello.status.address: w1:7000 is advertised by live worker w1"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_hellos_refused_total", "address_in_use"), 1);
  EXPECT_EQ(LiveWorkers(), std::vector<std::string>{"w1"});
  ASSERT_TRUE(holder.Stored(2, 20));
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2}) == std::vector<Pair>{{"w1", 30}}; }));
  EXPECT_TRUE(holder.Close().ok());
}

}  // namespace
}  // namespace lazyattn::kvdir
