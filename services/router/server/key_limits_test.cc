// Per-key limits: the key file's `limits`, the token bucket on a controlled clock, the in-flight
// cap and its slots, and how both follow a reload.
#include "services/router/server/key_limits.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <span>
#include <string>
#include <vector>

#include "services/router/server/api_key_auth.h"

namespace lazyattn::router {
namespace {

const std::string kHash(64, 'a');

std::string Metrics(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST(ParseApiKeysLimits, ReadsLimitsAndDefaultsTheBurstToTheRate) {
  auto t = ParseApiKeys("keys:\n  - name: a\n    sha256: " + kHash +
                            "\n    scopes: [generate]\n    limits: {requests_per_second: 2.5, "
                            "max_in_flight: 3}\n  - name: b\n    sha256: " +
                            std::string(64, 'b') +
                            "\n    scopes: [generate]\n"
                            "    limits: {requests_per_second: 0.5, burst: 4}\n  - name: c\n"
                            "    sha256: " +
                            std::string(64, 'c') + "\n    scopes: [admin]\n",
                        "k.yaml");
  ASSERT_TRUE(t.ok()) << t.status();
  const KeyLimits& a = t->at(kHash).limits;
  EXPECT_DOUBLE_EQ(a.requests_per_second, 2.5);
  EXPECT_DOUBLE_EQ(a.burst, 2.5);
  EXPECT_EQ(a.max_in_flight, 3);
  const KeyLimits& b = t->at(std::string(64, 'b')).limits;
  EXPECT_DOUBLE_EQ(b.burst, 4);
  EXPECT_EQ(b.max_in_flight, 0);
  const KeyLimits& c = t->at(std::string(64, 'c')).limits;  // no limits: none
  EXPECT_EQ(c.requests_per_second, 0);
  EXPECT_EQ(c.max_in_flight, 0);
}

TEST(ParseApiKeysLimits, NamesTheBadLimit) {
  struct Case {
    std::string limits, needle;
  } cases[] = {
      {"limits: 3", "keys[0].limits: expected a map"},
      {"limits: {requests_per_second: 0}", "keys[0].limits.requests_per_second: must be in (0"},
      {"limits: {requests_per_second: -1}", "limits.requests_per_second"},
      {"limits: {requests_per_second: fast}",
       "k.yaml: keys[0].limits.requests_per_second: expected a number, got \"fast\""},
      {"limits: {requests_per_second: [1]}",
       "keys[0].limits.requests_per_second: expected a number, got \"\""},
      {"limits: {requests_per_second: 1, burst: 0.5}", "keys[0].limits.burst: must be in [1"},
      {"limits: {burst: 5}", "keys[0].limits.burst: needs requests_per_second"},
      {"limits: {max_in_flight: 0}", "keys[0].limits.max_in_flight: must be a whole number in [1"},
      {"limits: {max_in_flight: 2.5}",
       "keys[0].limits.max_in_flight: must be a whole number in [1, 1000000], got 2.5"},
      // Past int64: named, where YAML's conversion said only "bad conversion".
      {"limits: {max_in_flight: 9223372036854775808}",
       "keys[0].limits.max_in_flight: must be a whole number in [1, 1000000], got "
       "9223372036854775808"},
      {"limits: {per_day: 5}", "keys[0].limits.per_day: unknown limit"},
      {"limits: {per_day: lots}", "keys[0].limits.per_day: unknown limit"},
  };
  for (const Case& c : cases) {
    auto t = ParseApiKeys("keys:\n  - name: a\n    sha256: " + kHash + "\n    " + c.limits + "\n",
                          "k.yaml");
    ASSERT_FALSE(t.ok()) << c.limits;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos) << t.status();
  }
}

TEST(KeyLimiterTest, TokenBucketRefillsAtTheRateUpToTheBurst) {
  prometheus::Registry registry;
  KeyLimiter limiter(registry);
  limiter.Configure({{"batch", {.requests_per_second = 2, .burst = 3}}, {"free", {}}});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.TakeToken("batch", t0).ok()) << i;
  const grpc::Status refused = limiter.TakeToken("batch", t0);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("API key \"batch\""), std::string::npos);
  EXPECT_NE(refused.error_message().find("requests_per_second 2"), std::string::npos);
  // 0.4 s at 2/s is 0.8 of a token: still refused; at 0.5 s one token is back.
  EXPECT_FALSE(limiter.TakeToken("batch", t0 + absl::Milliseconds(400)).ok());
  EXPECT_TRUE(limiter.TakeToken("batch", t0 + absl::Milliseconds(500)).ok());
  EXPECT_FALSE(limiter.TakeToken("batch", t0 + absl::Milliseconds(500)).ok());
  // A long pause refills only up to the burst.
  const absl::Time later = t0 + absl::Seconds(60);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.TakeToken("batch", later).ok()) << i;
  EXPECT_FALSE(limiter.TakeToken("batch", later).ok());
  // A key without limits, and a name the file does not have, are never refused.
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(limiter.TakeToken("free", t0).ok());
  EXPECT_TRUE(limiter.TakeToken("unknown", t0).ok());
  const std::string m = Metrics(registry);
  EXPECT_NE(m.find("lazyattn_router_api_key_limited_total{key=\"batch\",limit=\"rate\"} 4"),
            std::string::npos)
      << m;
}

