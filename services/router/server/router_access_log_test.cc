// The router's access line, one per call: `ttft_s` is the time to the first token the client got,
// and is left out when none came (a -1 there was averaged into dashboards' TTFT by log queries).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "services/router/server/router_server_test_fixture.h"

namespace lazyattn::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RouterServerTest;

// The access lines ("router: request") written to `path` so far.
std::vector<std::string> AccessLines(const std::string& path) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, " request ") || absl::EndsWith(line, " request")) {
      if (absl::StrContains(line, "status=")) lines.emplace_back(line);
    }
  }
  return lines;
}

TEST_F(RouterServerTest, TheAccessLineGivesTtftOnlyWhenATokenCame) {
  StartWorkers(1);
  StartKvdir();
  StartRouter(Options());
  const std::string path = absl::StrCat(::testing::TempDir(), "/router-access-log-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  SetLogSinkForTest(fd);
  const auto served = Stream(Request({"doc"}));
  workers_[0]->SetScript({.fail_before_first_token = grpc::StatusCode::INVALID_ARGUMENT});
  const auto refused = Stream(Request({"doc"}));
  // A call's line is written when the router's side of it ends, which may follow the client's.
  std::vector<std::string> lines = AccessLines(path);
  for (const absl::Time until = absl::Now() + absl::Seconds(10);
       lines.size() < 2 && absl::Now() < until; lines = AccessLines(path)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  SetLogSinkForTest(STDERR_FILENO);
  close(fd);
  std::remove(path.c_str());
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("status=ok"));
  EXPECT_THAT(lines[0], HasSubstr("ttft_s="));
  EXPECT_THAT(lines[1], HasSubstr("status=invalid_argument"));
  EXPECT_THAT(lines[1], Not(HasSubstr("ttft_s")));
  EXPECT_THAT(lines[1], HasSubstr("duration_s="));
}

}  // namespace
}  // namespace lazyattn::router
