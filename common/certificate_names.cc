#include "common/certificate_names.h"

#include <arpa/inet.h>
#include <grpc/grpc_security_constants.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <array>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace lazyattn {
namespace {

// An IP literal's family and bytes (IPv4 in the first 4); nullopt for anything else.
struct IpBytes {
  int family = 0;
  std::array<unsigned char, 16> bytes{};
  bool operator==(const IpBytes&) const = default;
};

std::optional<IpBytes> ParseIp(absl::string_view text) {
  const std::string s(text);
  IpBytes ip;
  if (inet_pton(AF_INET, s.c_str(), ip.bytes.data()) == 1) {
    ip.family = AF_INET;
    return ip;
  }
  if (inet_pton(AF_INET6, s.c_str(), ip.bytes.data()) == 1) {
    ip.family = AF_INET6;
    return ip;
  }
  return std::nullopt;
}

// DNS names compare without case and without one trailing dot (the root).
std::string CanonicalDns(absl::string_view name) {
  absl::ConsumeSuffix(&name, ".");
  return absl::AsciiStrToLower(name);
}

bool DnsNameMatches(absl::string_view pattern, absl::string_view host) {
  if (pattern.empty()) return false;
  if (pattern == host) return true;
  // "*.example.com" names "a.example.com", never "example.com", "a.b.example.com" or (a wildcard
  // over a public suffix) anything under "*.com".
  if (!absl::StartsWith(pattern, "*.")) return false;
  const absl::string_view suffix = pattern.substr(1);  // ".example.com"
  if (suffix.find('.', 1) == absl::string_view::npos) return false;
  if (host.size() <= suffix.size() || !absl::EndsWith(host, suffix)) return false;
  const absl::string_view label = host.substr(0, host.size() - suffix.size());
  return label.find('.') == absl::string_view::npos;
}

// The host of "host:port", "host", "[v6]:port" or a bare IPv6 literal; nullopt when empty or
// malformed.
std::optional<std::string> HostOfHostPort(absl::string_view host_port) {
  if (host_port.empty()) return std::nullopt;
  if (host_port.front() == '[') {
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos || close == 1) return std::nullopt;
    const absl::string_view after = host_port.substr(close + 1);
    if (!after.empty() && after.front() != ':') return std::nullopt;
    return std::string(host_port.substr(1, close - 1));
  }
  const size_t colon = host_port.find(':');
  if (colon == absl::string_view::npos) return std::string(host_port);
  // Two colons or more without brackets: an IPv6 literal without a port.
  if (host_port.find(':', colon + 1) != absl::string_view::npos) return std::string(host_port);
  if (colon == 0) return std::nullopt;
  return std::string(host_port.substr(0, colon));
}

}  // namespace

bool CertificateNames::Names(absl::string_view host) const {
  if (const std::optional<IpBytes> wanted = ParseIp(host)) {
    for (const std::string& ip : ips) {
      if (ParseIp(ip) == wanted) return true;
    }
    // gRPC also compares the dialled text with the DNS names, exactly, case included (an IPv6
    // address some tool wrote as a DNS name); a wildcard never stands for an IP literal.
    for (const std::string& name : dns) {
      if (name == host) return true;
    }
    return false;
  }
  const std::string h = CanonicalDns(host);
  if (h.empty()) return false;
  for (const std::string& name : dns) {
    if (DnsNameMatches(CanonicalDns(name), h)) return true;
  }
  return false;
}

std::string CertificateNames::ToString() const {
  if (empty()) return "none";
  std::vector<std::string> parts;
  for (const std::string& d : dns) parts.push_back("DNS:" + d);
  for (const std::string& ip : ips) parts.push_back("IP:" + ip);
  return absl::StrJoin(parts, ", ");
}

CertificateNames PeerCertificateNames(const grpc::AuthContext& context) {
  CertificateNames names;
  // The certificate itself rather than gRPC's flattened SAN property, whose one list mixes DNS
  // names, IP addresses and URIs as text.
  const std::vector<grpc::string_ref> pems =
      context.FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pems.empty()) return names;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pems[0].data(), static_cast<int>(pems[0].size())), &BIO_free);
  if (bio == nullptr) return names;
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) return names;
  std::unique_ptr<GENERAL_NAMES, decltype(&GENERAL_NAMES_free)> sans(
      static_cast<GENERAL_NAMES*>(
          X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)),
      &GENERAL_NAMES_free);
  if (sans == nullptr) return names;
  for (int i = 0; i < sk_GENERAL_NAME_num(sans.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_STRING* s = name->d.dNSName;
      const absl::string_view text(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                   static_cast<size_t>(ASN1_STRING_length(s)));
      // A name with a NUL in it would compare as a shorter one: no client accepts it, neither
      // does this.
      if (!text.empty() && text.find('\0') == absl::string_view::npos) {
        names.dns.emplace_back(text);
      }
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* s = name->d.iPAddress;
      const int length = ASN1_STRING_length(s);
      if (length != 4 && length != 16) continue;
      char text[INET6_ADDRSTRLEN] = {};
      if (inet_ntop(length == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(s), text,
                    sizeof(text)) != nullptr) {
        names.ips.emplace_back(text);
      }
    }
  }
  return names;
}

