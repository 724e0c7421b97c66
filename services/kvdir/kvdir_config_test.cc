#include "services/kvdir/kvdir_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace lazyattn::kvdir {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<KvdirOptions> Parse(const std::string& yaml) {
  YamlConfig config;
  absl::Status s = config.LoadString(yaml, "kvdir.yaml");
  if (!s.ok()) return s;
  return KvdirOptionsFromYaml(config);
}

std::string Error(const std::string& yaml) {
  auto o = Parse(yaml);
  return o.ok() ? "<ok>" : std::string(o.status().message());
}

TEST(KvdirConfigTest, EmptyFileGivesTheDocumentedDefaults) {
  auto o = Parse("");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->listen_address, "127.0.0.1:7100");
  EXPECT_EQ(o->metrics_address, "127.0.0.1:9100");
  EXPECT_EQ(o->lease_ms, 3000);
  EXPECT_EQ(o->limits.max_keys_per_lookup, 1024);
  EXPECT_EQ(o->limits.max_workers, 1024);
  EXPECT_EQ(o->limits.max_entries_per_worker, 262144);
  EXPECT_EQ(o->limits.max_entries, 2097152);
  EXPECT_EQ(o->limits.max_message_bytes, 16 << 20);
  EXPECT_EQ(o->limits.max_worker_id_length, 255);
  EXPECT_EQ(o->limits.max_publish_streams, 4096);
  EXPECT_EQ(o->limits.max_streams_per_certificate, 4);
  EXPECT_EQ(o->limits.hello_timeout_ms, 10000);
  EXPECT_EQ(o->limits.max_publish_entries_per_s, -1);  // as limits.max_entries_per_worker
  EXPECT_FALSE(o->reflection);
  EXPECT_EQ(o->tls.refresh_interval_s, 60);
  EXPECT_TRUE(o->tls.cert_file.empty());
}

TEST(KvdirConfigTest, ReadsEveryKey) {
  auto o = Parse(R"(
server:
  listen: 0.0.0.0:7200
  tls: {cert_file: c.pem, key_file: k.pem, ca_file: ca.pem, refresh_interval_s: 5}
  reflection: true
metrics:
  listen: ""
limits:
  max_keys_per_lookup: 64
  max_message_bytes: 1048576
  max_workers: 16
  max_entries_per_worker: 5000
  max_entries: 40000
  max_worker_id_length: 32
  max_publish_streams: 100
  max_streams_per_certificate: 2
  hello_timeout_ms: 2500
  max_publish_entries_per_s: 0
lease_ms: 1500
)");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->listen_address, "0.0.0.0:7200");
  EXPECT_EQ(o->tls.cert_file, "c.pem");
  EXPECT_EQ(o->tls.key_file, "k.pem");
  EXPECT_EQ(o->tls.ca_file, "ca.pem");
  EXPECT_EQ(o->metrics_address, "");
  EXPECT_EQ(o->limits.max_keys_per_lookup, 64);
  EXPECT_EQ(o->limits.max_message_bytes, 1 << 20);
  EXPECT_EQ(o->lease_ms, 1500);
  EXPECT_EQ(o->limits.max_workers, 16);
  EXPECT_EQ(o->limits.max_entries_per_worker, 5000);
  EXPECT_EQ(o->limits.max_entries, 40000);
  EXPECT_EQ(o->limits.max_worker_id_length, 32);
  EXPECT_EQ(o->limits.max_publish_streams, 100);
  EXPECT_EQ(o->limits.max_streams_per_certificate, 2);
  EXPECT_EQ(o->limits.hello_timeout_ms, 2500);
  EXPECT_EQ(o->limits.max_publish_entries_per_s, 0);
  EXPECT_TRUE(o->reflection);
  EXPECT_EQ(o->tls.refresh_interval_s, 5);
}

TEST(KvdirConfigTest, ErrorsNameTheKeyAndValue) {
  EXPECT_THAT(Error("lease_ms: 10\n"), AllOf(HasSubstr("lease_ms"), HasSubstr("got 10")));
  EXPECT_THAT(Error("lease_ms: soon\n"), AllOf(HasSubstr("lease_ms"), HasSubstr("soon")));
  EXPECT_THAT(Error("limits: {max_keys_per_lookup: 0}\n"), HasSubstr("limits.max_keys_per_lookup"));
  EXPECT_THAT(Error("lease_msec: 100\n"), HasSubstr("lease_msec"));
  EXPECT_THAT(Error("limits: {max_workers: 0}\n"), HasSubstr("limits.max_workers"));
  EXPECT_THAT(Error("limits: {max_entries_per_worker: -5}\n"),
              AllOf(HasSubstr("limits.max_entries_per_worker"), HasSubstr("got -5")));
  EXPECT_THAT(Error("limits: {max_entries: 0}\n"),
              AllOf(HasSubstr("limits.max_entries"), HasSubstr("got 0")));
  EXPECT_THAT(Error("limits: {max_worker_id_length: 0}\n"), HasSubstr("limits.max_worker_id_length"));
  EXPECT_THAT(Error("limits: {max_publish_streams: 0}\n"), HasSubstr("limits.max_publish_streams"));
  EXPECT_THAT(Error("limits: {max_streams_per_certificate: 2000}\n"),
              HasSubstr("limits.max_streams_per_certificate"));
  EXPECT_THAT(Error("limits: {hello_timeout_ms: 5}\n"), HasSubstr("limits.hello_timeout_ms"));
  EXPECT_THAT(Error("limits: {max_publish_entries_per_s: -1}\n"),
              HasSubstr("limits.max_publish_entries_per_s"));
  EXPECT_THAT(Error("server: {reflection: maybe}\n"), HasSubstr("server.reflection"));
  EXPECT_THAT(Error("server: {tls: {refresh_interval_s: 0}}\n"),
              HasSubstr("server.tls.refresh_interval_s"));
  EXPECT_THAT(Error("server: {listen: 1.2.3.4:1, port: 5}\n"), HasSubstr("server.port"));
  EXPECT_THAT(Error("server: {tls: {cert_file: c.pem}}\n"), HasSubstr("server.tls"));
  EXPECT_THAT(Error("server: {listen: \"\"}\n"), HasSubstr("server.listen"));
}

}  // namespace
}  // namespace lazyattn::kvdir