TEST(KeyLimiterTest, InFlightCapHoldsUntilTheSlotEnds) {
  prometheus::Registry registry;
  KeyLimiter limiter(registry);
  limiter.Configure({{"k", {.max_in_flight = 2}}});
  {
    KeySlot a, b, c;
    EXPECT_TRUE(limiter.Acquire("k", &a).ok());
    EXPECT_TRUE(limiter.Acquire("k", &b).ok());
    const grpc::Status refused = limiter.Acquire("k", &c);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(refused.error_message().find("API key \"k\": 2 requests in flight"),
              std::string::npos)
        << refused.error_message();
    EXPECT_EQ(limiter.InFlight("k"), 2);
    KeySlot moved = std::move(a);  // moving does not release
    EXPECT_EQ(limiter.InFlight("k"), 2);
    b = KeySlot();  // assigning over a slot releases it
    EXPECT_EQ(limiter.InFlight("k"), 1);
    EXPECT_TRUE(limiter.Acquire("k", &c).ok());
  }
  EXPECT_EQ(limiter.InFlight("k"), 0);
  // Without API keys (no name) nothing is capped.
  KeySlot none;
  EXPECT_TRUE(limiter.Acquire("", &none).ok());
  const std::string m = Metrics(registry);
  EXPECT_NE(m.find("lazyattn_router_api_key_limited_total{key=\"k\",limit=\"in_flight\"} 1"),
            std::string::npos)
      << m;
}

// Several places at once (the choices of an HTTP request with `n`) are taken together or not at
// all: a request that does not fit holds nothing, so a smaller one still passes.
TEST(KeyLimiterTest, SeveralPlacesAreTakenTogetherOrNotAtAll) {
  prometheus::Registry registry;
  KeyLimiter limiter(registry);
  limiter.Configure({{"k", {.max_in_flight = 4}}});
  KeySlot held;
  ASSERT_TRUE(limiter.Acquire("k", &held).ok());
  const auto ok = [] { return grpc::Status::OK; };
  std::vector<KeySlot> four(4);
  int asked = 0;
  const grpc::Status refused = limiter.Acquire("k", std::span(four), [&] {
    ++asked;
    return grpc::Status::OK;
  });
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "API key \"k\": 1 request in flight, 4 more would pass its limits.max_in_flight of 4; "
            "retry when 1 has ended");
  EXPECT_EQ(asked, 0);  // the other limit is not asked when the key refuses
  EXPECT_EQ(limiter.InFlight("k"), 1);
  // The other limit refuses: its status, and none of the key's places kept (they were reserved
  // under the lock, so no concurrent Acquire saw them taken either).
  std::vector<KeySlot> two(2);
  const grpc::Status busy = limiter.Acquire("k", std::span(two), [] {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "router busy");
  });
  EXPECT_EQ(busy.error_message(), "router busy");
  EXPECT_EQ(limiter.InFlight("k"), 1);
  {
    std::vector<KeySlot> three(3);
    ASSERT_TRUE(limiter.Acquire("k", std::span(three), ok).ok());
    EXPECT_EQ(limiter.InFlight("k"), 4);
    KeySlot one_more;
    EXPECT_FALSE(limiter.Acquire("k", &one_more).ok());
  }
  EXPECT_EQ(limiter.InFlight("k"), 1);  // each of the three gave its place back
  held = KeySlot();
  ASSERT_TRUE(limiter.Acquire("k", std::span(four), ok).ok());
  EXPECT_EQ(limiter.InFlight("k"), 4);
  // Only the key's own refusal counts as the key's limit being met.
  const std::string m = Metrics(registry);
  EXPECT_NE(m.find("lazyattn_router_api_key_limited_total{key=\"k\",limit=\"in_flight\"} 2"),
            std::string::npos)
      << m;
}

TEST(KeyLimiterTest, LimitsFollowAReloadAndStateSurvivesIt) {
  prometheus::Registry registry;
  KeyLimiter limiter(registry);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  limiter.Configure({{"k", {.requests_per_second = 1, .burst = 5, .max_in_flight = 1}}});
  KeySlot held;
  ASSERT_TRUE(limiter.Acquire("k", &held).ok());
  ASSERT_TRUE(limiter.TakeToken("k", t0).ok());  // 4 tokens left
  // Reload with a smaller burst and a larger cap: the bucket is clipped, the running call counts.
  limiter.Configure({{"k", {.requests_per_second = 1, .burst = 2, .max_in_flight = 2}}});
  EXPECT_EQ(limiter.InFlight("k"), 1);
  EXPECT_TRUE(limiter.TakeToken("k", t0).ok());
  EXPECT_TRUE(limiter.TakeToken("k", t0).ok());
  EXPECT_FALSE(limiter.TakeToken("k", t0).ok());
  KeySlot second, third;
  EXPECT_TRUE(limiter.Acquire("k", &second).ok());
  EXPECT_FALSE(limiter.Acquire("k", &third).ok());
  // Reload without limits: unlimited from then on.
  limiter.Configure({{"k", {}}});
  EXPECT_TRUE(limiter.TakeToken("k", t0).ok());
  EXPECT_TRUE(limiter.Acquire("k", &third).ok());
  // The key removed: its calls still running release without harm.
  limiter.Configure({});
  held = KeySlot();
  second = KeySlot();
  EXPECT_EQ(limiter.InFlight("k"), 0);
  EXPECT_TRUE(limiter.TakeToken("k", t0).ok());
}

}  // namespace
}  // namespace lazyattn::router
