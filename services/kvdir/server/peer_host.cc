#include "services/kvdir/server/peer_host.h"

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"

namespace lazyattn::kvdir {

std::string PeerHost(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return std::string(peer);
  }
  // Newer gRPC releases percent-encode the brackets of an IPv6 host.
  const std::string rest =
      absl::StrReplaceAll(peer.substr(5), {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
  // The port follows the last ':', unless that colon is inside an IPv6 host's brackets (no port).
  const size_t colon = rest.rfind(':');
  const size_t bracket = rest.rfind(']');
  if (colon == std::string::npos || colon == 0 ||
      (bracket != std::string::npos && colon < bracket)) {
    return rest;
  }
  return rest.substr(0, colon);
}

}  // namespace lazyattn::kvdir
