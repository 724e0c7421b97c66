// The http.* keys of the router's configuration.
#include "services/router/http/http_options.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn::router {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<HttpOptions> Parse(const std::string& yaml) {
  YamlConfig config;
  if (absl::Status s = config.LoadString(yaml, "router.yaml"); !s.ok()) return s;
  return HttpOptionsFromYaml(config);
}

TEST(HttpOptionsTest, OffByDefault) {
  auto o = Parse("server: {listen: '127.0.0.1:1'}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->listen.empty());
  EXPECT_EQ(o->threads, 32);
  EXPECT_EQ(o->max_body_bytes, 4 << 20);  // each connection thread may buffer this much
  EXPECT_EQ(o->max_queued_connections, 64);
  EXPECT_EQ(o->header_timeout, absl::Seconds(10));
  EXPECT_EQ(o->body_timeout, absl::Seconds(30));
  EXPECT_EQ(o->max_header_bytes, 64 << 10);
  EXPECT_EQ(o->max_logprob_entries, 1 << 20);
  // Unset: half the threads, so one address leaves the other half to everyone else.
  EXPECT_EQ(EffectiveMaxConnectionsPerClient(*o), 16);
}

TEST(HttpOptionsTest, TheDefaultCapPerClientFollowsTheThreads) {
  auto o = Parse("http: {threads: 1}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(EffectiveMaxConnectionsPerClient(*o), 1);
  o = Parse("http: {threads: 4, max_connections_per_client: 0}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(EffectiveMaxConnectionsPerClient(*o), 0);  // no cap
}

TEST(HttpOptionsTest, ReadsEveryKey) {
  auto o = Parse(
      "http:\n  listen: 127.0.0.1:8000\n  max_body_bytes: 4096\n  threads: 4\n"
      "  max_queued_connections: 2\n  read_timeout_ms: 100\n  write_timeout_ms: 200\n"
      "  keep_alive_timeout_ms: 3000\n  keep_alive_max_count: 9\n  request_timeout_ms: 5000\n"
      "  header_timeout_ms: 700\n  max_connections_per_client: 3\n  body_timeout_ms: 800\n"
      "  max_header_bytes: 16384\n  write_wait_budget_ms: 7000\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->listen, "127.0.0.1:8000");
  EXPECT_EQ(o->max_body_bytes, 4096);
  EXPECT_EQ(o->threads, 4);
  EXPECT_EQ(o->max_queued_connections, 2);
  EXPECT_EQ(o->read_timeout, absl::Milliseconds(100));
  EXPECT_EQ(o->write_timeout, absl::Milliseconds(200));
  EXPECT_EQ(o->keep_alive_timeout, absl::Seconds(3));
  EXPECT_EQ(o->keep_alive_max_count, 9);
  EXPECT_EQ(o->request_timeout, absl::Seconds(5));
  EXPECT_EQ(o->header_timeout, absl::Milliseconds(700));
  EXPECT_EQ(o->body_timeout, absl::Milliseconds(800));
  EXPECT_EQ(o->max_header_bytes, 16384);
  EXPECT_EQ(o->write_wait_budget, absl::Seconds(7));
  EXPECT_EQ(EffectiveMaxConnectionsPerClient(*o), 3);
}

// The bound on a whole (not streamed) response's log-probability entries: read, and refused
// outside [1, 2^30] naming the key.
TEST(HttpOptionsTest, MaxLogprobEntriesIsReadAndRangeChecked) {
  auto o = Parse("http: {max_logprob_entries: 5000}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_logprob_entries, 5000);
  o = Parse("http: {max_logprob_entries: 1073741824}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_logprob_entries, int64_t{1} << 30);
  for (const char* bad : {"0", "-1", "1073741825", "many", "1.5"}) {
    o = Parse(absl::StrCat("http: {max_logprob_entries: ", bad, "}\n"));
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_THAT(o.status().message(), HasSubstr("http.max_logprob_entries")) << bad;
  }
}

TEST(HttpOptionsTest, ErrorsNameTheKey) {
  EXPECT_THAT(Parse("http: {listen: nowhere}\n").status().message(),
              HasSubstr("http.listen: expected host:port"));
  EXPECT_THAT(Parse("http: {listen: '127.0.0.1:99999'}\n").status().message(),
              HasSubstr("http.listen: 127.0.0.1:99999: the port must be a number from 0 to 65535"));
  EXPECT_THAT(Parse("http: {threads: 0}\n").status().message(), HasSubstr("http.threads"));
  EXPECT_THAT(Parse("http: {max_body_bytes: 10}\n").status().message(),
              HasSubstr("http.max_body_bytes"));
  EXPECT_THAT(Parse("http: {header_timeout_ms: 0}\n").status().message(),
              HasSubstr("http.header_timeout_ms"));
  EXPECT_THAT(Parse("http: {body_timeout_ms: 0}\n").status().message(),
              HasSubstr("http.body_timeout_ms"));
  EXPECT_THAT(Parse("http: {body_timeout_ms: slow}\n").status().message(),
              HasSubstr("http.body_timeout_ms"));
  EXPECT_THAT(Parse("http: {max_header_bytes: 100}\n").status().message(),
              HasSubstr("http.max_header_bytes"));
  EXPECT_THAT(Parse("http: {max_connections_per_client: -2}\n").status().message(),
              HasSubstr("http.max_connections_per_client"));
  EXPECT_THAT(Parse("http: {write_wait_budget_ms: 500}\n").status().message(),
              HasSubstr("http.write_wait_budget_ms: must be 0 (off) or at least 1000"));
  EXPECT_TRUE(Parse("http: {write_wait_budget_ms: 0}\n").ok());
  EXPECT_EQ(Parse("http: {}\n")->write_wait_budget, absl::Seconds(120));
}

// The slowest send rate of a non-streamed response: 64 KiB/s unless set, 0 turns it off, and a
// negative or non-integer value is refused naming the key.
TEST(HttpOptionsTest, MinSendBytesPerSecondIsReadAndRangeChecked) {
  auto o = Parse("");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->min_send_bytes_per_s, 65536);
  o = Parse("http: {min_send_bytes_per_s: 0}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->min_send_bytes_per_s, 0);
  o = Parse("http: {min_send_bytes_per_s: 1048576}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->min_send_bytes_per_s, 1 << 20);
  for (const char* bad : {"-1", "fast", "1.5"}) {
    o = Parse(absl::StrCat("http: {min_send_bytes_per_s: ", bad, "}\n"));
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_THAT(o.status().message(), HasSubstr("http.min_send_bytes_per_s")) << bad;
  }
}

}  // namespace
}  // namespace lazyattn::router
