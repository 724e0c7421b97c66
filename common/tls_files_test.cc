// The TLS files' mirror (tls_files.h): gRPC only ever reads a set that passed the checks, so a
// certificate truncated or a key swapped for another's under a running server leaves it serving
// on the last good set (gRPC alone aborted on the empty certificate), and a good new set is
// taken up. Certificates come from tools/gen-certs (run from the source tree, as ctest does).
#include "common/tls_files.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/test_certs_for_test.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using testing::MakeTestCerts;
using testing::ReadWholeFile;

// Rewritten in place (truncated, then written), as `cat new > old` does.
void Overwrite(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = MakeTestCerts("tls-files");
    ASSERT_FALSE(certs_.empty()) << "tools/gen-certs (run from the source tree) failed";
    // The files a server is given: copies, so that the test can break and replace them.
    for (const char* name : {"kvdir.crt", "kvdir.key"}) {
      std::filesystem::copy_file(certs_ + "/" + name, certs_ + "/live-" + name,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    tls_ = {.cert_file = certs_ + "/live-kvdir.crt",
            .key_file = certs_ + "/live-kvdir.key",
            .ca_file = certs_ + "/ca.crt",
            .refresh_interval_s = 1};
  }

  std::string certs_;
  TlsOptions tls_;
};

TEST_F(TlsFilesTest, OnlyASetThatPassesReachesTheWatchedCopies) {
  auto mirror = TlsFileMirror::For(tls_);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  const TlsOptions& watched = (*mirror)->watched();
  EXPECT_NE(watched.cert_file, tls_.cert_file);
  EXPECT_EQ(ReadWholeFile(watched.cert_file), ReadWholeFile(tls_.cert_file));
  EXPECT_EQ(ReadWholeFile(watched.key_file), ReadWholeFile(tls_.key_file));
  EXPECT_EQ(ReadWholeFile(watched.ca_file), ReadWholeFile(tls_.ca_file));
  const std::string good_cert = ReadWholeFile(tls_.cert_file),
                    good_key = ReadWholeFile(tls_.key_file);

  Overwrite(tls_.cert_file, "");  // truncated mid-rewrite
  EXPECT_EQ((*mirror)->RefreshNow().message(),
            absl::StrCat("tls.cert_file: ", tls_.cert_file,
                         " is empty (expected -----BEGIN CERTIFICATE-----)"));
  EXPECT_EQ(ReadWholeFile(watched.cert_file), good_cert);

  Overwrite(tls_.cert_file, good_cert);
  Overwrite(tls_.key_file,
            ReadWholeFile(certs_ + "/router-0.key"));  // the key first, as operators do
  EXPECT_EQ((*mirror)->RefreshNow().message(),
            absl::StrCat("tls.key_file: ", tls_.key_file, " is not the private key of tls.cert_file ",
                         tls_.cert_file));
  EXPECT_EQ(ReadWholeFile(watched.key_file), good_key);

  // The new pair, whole: taken up.
  Overwrite(tls_.cert_file, ReadWholeFile(certs_ + "/router-0.crt"));
  EXPECT_TRUE((*mirror)->RefreshNow().ok());
  EXPECT_EQ(ReadWholeFile(watched.cert_file), ReadWholeFile(certs_ + "/router-0.crt"));
  EXPECT_EQ(ReadWholeFile(watched.key_file), ReadWholeFile(certs_ + "/router-0.key"));

  // The same files again: the same mirror, as it is, even while the files on disk do not pass
  // (a router dialling a new worker mid-rotation); a start checks them itself.
  Overwrite(tls_.key_file, "");
  auto again = TlsFileMirror::For(tls_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), mirror->get());
  EXPECT_EQ(CheckTlsFiles(tls_).message(), absl::StrCat("tls.key_file: ", tls_.key_file,
                                                        " is empty (expected a PEM private key)"));
  auto server =
      StartGrpcServer({.listen_address = "127.0.0.1:0", .tls = tls_, .reflection = true}, {});
  EXPECT_FALSE(server.ok());
}

