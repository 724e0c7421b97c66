// The directory server's own life: shutdown ends open streams at once so workers reconnect,
// bad options are refused naming the option, the metrics endpoint binds an OS-chosen port, and
// gRPC reflection answers only when configured.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST_F(KvdirServerTest, ShutdownEndsOpenStreamsSoWorkersReconnect) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}) == std::vector<Pair>{{"w1", 10}}; }));
  const absl::Time start = absl::Now();
  server_->Shutdown();  // must not wait for the worker to hang up
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_FALSE(w.Drain().ok());
}

TEST_F(KvdirServerTest, BadOptionsAreRejectedNamingTheOption) {
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.lease_ms = 0;
  auto server = KvdirServer::Create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("lease_ms"));
}

TEST_F(KvdirServerTest, MetricsEndpointBindsAnOsChosenPort) {
  KvdirOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  auto server = KvdirServer::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->metrics_port(), 0);
}

TEST_F(KvdirServerTest, ReflectionOnlyWhenConfigured) {
  for (bool reflection : {false, true}) {
    KvdirOptions options;
    options.reflection = reflection;
    server_.reset();
    StartWith(options);
    // ServerReflectionInfo is a bidi stream; an unregistered method ends UNIMPLEMENTED at once.
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(
        &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    // list_services: field 7 (string), empty.
    grpc::Slice slice(std::string("\x3a\x00", 2));
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(3));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    const bool answered = ok;
    std::string text;
    if (answered) {
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(response.Dump(&slices).ok());
      for (const auto& sl : slices) text.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    if (answered) ctx.TryCancel();  // reflection would keep the stream open for more
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    ASSERT_TRUE(cq.Next(&tag, &ok));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (reflection) {
      EXPECT_TRUE(answered);
      EXPECT_THAT(text, HasSubstr("lazyattn.v1.KvDirectory"));
    } else {
      EXPECT_FALSE(answered);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
    }
  }
}

}  // namespace
}  // namespace lazyattn::kvdir
