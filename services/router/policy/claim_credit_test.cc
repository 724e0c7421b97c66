#include "services/router/policy/claim_credit.h"

#include <gtest/gtest.h>

#include <string>

namespace lazyattn::router {
namespace {

TEST(ClaimCreditTest, AWorkerWhoseClaimsComeTrueKeepsFullCredit) {
  ClaimCredit credit;
  EXPECT_EQ(credit.Credit("w0"), 1);  // never observed
  for (int i = 0; i < 100; ++i) {
    // Every fifth request misses what was evicted before admission: 80 % reused.
    const ClaimCreditChange c = credit.Observe("w0", 1000, i % 5 == 0 ? 0 : 1000);
    EXPECT_FALSE(c.lost);
  }
  EXPECT_EQ(credit.Credit("w0"), 1);
  EXPECT_EQ(credit.Distrusted({"w0"}), 0);
}

TEST(ClaimCreditTest, AWorkerThatReusesNothingItClaimsLosesItsCreditAfterMinObservations) {
  ClaimCredit credit({.min_observations = 8});
  for (int i = 0; i < 7; ++i) {
    EXPECT_FALSE(credit.Observe("liar", 500, 0).lost) << "observation " << i;
    EXPECT_EQ(credit.Credit("liar"), 1);
  }
  const ClaimCreditChange lost = credit.Observe("liar", 500, 0);
  EXPECT_TRUE(lost.lost);
  EXPECT_EQ(lost.credit, 0);
  EXPECT_EQ(credit.Credit("liar"), 0);
  EXPECT_EQ(credit.Distrusted({"liar", "other"}), 1);
  EXPECT_EQ(credit.Distrusted({"other"}), 0);
  EXPECT_EQ(credit.Credit("other"), 1);
}

TEST(ClaimCreditTest, CreditIsTheReusedShareAndComesBackWhenClaimsComeTrue) {
  ClaimCredit credit({.decay = 0.9, .min_observations = 4, .distrust_below = 0.5});
  for (int i = 0; i < 10; ++i) credit.Observe("w", 1000, 300);
  EXPECT_NEAR(credit.Credit("w"), 0.3, 1e-9);
  // A reuse larger than the claim (a document named twice) counts as the claim.
  bool regained = false;
  for (int i = 0; i < 40 && !regained; ++i) regained = credit.Observe("w", 1000, 5000).regained;
  EXPECT_TRUE(regained);
  EXPECT_EQ(credit.Credit("w"), 1);
  EXPECT_EQ(credit.Distrusted({"w"}), 0);
}

// Every request weighs the same, whatever its size: one large miss (a document a client had
// evicted by a larger one) costs an honest worker one request's share, not its credit.
TEST(ClaimCreditTest, OneLargeMissCostsOneRequestsShare) {
  ClaimCredit credit;
  for (int i = 0; i < 40; ++i) credit.Observe("w", 100, 100);
  const ClaimCreditChange c = credit.Observe("w", int64_t{1} << 30, 0);
  EXPECT_FALSE(c.lost);
  EXPECT_GT(c.share, 0.95);
  EXPECT_EQ(credit.Credit("w"), 1);
}

TEST(ClaimCreditTest, ClaimsOfNothingAndNegativeReusesTeachNothingWrong) {
  ClaimCredit credit({.min_observations = 1});
  EXPECT_FALSE(credit.Observe("w", 0, 0).lost);
  EXPECT_FALSE(credit.Observe("w", -5, 0).lost);
  EXPECT_EQ(credit.Credit("w"), 1);
  EXPECT_TRUE(credit.Observe("w", 100, -7).lost);  // a negative reuse counts as none
  EXPECT_EQ(credit.Credit("w"), 0);
}

TEST(ClaimCreditTest, RetainForgetsDepartedWorkersButNotTheirDistrust) {
  ClaimCredit credit({.min_observations = 2, .distrust_below = 0.6});
  credit.Observe("honest", 100, 100);
  credit.Observe("liar", 100, 0);
  credit.Observe("liar", 100, 0);
  credit.Retain({});
  EXPECT_EQ(credit.Credit("liar"), 0);  // leaving and coming back does not restore it
  EXPECT_EQ(credit.Distrusted({"honest", "liar"}), 1);
  // "honest" was forgotten: one miss is its first observation again, below min_observations
  // (kept, it would be its second, a mean share of 0.5).
  EXPECT_FALSE(credit.Observe("honest", 100, 0).lost);
  EXPECT_EQ(credit.Credit("honest"), 1);
}

TEST(ClaimCreditTest, PastItsCapacityNewWorkersAreNotTracked) {
  ClaimCredit credit({.min_observations = 1});
  for (size_t i = 0; i < ClaimCredit::kMaxWorkers; ++i) {
    credit.Observe("w" + std::to_string(i), 100, 100);
  }
  EXPECT_FALSE(credit.Observe("late", 100, 0).lost);
  EXPECT_EQ(credit.Credit("late"), 1);
}

}  // namespace
}  // namespace lazyattn::router