// Writes a self-signed certificate valid from `from_s` to `until_s` seconds from now, and its
// key, as NAME.crt and NAME.key under `dir`; the two paths.
std::pair<std::string, std::string> WriteSelfSigned(const std::string& dir, const std::string& name,
                                                    long from_s, long until_s) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), &X509_free);
  if (key == nullptr || cert == nullptr) return {};
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), from_s);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), until_s);
  X509_NAME* subject = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), subject);
  X509_set_pubkey(cert.get(), key.get());
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) return {};
  const std::string crt = dir + "/" + name + ".crt", pem_key = dir + "/" + name + ".key";
  FILE* f = fopen(crt.c_str(), "w");
  if (f == nullptr) return {};
  PEM_write_X509(f, cert.get());
  fclose(f);
  f = fopen(pem_key.c_str(), "w");
  if (f == nullptr) return {};
  PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  fclose(f);
  return {crt, pem_key};
}

// A certificate outside its validity stops the start, naming it: every peer would refuse it in
// the handshake and only the peer's log would say why.
TEST_F(TlsFilesTest, ACertificateOutsideItsValidityIsRefused) {
  const auto [expired, expired_key] = WriteSelfSigned(certs_, "expired", -2 * 86400, -86400);
  ASSERT_FALSE(expired.empty());
  absl::Status s = CheckTlsFiles({.cert_file = expired, .key_file = expired_key});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      s.message().find(absl::StrCat("tls.cert_file: ", expired, ": the certificate expired on ")),
      std::string::npos)
      << s;
  const auto [future, future_key] = WriteSelfSigned(certs_, "future", 2 * 86400, 3 * 86400);
  ASSERT_FALSE(future.empty());
  s = CheckTlsFiles({.cert_file = future, .key_file = future_key});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(
                absl::StrCat("tls.cert_file: ", future, ": the certificate is not valid before ")),
            std::string::npos)
      << s;
  // Valid from a minute ahead (a CA whose clock runs ahead of this machine's): taken.
  const auto [skewed, skewed_key] = WriteSelfSigned(certs_, "skewed", 60, 86400);
  ASSERT_FALSE(skewed.empty());
  EXPECT_TRUE(CheckTlsFiles({.cert_file = skewed, .key_file = skewed_key}).ok());
  // The files gen-certs makes are valid for days.
  EXPECT_TRUE(CheckTlsFiles(tls_).ok()) << CheckTlsFiles(tls_);
}

// Servers and channels starting at once on the same files share one mirror (one folder, one
// thread), however their calls interleave.
TEST_F(TlsFilesTest, ConcurrentCallsShareOneMirror) {
  std::vector<TlsFileMirror*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto mirror = TlsFileMirror::For(tls_);
      if (mirror.ok()) seen[i] = mirror->get();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_NE(seen[0], nullptr);
  for (TlsFileMirror* m : seen) EXPECT_EQ(m, seen[0]);
}

