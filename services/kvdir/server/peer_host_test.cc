#include "services/kvdir/server/peer_host.h"

#include <gtest/gtest.h>

namespace lazyattn::kvdir {
namespace {

TEST(PeerHostTest, DropsThePortOfAnIpPeer) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.5:53422"), "10.0.0.5");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5000"), "[::1]");
  EXPECT_EQ(PeerHost("ipv6:[fe80::1%25eth0]:5000"), "[fe80::1%25eth0]");
  // Two connections of one host are one host.
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:1"), PeerHost("ipv4:127.0.0.1:65535"));
}

TEST(PeerHostTest, ReadsThePercentEncodedBracketsOfNewerGrpc) {
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:5000"), "[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5b2001:db8::7%5d:443"), "[2001:db8::7]");
}

TEST(PeerHostTest, KeepsAHostWithoutAPort) {
  EXPECT_EQ(PeerHost("ipv6:[::1]"), "[::1]");
  EXPECT_EQ(PeerHost("ipv4:10.0.0.5"), "10.0.0.5");
}

TEST(PeerHostTest, ReturnsOtherPeersWhole) {
  // Every client of a Unix socket is on this host: one host, whatever the connection.
  EXPECT_EQ(PeerHost("unix:/run/lazyattn/kvdir.sock"), "unix:/run/lazyattn/kvdir.sock");
  EXPECT_EQ(PeerHost("unix-abstract:kvdir"), "unix-abstract:kvdir");
  EXPECT_EQ(PeerHost(""), "");
}

}  // namespace
}  // namespace lazyattn::kvdir