std::optional<std::string> DialedHost(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return "localhost";
  }
  if (absl::ConsumePrefix(&target, "dns:") || absl::ConsumePrefix(&target, "ipv4:") ||
      absl::ConsumePrefix(&target, "ipv6:")) {
    if (absl::ConsumePrefix(&target, "//")) {  // an authority (dns:// names its DNS server)
      const size_t slash = target.find('/');
      if (slash == absl::string_view::npos) return std::nullopt;
      target.remove_prefix(slash + 1);
    }
    if (target.find(',') != absl::string_view::npos) return std::nullopt;  // several addresses
    return HostOfHostPort(target);
  }
  // Another resolver ("xds:///name", "google-c2p:..."): its name is not the host it dials.
  if (target.find("://") != absl::string_view::npos || absl::StartsWith(target, "xds:") ||
      absl::StartsWith(target, "google-c2p")) {
    return std::nullopt;
  }
  return HostOfHostPort(target);  // gRPC reads a target of no known scheme as dns:///target
}

namespace {

// An IPv4 address written other than as its canonical dotted quad ("127.1", "2130706433",
// "0x7f000001", "0177.0.0.1", "127.000.000.001"): every label digits or 0x-hex, and the whole
// not what inet_ntop writes back. Resolvers disagree on these (c-ares takes leading zeros,
// getaddrinfo the short and hex forms), so their meaning cannot be judged here.
bool IsOddlySpelledIpv4(absl::string_view host) {
  bool numeric = !host.empty();
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    const bool hex = absl::StartsWithIgnoreCase(label, "0x");
    if (hex) label.remove_prefix(2);
    numeric = numeric && std::all_of(label.begin(), label.end(), [hex](char c) {
                return hex ? absl::ascii_isxdigit(static_cast<unsigned char>(c))
                           : absl::ascii_isdigit(static_cast<unsigned char>(c));
              });
  }
  if (!numeric) return false;
  const std::string text(host);
  unsigned char v4[4];
  char canonical[INET_ADDRSTRLEN] = {};
  return inet_pton(AF_INET, text.c_str(), v4) != 1 ||
         inet_ntop(AF_INET, v4, canonical, sizeof(canonical)) == nullptr || text != canonical;
}

}  // namespace

bool DialsOverTheNetwork(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return false;
  }
  if (absl::StartsWith(target, "dns://") && !absl::StartsWith(target, "dns:///")) return false;
  const std::optional<std::string> host = DialedHost(target);
  if (!host.has_value() || host->empty()) return false;
  // gRPC percent-decodes a target ("%6cocalhost"); '%' also starts an IPv6 zone ("::1%lo").
  if (host->find_first_of("%/") != std::string::npos) return false;
  return !IsOddlySpelledIpv4(*host);
}

bool IsLocalHost(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  absl::ConsumeSuffix(&host, ".");
  const std::string lower = absl::AsciiStrToLower(host);
  if (lower == "localhost" || absl::EndsWith(lower, ".localhost")) return true;
  // What distributions' /etc/hosts map to loopback besides (Debian and Docker, RHEL).
  for (const char* name : {"ip6-localhost", "ip6-loopback", "localhost.localdomain", "localhost6",
                           "localhost6.localdomain6"}) {
    if (lower == name) return true;
  }
  unsigned char v4[4];
  if (inet_pton(AF_INET, lower.c_str(), v4) == 1) return v4[0] == 127 || v4[0] == 0;
  unsigned char v6[16];
  if (inet_pton(AF_INET6, lower.c_str(), v6) != 1) return false;
  static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::equal(v6, v6 + 12, kMapped)) return v6[12] == 127 || v6[12] == 0;
  const bool zeros = std::all_of(v6, v6 + 15, [](unsigned char b) { return b == 0; });
  return zeros && (v6[15] == 0 || v6[15] == 1);  // :: and ::1
}

}  // namespace lazyattn