// A mirror's folder goes with it (the process's mirrors go at exit, as static objects).
TEST_F(TlsFilesTest, AMirrorsFolderGoesWithIt) {
  auto own = TlsFileMirror::Create(tls_);
  ASSERT_TRUE(own.ok()) << own.status();
  const std::filesystem::path dir = std::filesystem::path((*own)->watched().key_file).parent_path();
  EXPECT_NE(dir.string().find("/lazyattn-tls-"), std::string::npos) << dir;
  EXPECT_TRUE(std::filesystem::exists(dir / "key.pem"));
  EXPECT_EQ(std::filesystem::status(dir).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  own->reset();
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir << " was left behind";
}

// A process killed outright leaves its folder behind; the next mirror its user makes removes the
// folders whose recorded process is gone, and nothing else: not a live process's, not one of
// another pid namespace (a /tmp shared between containers) or another boot (a TMPDIR shared
// between machines), not one without a recorded process
// (made before folders recorded it), not another user's, and not a symbolic link a hostile user
// named like one (in a shared /tmp), nor what it points to.
TEST_F(TlsFilesTest, AMirrorRemovesTheFoldersOfDeadProcesses) {
  const std::filesystem::path tmp = absl::StrCat(::testing::TempDir(), "/tls-stale-", getpid());
  std::filesystem::remove_all(tmp);
  ASSERT_TRUE(std::filesystem::create_directories(tmp));
  const char* old_tmpdir = getenv("TMPDIR");
  const std::string saved = old_tmpdir != nullptr ? old_tmpdir : "";
  struct Restore {
    bool had;
    std::string value;
    ~Restore() { had ? setenv("TMPDIR", value.c_str(), 1) : unsetenv("TMPDIR"); }
  } restore{old_tmpdir != nullptr, saved};
  setenv("TMPDIR", tmp.c_str(), 1);

  const pid_t dead = fork();  // a process that existed and is gone (reaped)
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  ASSERT_EQ(kill(dead, 0), -1);
  struct stat ns {};
  ASSERT_EQ(stat("/proc/self/ns/pid", &ns), 0);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  ASSERT_GE(boot.size(), 8u);
  boot.resize(8);
  const std::string other_boot = boot == "00000000" ? "11111111" : "00000000";
  const auto folder = [&](pid_t pid, uint64_t pid_ns, const char* suffix,
                          const std::string& boot_tag) {
    return absl::StrCat("lazyattn-tls-", pid, "-", pid_ns, "-", boot_tag, "-", suffix);
  };
  const auto make = [&](const std::string& name) {
    std::filesystem::create_directory(tmp / name);
    std::filesystem::permissions(tmp / name, std::filesystem::perms::owner_all);
    for (const char* file : {"cert.pem", "key.pem", "ca.pem", "key.pem.next"}) {
      std::ofstream(tmp / name / file) << "left behind";
    }
  };
  const std::string stale = folder(dead, ns.st_ino, "aB3xYz", boot);
  const std::string live = folder(getppid(), ns.st_ino, "aB3xYz", boot);
  const std::string other_ns = folder(dead, ns.st_ino + 1, "aB3xYz", boot);
  const std::string other_machine = folder(dead, ns.st_ino, "aB3xYz", other_boot);
  const std::string unrecorded = "lazyattn-tls-aB3xYz";
  for (const std::string& name : {stale, live, other_ns, other_machine, unrecorded}) make(name);
  std::filesystem::create_directory(tmp / "victim");
  std::ofstream(tmp / "victim" / "key.pem") << "not ours to delete";
  const std::string link = folder(dead, ns.st_ino, "link01", boot);
  std::filesystem::create_directory_symlink(tmp / "victim", tmp / link);
  std::string foreign;  // another user's (only root can make one)
  if (geteuid() == 0) {
    foreign = folder(dead, ns.st_ino, "other1", boot);
    make(foreign);
    ASSERT_EQ(chown((tmp / foreign).c_str(), 4242, 4242), 0);
  }

  auto mirror = TlsFileMirror::Create(tls_);
  ASSERT_TRUE(mirror.ok()) << mirror.status();
  const std::filesystem::path own =
      std::filesystem::path((*mirror)->watched().key_file).parent_path();
  EXPECT_EQ(own.parent_path(), tmp);
  EXPECT_EQ(own.filename().string().rfind(
                absl::StrCat("lazyattn-tls-", getpid(), "-", ns.st_ino, "-", boot, "-"), 0),
            0u)
      << own;
  EXPECT_FALSE(std::filesystem::exists(tmp / stale)) << stale << " was left behind";
  for (const std::string& kept : {live, other_ns, other_machine, unrecorded}) {
    EXPECT_TRUE(std::filesystem::exists(tmp / kept / "key.pem")) << kept;
  }
  EXPECT_TRUE(std::filesystem::is_symlink(tmp / link));
  EXPECT_TRUE(std::filesystem::exists(tmp / "victim" / "key.pem"));
  if (!foreign.empty()) {
    EXPECT_TRUE(std::filesystem::exists(tmp / foreign / "key.pem"));
  }
  mirror->reset();
  std::filesystem::remove_all(tmp);
}

// A running server whose certificate is emptied keeps serving TLS on its last good pair; before
// the mirror gRPC read the empty file within its refresh interval and aborted the process (the
// whole test binary here).
TEST_F(TlsFilesTest, AServerWhoseCertificateIsEmptiedKeepsServing) {
  // Reflection: a server needs one service to start.
  auto server =
      StartGrpcServer({.listen_address = "127.0.0.1:0", .tls = tls_, .reflection = true}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("localhost:", server->port);
  auto healthy = [&] {
    // The server requires a client certificate of its CA.
    auto channel = MakeChannel(address, {.cert_file = certs_ + "/router-0.crt",
                                         .key_file = certs_ + "/router-0.key",
                                         .ca_file = certs_ + "/ca.crt"});
    if (!channel.ok()) return false;
    absl::StatusOr<bool> serving = CheckGrpcHealth(*channel, "", absl::Seconds(3));
    return serving.ok() && *serving;
  };
  ASSERT_TRUE(healthy());
  Overwrite(tls_.cert_file, "");
  Overwrite(tls_.key_file, "");
  absl::SleepFor(absl::Milliseconds(2500));  // past both refresh intervals
  EXPECT_TRUE(healthy());
  server->server->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace
}  // namespace lazyattn
