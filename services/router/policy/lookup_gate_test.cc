#include "services/router/policy/lookup_gate.h"

#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

using Decision = LookupGate::Decision;
const absl::Time kT0 = absl::FromUnixSeconds(1000);

LookupGate Gate() {
  return LookupGate({.failures_to_skip = 3,
                     .base_backoff = absl::Seconds(1),
                     .max_backoff = absl::Seconds(3)});
}

TEST(LookupGateTest, AnAnswerBetweenFailuresKeepsLookingUp) {
  LookupGate gate = Gate();
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(gate.Decide(kT0), Decision::kLookUp);
    gate.Record(/*answered=*/i % 3 == 2, /*trial=*/false, kT0);
  }
  EXPECT_FALSE(gate.skipping());
}

TEST(LookupGateTest, FailuresInARowSkipLookupsThenOneTrialGoesOut) {
  LookupGate gate = Gate();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(gate.Decide(kT0), Decision::kLookUp);
    EXPECT_EQ(gate.Record(false, false, kT0), i == 2) << "the third starts skipping";
  }
  EXPECT_TRUE(gate.skipping());
  EXPECT_EQ(gate.Decide(kT0 + absl::Milliseconds(999)), Decision::kSkip);
  const absl::Time t1 = kT0 + absl::Seconds(1);
  EXPECT_EQ(gate.Decide(t1), Decision::kTrial);
  EXPECT_EQ(gate.Decide(t1), Decision::kSkip) << "one trial at a time";
  EXPECT_TRUE(gate.Record(/*answered=*/true, /*trial=*/true, t1));
  EXPECT_FALSE(gate.skipping());
  EXPECT_EQ(gate.Decide(t1), Decision::kLookUp);
}

TEST(LookupGateTest, FailedTrialsDoubleTheBackoffUpToTheMaximum) {
  LookupGate gate = Gate();
  for (int i = 0; i < 3; ++i) gate.Record(false, false, kT0);
  absl::Time t = kT0 + absl::Seconds(1);
  ASSERT_EQ(gate.Decide(t), Decision::kTrial);
  gate.Record(false, true, t);
  EXPECT_EQ(gate.backoff(), absl::Seconds(2));
  EXPECT_EQ(gate.Decide(t + absl::Milliseconds(1999)), Decision::kSkip);
  t += absl::Seconds(2);
  ASSERT_EQ(gate.Decide(t), Decision::kTrial);
  gate.Record(false, true, t);
  EXPECT_EQ(gate.backoff(), absl::Seconds(3)) << "capped";
}

// Lookups sent before the gate closed report while it is closed: neither their answers nor their
// failures move it.
TEST(LookupGateTest, OutcomesOfLookupsSentBeforeItClosedChangeNothing) {
  LookupGate gate = Gate();
  for (int i = 0; i < 3; ++i) gate.Record(false, false, kT0);
  gate.Record(/*answered=*/true, /*trial=*/false, kT0);
  EXPECT_TRUE(gate.skipping());
  gate.Record(/*answered=*/false, /*trial=*/false, kT0 + absl::Milliseconds(900));
  EXPECT_EQ(gate.Decide(kT0 + absl::Seconds(1)), Decision::kTrial);
}

TEST(LookupGateTest, AnotherAnswerFromTheDirectoryMakesTheNextLookupATrial) {
  LookupGate gate = Gate();
  for (int i = 0; i < 3; ++i) gate.Record(false, false, kT0);
  const absl::Time t = kT0 + absl::Milliseconds(100);
  ASSERT_EQ(gate.Decide(t), Decision::kSkip);
  gate.TrialNow(t);
  EXPECT_EQ(gate.Decide(t), Decision::kTrial);
  EXPECT_EQ(gate.Decide(t), Decision::kSkip);
}

TEST(LookupGateTest, ZeroFailuresToSkipNeverSkips) {
  LookupGate gate({.failures_to_skip = 0});
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(gate.Record(false, false, kT0));
  EXPECT_EQ(gate.Decide(kT0), Decision::kLookUp);
}

}  // namespace
}  // namespace lazyattn::router
