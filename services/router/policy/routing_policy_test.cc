#include "services/router/policy/routing_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;

PolicyOptions Options(PolicyKind kind) {
  PolicyOptions o;
  o.kind = kind;
  o.queued_token_weight = 1.0;
  o.running_request_tokens = 100;
  o.imbalance_ratio = 2.0;
  o.imbalance_min_tokens = 1000;
  return o;
}

TEST(RoutingPolicyTest, ParsesPolicyNames) {
  EXPECT_EQ(*ParsePolicyKind("cache_aware"), PolicyKind::kCacheAware);
  EXPECT_EQ(*ParsePolicyKind("least_loaded"), PolicyKind::kLeastLoaded);
  EXPECT_EQ(*ParsePolicyKind("round_robin"), PolicyKind::kRoundRobin);
  auto bad = ParsePolicyKind("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("\"random\""));
}

TEST(RoutingPolicyTest, CacheAwareTradesHitsAgainstLoad) {
  RoutingPolicy policy(Options(PolicyKind::kCacheAware));
  // a: 500 hits, load 100 (1 request) -> 400; b: 0 hits, idle -> 0; c: 900 hits, load 600 -> 300.
  std::vector<Candidate> c = {{"a", 500, 0, 1}, {"b", 0, 0, 0}, {"c", 900, 500, 1}};
  Ranking r = policy.Rank(c);
  EXPECT_THAT(r.order, ElementsAre(0, 2, 1));
  EXPECT_FALSE(r.imbalance_fallback);
}

TEST(RoutingPolicyTest, ImbalanceGuardFallsBackToLoad) {
  RoutingPolicy policy(Options(PolicyKind::kCacheAware));
  // "hot" holds 5000 tokens but has 1500 queued: score 3500 beats idle "cold" (0), yet its load
  // (1500) exceeds 2x the least (0) and by more than 1000 tokens: route by load.
  std::vector<Candidate> c = {{"hot", 5000, 1500, 0}, {"cold", 0, 0, 0}};
  Ranking r = policy.Rank(c);
  EXPECT_THAT(r.order, ElementsAre(1, 0));
  EXPECT_TRUE(r.imbalance_fallback);

  // Below the absolute threshold the hits win.
  std::vector<Candidate> mild = {{"hot", 5000, 900, 0}, {"cold", 0, 0, 0}};
  r = policy.Rank(mild);
  EXPECT_THAT(r.order, ElementsAre(0, 1));
  EXPECT_FALSE(r.imbalance_fallback);

  // Above the absolute threshold but within the ratio: hits win.
  std::vector<Candidate> busy = {{"hot", 9000, 3000, 0}, {"cold", 0, 1800, 0}};
  r = policy.Rank(busy);
  EXPECT_THAT(r.order, ElementsAre(0, 1));
  EXPECT_FALSE(r.imbalance_fallback);
}

// Mode block: a worker holding the documents at another offset copies them, most of a hit's
// saving: it beats an idle worker without them, but not one with the same tokens as hits.
TEST(RoutingPolicyTest, CopyableTokensCountAtTheirWeight) {
  RoutingPolicy policy(Options(PolicyKind::kCacheAware));  // copy_token_weight 0.9
  std::vector<Candidate> c = {{.id = "empty"},
                              {.id = "copy", .queued_prefill_tokens = 400, .copy_tokens = 500},
                              {.id = "hit", .hit_tokens = 500, .queued_prefill_tokens = 400}};
  EXPECT_EQ(policy.Rank(c).order, (std::vector<size_t>{2, 1, 0}));
  c[2].hit_tokens = 0;  // 500 * 0.9 = 450 > 400 queued: the copier still beats the idle worker
  EXPECT_EQ(policy.Rank(c).order[0], 1u);
  c[1].queued_prefill_tokens = 460;  // 450 < 460: no longer
  EXPECT_EQ(policy.Rank(c).order[0], 0u);
}

TEST(RoutingPolicyTest, LeastLoadedIgnoresHits) {
  RoutingPolicy policy(Options(PolicyKind::kLeastLoaded));
  std::vector<Candidate> c = {{"a", 10000, 300, 0}, {"b", 0, 0, 2}, {"c", 0, 50, 0}};
  EXPECT_THAT(policy.Rank(c).order, ElementsAre(2, 1, 0));
}

TEST(RoutingPolicyTest, RoundRobinCyclesWhateverTheInputOrder) {
  RoutingPolicy policy(Options(PolicyKind::kRoundRobin));
  std::vector<Candidate> c = {{"w2", 0, 0, 0}, {"w0", 9999, 0, 0}, {"w1", 0, 9999, 9}};
  std::vector<std::string> firsts;
  for (int i = 0; i < 6; ++i) {
    Ranking r = policy.Rank(c);
    ASSERT_EQ(r.order.size(), 3u);
    firsts.push_back(c[r.order[0]].id);
    // The rest of the order continues the cycle, so retries go to the next worker.
    EXPECT_EQ(c[r.order[1]].id,
              c[r.order[0]].id == "w2" ? "w0" : (c[r.order[0]].id == "w0" ? "w1" : "w2"));
  }
  EXPECT_THAT(firsts, ElementsAre("w0", "w1", "w2", "w0", "w1", "w2"));
}

TEST(RoutingPolicyTest, TiesRotateOverIdleWorkers) {
  RoutingPolicy policy(Options(PolicyKind::kCacheAware));
  std::vector<Candidate> c = {{"a", 0, 0, 0}, {"b", 0, 0, 0}};
  std::vector<size_t> firsts;
  for (int i = 0; i < 4; ++i) firsts.push_back(policy.Rank(c).order[0]);
  EXPECT_THAT(firsts, ElementsAre(0, 1, 0, 1));
}

TEST(RoutingPolicyTest, NoCandidates) {
  RoutingPolicy policy(Options(PolicyKind::kCacheAware));
  EXPECT_TRUE(policy.Rank({}).order.empty());
}

}  // namespace
}  // namespace lazyattn::router
