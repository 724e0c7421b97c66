#include "services/router/policy/outlier_detector.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace lazyattn::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

OutlierOptions Options() {
  return {.consecutive_failures = 2,
          .base_ejection = absl::Seconds(2),
          .max_ejection = absl::Seconds(5)};
}

TEST(OutlierDetectorTest, ConsecutiveFailuresEjectAndASuccessfulProbeReadmits) {
  OutlierDetector d(Options());
  EXPECT_TRUE(d.Admitted("w"));
  EXPECT_FALSE(d.Record("w", ProbeResult::kFailed, kT0));
  EXPECT_TRUE(d.Admitted("w"));
  std::string why;
  EXPECT_TRUE(d.Record("w", ProbeResult::kFailed, kT0 + absl::Milliseconds(500), &why));
  EXPECT_NE(why.find("2 failed health probes in a row"), std::string::npos) << why;
  EXPECT_FALSE(d.Admitted("w"));
  // A success before the ejection time is over does not re-admit.
  d.Record("w", ProbeResult::kServing, kT0 + absl::Seconds(1));
  EXPECT_FALSE(d.Admitted("w"));
  // Past the ejection time, but no successful probe yet: still out.
  EXPECT_FALSE(d.Admitted("w"));
  d.Record("w", ProbeResult::kServing, kT0 + absl::Seconds(3));
  EXPECT_TRUE(d.Admitted("w"));
  EXPECT_EQ(d.ejections(), 1);
}

TEST(OutlierDetectorTest, SuccessResetsTheFailureCount) {
  OutlierDetector d(Options());
  d.Record("w", ProbeResult::kFailed, kT0);
  d.Record("w", ProbeResult::kServing, kT0);
  EXPECT_FALSE(d.Record("w", ProbeResult::kFailed, kT0));
  EXPECT_TRUE(d.Admitted("w"));
}

TEST(OutlierDetectorTest, NotServingEjectsAtOnce) {
  OutlierDetector d(Options());
  std::string why;
  EXPECT_TRUE(d.Record("w", ProbeResult::kNotServing, kT0, &why));
  EXPECT_NE(why.find("NOT_SERVING"), std::string::npos) << why;
  EXPECT_FALSE(d.Admitted("w"));
  EXPECT_TRUE(d.Admitted("other"));
  // Still NOT_SERVING after the ejection time: stays out.
  d.Record("w", ProbeResult::kNotServing, kT0 + absl::Seconds(3));
  d.Record("w", ProbeResult::kNotServing, kT0 + absl::Seconds(6));
  EXPECT_FALSE(d.Admitted("w"));
  EXPECT_EQ(d.ejections(), 1);
}

TEST(OutlierDetectorTest, RepeatedEjectionsGrowAndAreCapped) {
  OutlierDetector d(Options());
  absl::Time t = kT0;
  // Ejection n lasts 2 s * n, capped at 5 s: 2, 4, 5, 5.
  for (int n = 1; n <= 4; ++n) {
    ASSERT_TRUE(d.Record("w", ProbeResult::kNotServing, t)) << n;
    const absl::Duration expected = std::min(absl::Seconds(2) * n, absl::Seconds(5));
    d.Record("w", ProbeResult::kServing, t + expected - absl::Milliseconds(1));
    EXPECT_FALSE(d.Admitted("w")) << n;
    t += expected;
    d.Record("w", ProbeResult::kServing, t);
    EXPECT_TRUE(d.Admitted("w")) << n;
    t += absl::Seconds(1);
  }
  // Admitted for max_ejection: the next ejection is short again.
  d.Record("w", ProbeResult::kServing, t + absl::Seconds(5));
  t += absl::Seconds(6);
  ASSERT_TRUE(d.Record("w", ProbeResult::kNotServing, t));
  d.Record("w", ProbeResult::kServing, t + absl::Seconds(2));
  EXPECT_TRUE(d.Admitted("w"));
}

TEST(OutlierDetectorTest, RetainForgetsDepartedWorkers) {
  OutlierDetector d(Options());
  d.Record("a", ProbeResult::kFailed, kT0);  // failing, never ejected
  d.Record("b", ProbeResult::kNotServing, kT0);
  d.Retain({"b"}, kT0);
  EXPECT_TRUE(d.Admitted("a"));
  EXPECT_FALSE(d.Admitted("b"));
  // b is ejected; once it leaves and its ejection is max_ejection past, it is forgotten.
  d.Retain({}, kT0 + absl::Seconds(1));
  EXPECT_FALSE(d.Admitted("b"));
  d.Retain({}, kT0 + Options().base_ejection + Options().max_ejection);
  EXPECT_TRUE(d.Admitted("b"));
}

// A worker that froze, was ejected, lapsed its directory lease (left the registry) and came back
// is still out until a SERVING probe after its ejection time, and its next ejection is longer:
// leaving does not reset the streak.
TEST(OutlierDetectorTest, AnEjectedWorkerThatLeftAndCameBackKeepsItsEjection) {
  OutlierDetector d(Options());
  absl::Time t = kT0;
  ASSERT_TRUE(d.Record("w", ProbeResult::kNotServing, t));  // ejection 1: base_ejection
  d.Retain({}, t + absl::Seconds(1));                       // gone from the registry
  EXPECT_FALSE(d.Admitted("w"));
  t += Options().base_ejection;
  d.Retain({"w"}, t);  // back
  EXPECT_FALSE(d.Admitted("w")) << "re-admitted only by a probe";
  d.Record("w", ProbeResult::kServing, t);
  EXPECT_TRUE(d.Admitted("w"));
  std::string why;
  ASSERT_TRUE(d.Record("w", ProbeResult::kNotServing, t + absl::Seconds(1), &why));
  EXPECT_NE(why.find("ejection 2 in a row"), std::string::npos) << why;
}

TEST(OutlierDetectorTest, DepartedEjectedWorkersKeptAreBounded) {
  OutlierDetector d(Options());
  const size_t n = OutlierDetector::kMaxDepartedKept + 10;
  for (size_t i = 0; i < n; ++i) {
    d.Record(absl::StrCat("w", i), ProbeResult::kNotServing, kT0 + absl::Milliseconds(i));
  }
  d.Retain({}, kT0 + absl::Seconds(1));
  // The ten earliest ejections were forgotten (admitted), the latest kept (still out).
  for (size_t i = 0; i < 10; ++i) EXPECT_TRUE(d.Admitted(absl::StrCat("w", i))) << i;
  for (size_t i = 10; i < n; ++i) EXPECT_FALSE(d.Admitted(absl::StrCat("w", i))) << i;
}

}  // namespace
}  // namespace lazyattn::router
