#include "common/certificate_names.h"

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(CertificateNamesTest, DnsNamesMatchWithoutCaseOrTheRootDot) {
  const CertificateNames names{.dns = {"worker-0.lazyattn.svc", "Localhost."}};
  EXPECT_TRUE(names.Names("worker-0.lazyattn.svc"));
  EXPECT_TRUE(names.Names("WORKER-0.lazyattn.SVC."));
  EXPECT_TRUE(names.Names("localhost"));
  EXPECT_FALSE(names.Names("worker-1.lazyattn.svc"));
  EXPECT_FALSE(names.Names("worker-0.lazyattn"));  // a prefix of a name is not the name
  EXPECT_FALSE(names.Names("x.worker-0.lazyattn.svc"));
  EXPECT_FALSE(names.Names(""));
  EXPECT_FALSE(names.Names("."));
}

TEST(CertificateNamesTest, AWildcardStandsForExactlyOneLeftmostLabel) {
  const CertificateNames names{.dns = {"*.lazyattn-worker.lazyattn.svc", "*.com"}};
  EXPECT_TRUE(names.Names("lazyattn-worker-3.lazyattn-worker.lazyattn.svc"));
  EXPECT_FALSE(names.Names("lazyattn-worker.lazyattn.svc"));      // no label for the star
  EXPECT_FALSE(names.Names(".lazyattn-worker.lazyattn.svc"));     // an empty label
  EXPECT_FALSE(names.Names("a.b.lazyattn-worker.lazyattn.svc"));  // two labels
  EXPECT_FALSE(names.Names("example.com"));                       // "*.com" is refused whole
  EXPECT_FALSE(CertificateNames{.dns = {"w*.lazyattn.svc"}}.Names("w1.lazyattn.svc"));
}

TEST(CertificateNamesTest, IpAddressesMatchByValueOrByADnsNameOfTheirText) {
  const CertificateNames names{.dns = {"*.0.0.1", "fd00::5"}, .ips = {"127.0.0.1", "::1"}};
  EXPECT_TRUE(names.Names("127.0.0.1"));
  EXPECT_TRUE(names.Names("0:0:0:0:0:0:0:1"));
  EXPECT_FALSE(names.Names("127.0.0.2"));
  EXPECT_FALSE(names.Names("::2"));
  // An address a tool wrote as a DNS name: gRPC's check compares the text, and so does this.
  EXPECT_TRUE(names.Names("fd00::5"));
  EXPECT_FALSE(names.Names("FD00::5"));  // gRPC compares that text case and all
  EXPECT_FALSE(names.Names("fd00:0::5"));
  EXPECT_FALSE(names.Names("10.0.0.1"));  // a wildcard never names an IP literal
  EXPECT_FALSE(CertificateNames{}.Names("127.0.0.1"));
}

TEST(CertificateNamesTest, ToStringListsEveryName) {
  EXPECT_EQ((CertificateNames{.dns = {"a", "b"}, .ips = {"::1"}}).ToString(),
            "DNS:a, DNS:b, IP:::1");
  EXPECT_EQ(CertificateNames{}.ToString(), "none");
}

TEST(DialedHostTest, TheHostAChannelVerifiesForEachTargetForm) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"worker-0:7200", "worker-0"},
      {"worker-0", "worker-0"},
      {"10.1.2.3:7200", "10.1.2.3"},
      {"[::1]:7200", "::1"},
      {"::1", "::1"},
      {"dns:///worker-0.lazyattn.svc:7200", "worker-0.lazyattn.svc"},
      {"dns://8.8.8.8:53/worker-0:7200", "worker-0"},
      {"dns:worker-0:7200", "worker-0"},
      {"ipv4:10.1.2.3:7200", "10.1.2.3"},
      {"ipv6:[fe80::1]:7200", "fe80::1"},
      {"unix:/run/lazyattn/worker.sock", "localhost"},
      {"unix-abstract:worker", "localhost"},
  };
  for (const auto& [target, host] : cases) {
    const std::optional<std::string> got = DialedHost(target);
    ASSERT_TRUE(got.has_value()) << target;
    EXPECT_EQ(*got, host) << target;
  }
}

TEST(DialedHostTest, TargetsWhoseHostCannotBeToldAreNullopt) {
  for (const char* target : {"", ":7200", "[]:7200", "[::1", "[::1]x", "dns:///", "dns://8.8.8.8",
                             "ipv4:10.0.0.1:1,10.0.0.2:1", "xds:///worker", "https://worker-0:7200",
                             "google-c2p:///worker"}) {
    EXPECT_FALSE(DialedHost(target).has_value()) << target;
  }
}

TEST(DialsOverTheNetworkTest, LocalSocketsAndTargetsPickingTheirDnsServerDoNot) {
  for (const char* target : {"worker-0:7200", "10.1.2.3:7200", "[::1]:7200", "127.0.0.1:7200",
                             "dns:///worker-0:7200", "dns:worker-0:7200", "ipv4:10.1.2.3:7200"}) {
    EXPECT_TRUE(DialsOverTheNetwork(target)) << target;
  }
  for (const char* target : {"unix:/run/lazyattn/worker.sock", "unix-abstract:worker",
                             "dns://8.8.8.8:53/worker-0:7200", "dns://attacker/worker-0:7200"}) {
    EXPECT_FALSE(DialsOverTheNetwork(target)) << target;
  }
}

// Spellings whose host cannot be read unambiguously: gRPC or a resolver takes each of these to
// 127.0.0.1 or ::1 (c-ares reads leading zeros, getaddrinfo short and hex forms, gRPC
// percent-decodes), while a plain reading sees another host or none. A canonical address and
// names with numeric labels among others still dial.
TEST(DialsOverTheNetworkTest, AmbiguousSpellingsOfAHostDoNot) {
  for (const char* target :
       {"127.1:7200", "2130706433:7200", "0x7f000001:7200", "0177.0.0.1:7200",
        "127.000.000.001:7200", "127.0.0.01:7200", "0:7200", "[::1%25lo]:7200", "[::1%lo]:7200",
        "dns:///%6cocalhost:7200", "dns:///localhost%3a7200", "ipv4:%31%32%37.0.0.1:7200",
        "dns:/localhost:7200", "ipv4:127.0.0.1:7200,10.0.0.1:7200", "xds:///worker", ":7200"}) {
    EXPECT_FALSE(DialsOverTheNetwork(target)) << target;
  }
  for (const char* target :
       {"10.0.0.1:7200", "0.0.0.0:7200", "worker-1.lazyattn:7200", "node-7.rack-12.example:7200",
        "1e100.net:443", "[::ffff:10.0.0.1]:7200"}) {
    EXPECT_TRUE(DialsOverTheNetwork(target)) << target;
  }
}

TEST(IsLocalHostTest, LoopbackAndUnspecifiedAddressesAndLocalhost) {
  for (const char* host :
       {"localhost", "LOCALHOST.", "a.localhost", "127.0.0.1", "127.9.9.9", "0.0.0.0", "::1",
        "[::1]", "::", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "[::ffff:7f00:1]", "ip6-localhost",
        "IP6-LOOPBACK.", "localhost.localdomain", "localhost6"}) {
    EXPECT_TRUE(IsLocalHost(host)) << host;
  }
  for (const char* host : {"worker-0", "localhost.example.com", "10.0.0.1", "128.0.0.1",
                           "169.254.169.254", "::2", "fe80::1", "::ffff:10.0.0.1", "", "[]"}) {
    EXPECT_FALSE(IsLocalHost(host)) << host;
  }
}

}  // namespace
}  // namespace lazyattn
