#include "services/worker/server/request_end_log.h"

#include <gtest/gtest.h>

namespace lazyattn {
namespace {

RequestResult Streamed(int tokens) {
  RequestResult r;
  r.token_ids.assign(tokens, 7);
  r.finish_reason = "length";
  r.ttft_ms = 90;  // the engine's, from submission: not what the line reports
  return r;
}

// A request that failed after streaming tokens (its deadline passed mid-generation, the worker
// began draining, the device failed) had a first token: its line says when, as the router's
// does. It used to say ttft_s=-1.
TEST(RequestEndLogTest, AFailureAfterTokensReportsItsTimeToFirstToken) {
  const RequestEndLogFields f = RequestEndLogFieldsOf(
      absl::DeadlineExceededError("deadline passed"), Streamed(3), /*first_token_ms=*/250);
  ASSERT_TRUE(f.ttft_s.has_value());
  EXPECT_DOUBLE_EQ(*f.ttft_s, 0.25);
  EXPECT_EQ(f.error, "deadline passed");
  EXPECT_FALSE(f.finish_reason.has_value());
}

TEST(RequestEndLogTest, AFailureBeforeAnyTokenHasNoTimeToFirstToken) {
  const RequestEndLogFields f =
      RequestEndLogFieldsOf(absl::InvalidArgumentError("documents[1]: empty document"),
                            RequestResult{}, /*first_token_ms=*/-1);
  EXPECT_FALSE(f.ttft_s.has_value());
  EXPECT_EQ(f.error, "documents[1]: empty document");
}

// A success reports the same time as its Final's ttft_ms (from arrival at the worker).
TEST(RequestEndLogTest, ASuccessReportsTheTimeItsFinalCarries) {
  const RequestEndLogFields f =
      RequestEndLogFieldsOf(absl::OkStatus(), Streamed(2), /*first_token_ms=*/120);
  ASSERT_TRUE(f.ttft_s.has_value());
  EXPECT_DOUBLE_EQ(*f.ttft_s, 0.12);
  EXPECT_EQ(f.finish_reason, "length");
  EXPECT_FALSE(f.error.has_value());
}

}  // namespace
}  // namespace lazyattn
