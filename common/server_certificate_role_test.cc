#include "common/server_certificate_role.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/test_certs_for_test.h"
#include "common/tls_files.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

class ServerCertificateRoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = testing::MakeTestCerts("server-cert-role");
    ASSERT_FALSE(certs_.empty()) << "tools/gen-certs (run from the source tree) failed";
  }

  TlsOptions Files(const std::string& name) const {
    return {.cert_file = absl::StrCat(certs_, "/", name, ".crt"),
            .key_file = absl::StrCat(certs_, "/", name, ".key"),
            .ca_file = certs_ + "/ca.crt"};
  }

  // A self-signed certificate NAME.crt/.key with the subject alternative names `san`.
  void SelfSigned(const std::string& name, const std::string& san) {
    ASSERT_EQ(std::system(
                  absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                               "-nodes -days 1 -subj /CN=",
                               name, " -addext subjectAltName=", san, " -keyout '", certs_, "/",
                               name, ".key' -out '", certs_, "/", name, ".crt' 2>/dev/null")
                      .c_str()),
              0);
  }

  std::string certs_;
};

// What tools/gen-certs makes passes for the role each process serves as.
TEST_F(ServerCertificateRoleTest, GenCertsCertificatesPassForTheirOwnRole) {
  EXPECT_TRUE(CheckServerCertificateRole(Files("kvdir"), kRoleKvdir).ok());
  EXPECT_TRUE(CheckServerCertificateRole(Files("worker-0"), kRoleWorker).ok());
  EXPECT_TRUE(CheckServerCertificateRole(Files("router-0"), kRoleRouter).ok());
  EXPECT_TRUE(CheckServerCertificateRole(TlsOptions{}, kRoleKvdir).ok()) << "plaintext";
}

// A worker's certificate as kvdir's started, and every client then refused the handshake.
TEST_F(ServerCertificateRoleTest, AnotherRolesCertificateIsRefusedNamingFileAndRoles) {
  const TlsOptions worker = Files("worker-0");
  const absl::Status s = CheckServerCertificateRole(worker, kRoleKvdir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            absl::StrCat("tls.cert_file: ", worker.cert_file,
                         ": the certificate is lazyattn://worker/worker-0 (role worker), but this "
                         "server serves as role kvdir: its clients accept only a certificate with "
                         "lazyattn://kvdir/NAME (tools/gen-certs cert kvdir NAME)"));
  const absl::Status as_worker = CheckServerCertificateRole(Files("kvdir"), kRoleWorker);
  EXPECT_EQ(as_worker.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(as_worker.message()),
              HasSubstr("is lazyattn://kvdir/kvdir (role kvdir), but this server serves as role "
                        "worker"));
  EXPECT_THAT(std::string(CheckServerCertificateRole(Files("router-0"), kRoleWorker).message()),
              HasSubstr("(role router), but this server serves as role worker"));
  EXPECT_THAT(
      std::string(
          CheckServerCertificateRole(Files("worker-0"), kRoleKvdir, "server.tls.").message()),
      HasSubstr("server.tls.cert_file: " + worker.cert_file + ": "));
}

// The identity is read as clients read it: the first lazyattn:// URI that parses.
TEST_F(ServerCertificateRoleTest, TheIdentityIsTheFirstLazyattnUri) {
  SelfSigned("plain", "DNS:localhost,IP:127.0.0.1");
  const absl::Status none = CheckServerCertificateRole(
      {.cert_file = certs_ + "/plain.crt", .key_file = certs_ + "/plain.key"}, kRoleKvdir);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.message()),
              HasSubstr("plain.crt: the certificate carries no lazyattn:// identity (no role), but "
                        "this server serves as role kvdir"));
  SelfSigned("second", "URI:https://example.com/x,URI:lazyattn://root/x,URI:lazyattn://kvdir/k");
  EXPECT_TRUE(
      CheckServerCertificateRole(
          {.cert_file = certs_ + "/second.crt", .key_file = certs_ + "/second.key"}, kRoleKvdir)
          .ok());
  SelfSigned("worker-first", "URI:lazyattn://worker/w,URI:lazyattn://kvdir/k");
  EXPECT_FALSE(CheckServerCertificateRole({.cert_file = certs_ + "/worker-first.crt",
                                           .key_file = certs_ + "/worker-first.key"},
                                          kRoleKvdir)
                   .ok());
}

// Files that do not pass are refused as StartGrpcServer refuses them.
TEST_F(ServerCertificateRoleTest, FilesThatDoNotPassGiveTheirOwnError) {
  TlsOptions missing = Files("kvdir");
  missing.cert_file = certs_ + "/missing.crt";
  const absl::Status s = CheckServerCertificateRole(missing, kRoleKvdir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tls.cert_file: cannot read " + missing.cert_file));
}

// A rotation to another role's certificate is refused as a start with one is: the mirror a server
// serves from keeps the last good set (TlsOptions::own_role), rather than serving a certificate
// every client refuses.
TEST_F(ServerCertificateRoleTest, AReloadToAnotherRolesCertificateKeepsTheLastGoodSet) {
  for (const char* name : {"kvdir.crt", "kvdir.key"}) {
    std::filesystem::copy_file(certs_ + "/" + name, certs_ + "/live-" + name,
                               std::filesystem::copy_options::overwrite_existing);
  }
  TlsOptions tls = {.cert_file = certs_ + "/live-kvdir.crt",
                    .key_file = certs_ + "/live-kvdir.key",
                    .ca_file = certs_ + "/ca.crt",
                    .refresh_interval_s = 1000,
                    .own_role = std::string(kRoleKvdir)};
  auto mirror = TlsFileMirror::For(tls);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  const std::string good_cert = testing::ReadWholeFile(tls.cert_file);
  // The key first, then the certificate, as operators rotate.
  std::filesystem::copy_file(certs_ + "/worker-0.key", tls.key_file,
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(certs_ + "/worker-0.crt", tls.cert_file,
                             std::filesystem::copy_options::overwrite_existing);
  const absl::Status reload = (*mirror)->RefreshNow();
  EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(reload.message()),
              HasSubstr("the certificate is lazyattn://worker/worker-0 (role worker), but this "
                        "server serves as role kvdir"));
  EXPECT_EQ(testing::ReadWholeFile((*mirror)->watched().cert_file), good_cert);
  // The same files without a role to serve as (a client's) pass.
  TlsOptions any_role = tls;
  any_role.own_role.clear();
  EXPECT_TRUE(CheckTlsFiles(any_role).ok());
}

}  // namespace
}  // namespace lazyattn
