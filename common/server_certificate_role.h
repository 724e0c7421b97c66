// A server's own certificate against the role its process serves as.
//
// Clients accept a server only through a certificate carrying its role's identity (auth.h,
// MakeServerIdentityVerifier): kvdir's clients want lazyattn://kvdir/NAME (KvdirClientTls), a
// router wants lazyattn://worker/ID of a worker. A server started with another role's certificate
// of the same CA (gen-certs names the same hosts in every certificate) would pass every check of
// its own and then fail every handshake, with only its clients' logs saying why; so kvdir and
// workers refuse it, at start and when their files are reloaded (TlsOptions::own_role). A router's server certificate is not checked: its clients (the CLI,
// HTTP clients) authenticate with API keys and check only the host name.
#ifndef LAZYATTN_COMMON_SERVER_CERTIFICATE_ROLE_H_
#define LAZYATTN_COMMON_SERVER_CERTIFICATE_ROLE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/grpc_util.h"

namespace lazyattn {

// OK when the first certificate of `cert_pem` has a lazyattn:// identity (the first lazyattn://
// SAN URI that parses, as clients read it) of role `role` (a kRole* value). InvalidArgument
// otherwise (ExitStatusForStartFailure: 2), naming `prefix`cert_file, the file, the identity and
// role found and the role expected (`tls.cert_file: PATH: the certificate is
// lazyattn://worker/worker-0 (role worker), but this server serves as role kvdir: ...`).
// ReadTlsFiles runs it for TlsOptions::own_role, so a reload to another role's certificate is
// refused as a start with one is.
absl::Status CheckCertificateRole(const std::string& cert_pem, std::string_view role,
                                  const std::string& cert_file, absl::string_view prefix);

// ReadTlsFiles(tls with own_role = `role`, prefix): the files' own errors first, then the role's.
// OK without a cert_file (plaintext).
absl::Status CheckServerCertificateRole(const TlsOptions& tls, std::string_view role,
                                        absl::string_view prefix = "tls.");

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_SERVER_CERTIFICATE_ROLE_H_
