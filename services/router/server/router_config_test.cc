#include "services/router/server/router_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<RouterOptions> Parse(const std::string& yaml, const FlagOverrides& flags = {}) {
  YamlConfig config;
  absl::Status s = config.LoadString(yaml, "router.yaml");
  if (!s.ok()) return s;
  return RouterOptionsFromYaml(config, flags);
}

TEST(RouterConfigTest, DefaultsAndEveryKey) {
  auto o = Parse(R"(
server:
  listen: 0.0.0.0:7000
metrics:
  listen: ""
kvdir:
  address: kvdir:50060
  lookup_timeout_ms: 40
  refresh_interval_ms: 250
  list_timeout_ms: 300
  forget_after_ms: 5000
  loopback_workers: dial
  lookup_failures_to_skip: 5
  lookup_backoff_ms: 200
  lookup_max_backoff_ms: 4000
workers: [w0:1, w1:2]
routing:
  policy: least_loaded
  queued_token_weight: 0.5
  running_request_tokens: 10
  imbalance_ratio: 3
  imbalance_min_tokens: 100
  speculative_ttl_ms: 1500
  speculative_max_keys: 10
  bytes_per_token: 3.5
  max_attempts: 2
  retry_budget_percent: 35
  retry_budget_min: 7
  first_token_timeout_ms: 4000
  first_token_max_wait_ms: 90000
  token_idle_timeout_ms: 7000
  prefetch_timeout_ms: 9000
  client_write_timeout_ms: 11000
  client_write_wait_budget_ms: 45000
  quarantine_ttl_s: 60
  quarantine_max_entries: 50
health_check:
  interval_ms: 200
  timeout_ms: 300
  unhealthy_threshold: 3
  base_ejection_ms: 1500
  max_ejection_ms: 9000
circuit_breaker:
  failure_threshold: 4
  open_ms: 1000
  failure_rate_percent: 40
  failure_rate_min_requests: 12
  failure_rate_window_ms: 20000
limits:
  max_message_bytes: 1048576
  max_inflight_requests: 8
  max_documents: 16
  max_document_bytes: 1000
  max_document_tokens: 500
  max_document_id_bytes: 32
  max_system_bytes: 100
  max_question_bytes: 200
  max_tokens: 50
  max_stop_strings: 4
  max_stop_bytes: 8
  max_stop_token_ids: 3
  max_prefetch_replicas: 2
)");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->server.listen_address, "0.0.0.0:7000");
  EXPECT_EQ(o->metrics_address, "");
  EXPECT_EQ(o->kvdir.address, "kvdir:50060");
  EXPECT_EQ(o->kvdir.lookup_timeout, absl::Milliseconds(40));
  EXPECT_EQ(o->kvdir.forget_after, absl::Seconds(5));
  EXPECT_EQ(o->kvdir.loopback_workers, KvdirOptions::LoopbackWorkers::kDial);
  EXPECT_EQ(o->kvdir.lookup_gate.failures_to_skip, 5);
  EXPECT_EQ(o->kvdir.lookup_gate.base_backoff, absl::Milliseconds(200));
  EXPECT_EQ(o->kvdir.lookup_gate.max_backoff, absl::Seconds(4));
  EXPECT_THAT(o->workers, ElementsAre("w0:1", "w1:2"));
  EXPECT_EQ(o->routing.policy.kind, PolicyKind::kLeastLoaded);
  EXPECT_EQ(o->routing.policy.running_request_tokens, 10);
  EXPECT_EQ(o->routing.speculative.ttl, absl::Milliseconds(1500));
  EXPECT_EQ(o->routing.max_attempts, 2);
  EXPECT_EQ(o->routing.retry_budget.percent, 35.0);
  EXPECT_EQ(o->routing.retry_budget.min_retries, 7);
  EXPECT_EQ(o->routing.breaker.failure_threshold, 4);
  EXPECT_EQ(o->routing.breaker.failure_rate_percent, 40.0);
  EXPECT_EQ(o->routing.breaker.failure_rate_min_requests, 12);
  EXPECT_EQ(o->routing.breaker.failure_rate_window, absl::Seconds(20));
  EXPECT_EQ(o->routing.first_token_timeout, absl::Seconds(4));
  EXPECT_EQ(o->routing.first_token_max_wait, absl::Seconds(90));
  EXPECT_EQ(o->routing.token_idle_timeout, absl::Seconds(7));
  EXPECT_EQ(o->routing.prefetch_timeout, absl::Seconds(9));
  EXPECT_EQ(o->routing.client_write_timeout, absl::Seconds(11));
  EXPECT_EQ(o->routing.client_write_wait_budget, absl::Seconds(45));
  EXPECT_EQ(o->routing.quarantine.ttl, absl::Seconds(60));
  EXPECT_EQ(o->routing.quarantine.max_entries, 50);
  EXPECT_EQ(o->health.interval, absl::Milliseconds(200));
  EXPECT_EQ(o->health.timeout, absl::Milliseconds(300));
  EXPECT_EQ(o->health.outliers.consecutive_failures, 3);
  EXPECT_EQ(o->health.outliers.base_ejection, absl::Milliseconds(1500));
  EXPECT_EQ(o->health.outliers.max_ejection, absl::Seconds(9));
  EXPECT_EQ(o->server.max_message_bytes, 1048576);
  EXPECT_EQ(o->max_inflight_requests, 8);
  EXPECT_EQ(o->limits.max_documents, 16);
  EXPECT_EQ(o->limits.max_prefetch_replicas, 2);

  auto d = Parse("kvdir:\n  address: 127.0.0.1:50060\n");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->routing.policy.kind, PolicyKind::kCacheAware);
  EXPECT_EQ(d->kvdir.lookup_timeout, absl::Milliseconds(50));
  EXPECT_EQ(d->kvdir.loopback_workers, KvdirOptions::LoopbackWorkers::kAuto);
  EXPECT_EQ(d->max_inflight_requests, 256);
  EXPECT_EQ(d->routing.first_token_timeout, absl::Seconds(30));
  EXPECT_EQ(d->routing.first_token_max_wait, absl::Minutes(10));
  EXPECT_EQ(d->routing.token_idle_timeout, absl::Seconds(30));
  EXPECT_EQ(d->routing.quarantine.ttl, absl::Seconds(300));
  EXPECT_EQ(d->routing.quarantine.max_entries, 10000);
  EXPECT_EQ(d->health.interval, absl::Milliseconds(500));
  EXPECT_EQ(d->health.outliers.consecutive_failures, 2);
}

