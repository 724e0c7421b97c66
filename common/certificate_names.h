// The hosts a certificate vouches for, and the host a gRPC client checks them against.
//
// A client dialling a server over TLS accepts it only if the server's certificate names the
// host dialled (gRPC's HostNameCertificateVerifier, which MakeChannel installs). kvdir makes the
// same check of the address a worker advertises against the worker's own client certificate,
// so a worker can publish only an address whose host its certificate could serve: a valid
// certificate of one worker cannot take another worker's address (locking that worker out of
// the directory) or claim documents under it.
//
//   CertificateNames names = PeerCertificateNames(*context->auth_context());
//   // "worker-0.lazyattn":
//   std::optional<std::string> host = DialedHost("dns:///worker-0.lazyattn:7200");
//   if (!host || !names.Names(*host)) Refuse();
#ifndef LAZYATTN_COMMON_CERTIFICATE_NAMES_H_
#define LAZYATTN_COMMON_CERTIFICATE_NAMES_H_

#include <grpcpp/grpcpp.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace lazyattn {

// The DNS and IP subject alternative names of one certificate (URIs and e-mail names are not
// hosts and are left out; so is the subject's common name, which gRPC consults only when a
// certificate has no DNS name at all, and which tools/gen-certs never relies on).
struct CertificateNames {
  std::vector<std::string> dns;  // as written, e.g. "worker-0.lazyattn.svc" or "*.lazyattn.svc"
  std::vector<std::string> ips;  // text form (inet_ntop), e.g. "127.0.0.1", "::1"

  bool empty() const { return dns.empty() && ips.empty(); }
  // Whether `host` (a DNS name, or an IPv4 or IPv6 literal without brackets) is named, as a TLS
  // client decides: DNS names without regard to case or a trailing dot, a leftmost "*" label
  // standing for exactly one label (never for an IP literal, and not in "*.com"); IP addresses
  // by value ("::1" names "0:0:0:0:0:0:0:1"), or by a DNS name of exactly their text.
  bool Names(absl::string_view host) const;
  // "DNS:a, DNS:b, IP:127.0.0.1" (for messages); "none" when empty.
  std::string ToString() const;
};

// The names of the verified certificate the peer presented on this connection; empty without
// one (an insecure server, or a client that presented none).
CertificateNames PeerCertificateNames(const grpc::AuthContext& context);

// The host a gRPC channel created for `target` (grpc::CreateChannel's first argument) checks the
// server's certificate against: "host:port", "host", "[v6]:port" and "dns:[//authority/]host:port"
// give their host (an IPv6 literal without brackets), "ipv4:" and "ipv6:" their one address,
// "unix:" and "unix-abstract:" "localhost" (gRPC's authority for them). nullopt where it cannot
// tell: an empty host, several addresses, another resolver's scheme ("xds:", "scheme://").
std::optional<std::string> DialedHost(absl::string_view target);

// Whether a channel to `target` connects where its host says, over the network: false for a
// local socket ("unix:", "unix-abstract:", which dial "localhost" to a certificate check, so any
// certificate naming localhost passes), for a name resolved by a DNS server the target picks
// ("dns://SERVER/host:port": the server decides which address the host is), and where the host
// cannot be read unambiguously: none or several (DialedHost), a '%' (gRPC percent-decodes
// targets, and it starts an IPv6 zone) or '/' in it, or an IPv4 address spelled other than as
// its canonical dotted quad ("127.1", "2130706433", "0x7f000001", "127.000.000.001", which
// resolvers read differently, some as 127.0.0.1). kvdir refuses such an address from a worker,
// and routers do not dial one: every router would connect wherever it points.
bool DialsOverTheNetwork(absl::string_view target);

// Whether `host` (a DNS name, an IP literal with or without brackets) is the dialling machine
// itself: "localhost" and its subdomains, the loopback names of common /etc/hosts files
// ("ip6-localhost", "localhost.localdomain", ...), 127.0.0.0/8, ::1, an IPv4-mapped loopback,
// and the unspecified 0.0.0.0/8 and ::, which connect to the local host. A name that resolves to
// loopback elsewhere (the machine's own host name, a DNS record) cannot be told without resolving
// it, which the dialler does, not this. kvdir takes such an address
// only from a worker connected over loopback: from any other, every router would dial its own
// host.
bool IsLocalHost(absl::string_view host);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_CERTIFICATE_NAMES_H_
