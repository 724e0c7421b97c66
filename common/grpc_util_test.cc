// The gRPC health check client against a real server's grpc.health.v1 service.
#include "common/grpc_util.h"

#include <grpcpp/health_check_service_interface.h>

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(CheckGrpcHealthTest, ReportsTheServersStatus) {
  // gRPC builds no server without a service to poll for; reflection is the one at hand here.
  auto built = StartGrpcServer({.listen_address = "127.0.0.1:0", .reflection = true}, {});
  ASSERT_TRUE(built.ok()) << built.status();
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(built->port), {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  auto serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_TRUE(*serving);
  // What a worker does when it starts shutting down.
  built->server->GetHealthCheckService()->SetServingStatus(false);
  serving = CheckGrpcHealth(*channel, "", absl::Seconds(5));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  // A service the server does not know.
  serving = CheckGrpcHealth(*channel, "no.such.Service", absl::Seconds(5));
  EXPECT_EQ(serving.status().code(), absl::StatusCode::kNotFound) << serving.status();
  built->server->Shutdown();
}

TEST(CheckGrpcHealthTest, NothingListeningIsAnErrorWithinTheTimeout) {
  // Port 9 (discard) on loopback: nothing listens there in a test environment.
  auto channel = MakeChannel("127.0.0.1:9", {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  const absl::Time start = absl::Now();
  auto serving = CheckGrpcHealth(*channel, "", absl::Milliseconds(500));
  EXPECT_FALSE(serving.ok());
  EXPECT_TRUE(serving.status().code() == absl::StatusCode::kUnavailable ||
              serving.status().code() == absl::StatusCode::kDeadlineExceeded)
      << serving.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace lazyattn
