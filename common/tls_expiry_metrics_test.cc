// The certificate expiry gauge (tls_expiry_metrics.h): the notAfter of the files a mirror serves,
// following a rotation, never a broken file's, and nothing without TLS.
#include "common/tls_expiry_metrics.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "common/test_certs_for_test.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

struct Pem {
  std::string cert, key;
};

// A self-signed certificate (so its own CA) valid until `not_after` (YYYYMMDDHHMMSSZ, UTC).
Pem MakeCertificate(const char* not_after) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  if (key == nullptr || cert == nullptr) return {};
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -86400);
  if (ASN1_TIME_set_string_X509(X509_getm_notAfter(cert.get()), not_after) != 1) return {};
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("expiry-test"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_set_pubkey(cert.get(), key.get());
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) return {};
  auto text = [](auto write) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
    write(bio.get());
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  return {.cert = text([&](BIO* b) { PEM_write_bio_X509(b, cert.get()); }),
          .key = text([&](BIO* b) {
            PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
          })};
}

// 2035-01-02T03:04:05Z (a UTCTime in the certificate) and 2051-06-07T08:09:10Z (GeneralizedTime).
constexpr char kNotAfter2035[] = "20350102030405Z";
constexpr int64_t kUnix2035 = 2051319845;
constexpr char kNotAfter2051[] = "20510607080910Z";
constexpr int64_t kUnix2051 = 2569738150;

// The gauge `role`/`file` of `registry`'s scrape; nullopt when it has no such series.
std::optional<double> Expiry(prometheus::Registry& registry, const std::string& role,
                             const std::string& file) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != kTlsExpiryMetric) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      int matched = 0;
      for (const auto& label : metric.label) {
        matched += (label.name == "role" && label.value == role) ||
                   (label.name == "file" && label.value == file);
      }
      if (matched == 2) return metric.gauge.value;
    }
  }
  return std::nullopt;
}

int SeriesCount(prometheus::Registry& registry) {
  int n = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name == kTlsExpiryMetric) n += static_cast<int>(family.metric.size());
  }
  return n;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

TEST(CertificateNotAfterTest, ReadsTheFirstCertificatesNotAfter) {
  const Pem a = MakeCertificate(kNotAfter2035), b = MakeCertificate(kNotAfter2051);
  ASSERT_FALSE(a.cert.empty());
  ASSERT_FALSE(b.cert.empty());
  EXPECT_EQ(CertificateNotAfter(a.cert).value_or(-1), kUnix2035);
  EXPECT_EQ(CertificateNotAfter(b.cert).value_or(-1), kUnix2051);
  EXPECT_EQ(CertificateNotAfter(b.cert + a.cert).value_or(-1), kUnix2051);  // a CA bundle
}

TEST(CertificateNotAfterTest, AnythingButACertificateIsAnError) {
  for (const std::string& pem :
       {std::string(), std::string("garbage\n"),
        std::string("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
        MakeCertificate(kNotAfter2035).key}) {
    const absl::StatusOr<int64_t> not_after = CertificateNotAfter(pem);
    EXPECT_EQ(not_after.status().code(), absl::StatusCode::kInvalidArgument) << pem;
  }
}

class TlsExpiryMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/tls-expiry-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-",
                        getpid());
    std::filesystem::create_directories(dir_);
    first_ = MakeCertificate(kNotAfter2035);
    ca_ = MakeCertificate(kNotAfter2051);
    ASSERT_FALSE(first_.cert.empty());
    ASSERT_FALSE(ca_.cert.empty());
    tls_ = {.cert_file = dir_ + "/server.crt",
            .key_file = dir_ + "/server.key",
            .ca_file = dir_ + "/ca.crt",
            .refresh_interval_s = 3600};  // only RefreshNow refreshes
    Write(tls_.cert_file, first_.cert);
    Write(tls_.key_file, first_.key);
    Write(tls_.ca_file, ca_.cert + first_.cert);  // a bundle: its first certificate counts
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  Pem first_, ca_;
  TlsOptions tls_;
  prometheus::Registry registry_;
};

TEST_F(TlsExpiryMetricsTest, FollowsTheCertificateTheMirrorServes) {
  auto mirror = TlsFileMirror::Create(tls_);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  auto metrics = std::make_unique<TlsExpiryMetrics>(registry_);
  metrics->Watch(kTlsRoleServer, **mirror);
  EXPECT_EQ(Expiry(registry_, "server", "cert"), kUnix2035);
  EXPECT_EQ(Expiry(registry_, "server", "ca"), kUnix2051);
  EXPECT_EQ(SeriesCount(registry_), 2);

  // Rotated: the new certificate once the mirror takes it up, not before.
  const Pem second = MakeCertificate("20400101000000Z");
  ASSERT_FALSE(second.cert.empty());
  Write(tls_.cert_file, second.cert);
  Write(tls_.key_file, second.key);
  EXPECT_EQ(Expiry(registry_, "server", "cert"), kUnix2035);
  ASSERT_TRUE((*mirror)->RefreshNow().ok());
  EXPECT_EQ(Expiry(registry_, "server", "cert"), 2208988800);  // 2040-01-01T00:00:00Z
  EXPECT_EQ(Expiry(registry_, "server", "ca"), kUnix2051);

  // A broken certificate is never served: the gauge keeps the one that is.
  for (const std::string& broken : {std::string(), std::string("garbage\n")}) {
    Write(tls_.cert_file, broken);
    EXPECT_FALSE((*mirror)->RefreshNow().ok());
    EXPECT_EQ(Expiry(registry_, "server", "cert"), 2208988800);
  }

  // Gone with the metrics: a later rotation reaches no gauge (and does not crash).
  metrics.reset();
  Write(tls_.cert_file, first_.cert);
  Write(tls_.key_file, first_.key);
  EXPECT_TRUE((*mirror)->RefreshNow().ok());
}

TEST_F(TlsExpiryMetricsTest, ExportsOnlyTheFilesConfigured) {
  TlsExpiryMetrics metrics(registry_);
  // Plaintext: no series, not even the family.
  ASSERT_TRUE(metrics.Watch(kTlsRoleServer, TlsOptions{}).ok());
  EXPECT_TRUE(registry_.Collect().empty());
  // A client that checks its peers but presents no certificate: its CA only.
  ASSERT_TRUE(metrics.Watch(kTlsRoleClient, TlsOptions{.ca_file = tls_.ca_file}).ok());
  EXPECT_EQ(Expiry(registry_, "client", "ca"), kUnix2051);
  EXPECT_EQ(SeriesCount(registry_), 1);
}

TEST_F(TlsExpiryMetricsTest, FilesThatDoNotPassAreTheWatchsError) {
  Write(tls_.cert_file, "garbage\n");
  TlsExpiryMetrics metrics(registry_);
  const absl::Status s = metrics.Watch(kTlsRoleServer, tls_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(SeriesCount(registry_), 0);
}

}  // namespace
}  // namespace lazyattn