TEST(RouterConfigTest, ErrorsNameTheKey) {
  auto error = [](const std::string& yaml) {
    auto o = Parse(yaml);
    return o.ok() ? std::string("ok") : std::string(o.status().message());
  };
  EXPECT_THAT(error("kvdir: {address: k:1}\nroutng: {policy: round_robin}\n"),
              HasSubstr("unknown key routng"));
  EXPECT_THAT(error("kvdir: {address: k:1, lookup_timeout: 5}\n"),
              HasSubstr("kvdir.lookup_timeout"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {policy: random}\n"),
              HasSubstr("routing.policy: unknown policy \"random\""));
  EXPECT_THAT(error("kvdir: {address: k:1}\nlimits: {max_documents: 0}\n"),
              HasSubstr("limits.max_documents: must be in [1, 100000], got 0"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nlimits: {max_inflight_requests: lots}\n"),
              HasSubstr("limits.max_inflight_requests: expected an integer, got \"lots\""));
  EXPECT_THAT(error("kvdir: {address: nocolon}\n"), HasSubstr("kvdir.address: expected host:port"));
  EXPECT_THAT(error("kvdir: {address: k:1, loopback_workers: yes}\n"),
              HasSubstr("kvdir.loopback_workers: expected auto, dial or skip, got \"yes\""));
  EXPECT_THAT(error("workers: [\"a:1\", \"\"]\n"), HasSubstr("workers[1]: must not be empty"));
  EXPECT_THAT(error("server: {listen: \"0.0.0.0:1\"}\n"),
              HasSubstr("no directory and no static workers"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {imbalance_ratio: 0.5}\n"),
              HasSubstr("routing.imbalance_ratio"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nhealth_check: {interval_ms: 5}\n"),
              HasSubstr("health_check.interval_ms"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nhealth_check: {base_ejection_ms: 5000, "
                    "max_ejection_ms: 100}\n"),
              HasSubstr("health_check.max_ejection_ms: must be >="));
  EXPECT_THAT(error("kvdir: {address: k:1, lookup_backoff_ms: 5000, lookup_max_backoff_ms: 100}\n"),
              HasSubstr("kvdir.lookup_max_backoff_ms: must be at least kvdir.lookup_backoff_ms"));
  EXPECT_THAT(
      error("kvdir: {address: k:1}\nrouting: {client_write_timeout_ms: 5}\n"),
      HasSubstr("routing.client_write_timeout_ms: must be 0 (off) or at least 1000, got 5"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {client_write_wait_budget_ms: 999}\n"),
              HasSubstr("routing.client_write_wait_budget_ms: must be 0 (off) or at least 1000"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {prefetch_timeout_ms: 999}\n"),
              HasSubstr("routing.prefetch_timeout_ms: must be 0 (off) or at least 1000"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {first_token_timeout_ms: -1}\n"),
              HasSubstr("routing.first_token_timeout_ms"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {token_idle_timeout_ms: 3600001}\n"),
              HasSubstr("routing.token_idle_timeout_ms"));
  // The bound on all the waiting cannot be shorter than one wait; 0 turns it off.
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {first_token_timeout_ms: 5000, "
                    "first_token_max_wait_ms: 4999}\n"),
              HasSubstr("routing.first_token_max_wait_ms: 4999 is below "
                        "routing.first_token_timeout_ms (5000)"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {first_token_max_wait_ms: 86400001}\n"),
              HasSubstr("routing.first_token_max_wait_ms"));
  EXPECT_TRUE(Parse("kvdir: {address: k:1}\nrouting: {first_token_max_wait_ms: 0}\n").ok());
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {retry_budget_percent: 101}\n"),
              HasSubstr("routing.retry_budget_percent: must be in [0, 100]"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {retry_budget_min: -1}\n"),
              HasSubstr("routing.retry_budget_min: must be in [0, 100000]"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {quarantine_ttl_s: 100000}\n"),
              HasSubstr("routing.quarantine_ttl_s: must be in [0, 86400], got 100000"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nrouting: {quarantine_max_entries: 0}\n"),
              HasSubstr("routing.quarantine_max_entries"));
  EXPECT_THAT(error("kvdir: {address: k:1}\nserver: {tls: {cert_file: a.pem}}\n"),
              HasSubstr("server.tls: cert_file and key_file must be set together"));
}

TEST(RouterConfigTest, FlagsOverrideTheirKeys) {
  FlagOverrides flags;
  flags.listen = "127.0.0.1:0";
  flags.metrics = "";
  flags.kvdir = "127.0.0.1:9";
  auto o = Parse("server: {listen: \"0.0.0.0:1\"}\n", flags);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->server.listen_address, "127.0.0.1:0");
  EXPECT_EQ(o->metrics_address, "");
  EXPECT_EQ(o->kvdir.address, "127.0.0.1:9");
}

TEST(RouterConfigTest, TheHttpFlagsPortIsChecked) {
  FlagOverrides flags;
  flags.http = "127.0.0.1:99999";  // the HTTP library would bind 34463
  auto o = Parse("kvdir: {address: k:1}\ninsecure: true\n", flags);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(),
              HasSubstr("--http: 127.0.0.1:99999: the port must be a number from 0 to 65535"));
  flags.http = "127.0.0.1:8000";
  EXPECT_TRUE(Parse("kvdir: {address: k:1}\ninsecure: true\n", flags).ok());
}

TEST(RouterConfigTest, HttpListenerNeedsApiKeysOrInsecure) {
  // Client certificates on gRPC do not protect the HTTP API: without keys it is refused.
  auto o = Parse("kvdir: {address: k:1}\nserver: {tls: {cert_file: c.pem, key_file: k.pem, "
                 "ca_file: ca.pem}}\nhttp: {listen: \"127.0.0.1:0\"}\n");
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("http.listen: needs auth.api_keys_file"));
  FlagOverrides flags;
  flags.http = "127.0.0.1:0";
  EXPECT_THAT(Parse("kvdir: {address: k:1}\n", flags).status().message(),
              HasSubstr("http.listen"));

  auto keys = Parse("kvdir: {address: k:1}\nserver: {tls: {cert_file: c.pem, key_file: k.pem}}\n"
                    "auth: {api_keys_file: keys.yaml}\nhttp: {listen: \"127.0.0.1:0\"}\n");
  EXPECT_TRUE(keys.ok()) << keys.status();
  auto insecure = Parse("kvdir: {address: k:1}\ninsecure: true\nhttp: {listen: \"127.0.0.1:0\"}\n");
  EXPECT_TRUE(insecure.ok()) << insecure.status();
}

}  // namespace
}  // namespace lazyattn::router
