#include "common/tls_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_stamp.h"
#include "common/log.h"
#include "common/server_certificate_role.h"

namespace lazyattn {
namespace {

// Larger than any certificate chain or CA bundle a cluster needs; a bound so that a path such as
// /dev/zero is refused instead of read for ever.
constexpr int64_t kMaxPemBytes = 16 << 20;

// The PEM file `path` of TlsOptions field `what` (cert_file, key_file, ca_file), refused unless it
// is a regular file of at most kMaxPemBytes (ReadStampedFile: a FIFO is not waited on) holding a
// block of `kind` ("CERTIFICATE", or "PRIVATE KEY" for any key type). gRPC aborts the process (an
// assertion) on an empty certificate or key, and reads a directory as empty.
absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view prefix,
                                    const char* what, const char* kind) {
  const auto field = absl::StrCat(prefix, what, ": ");
  absl::StatusOr<StampedText> read = ReadStampedFile(path, kMaxPemBytes);
  if (!read.ok()) return absl::InvalidArgumentError(absl::StrCat(field, read.status().message()));
  std::string pem = std::move(read->text);
  // "-----BEGIN CERTIFICATE-----", "-----BEGIN PRIVATE KEY-----", "-----BEGIN EC PRIVATE KEY-----"
  if (pem.find("-----BEGIN ") == std::string::npos ||
      pem.find(absl::StrCat(kind, "-----")) == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, path, pem.empty() ? " is empty" : " holds no matching PEM block", " (expected ",
        kind == std::string_view("CERTIFICATE") ? "-----BEGIN CERTIFICATE-----"
                                                : "a PEM private key",
        ")"));
  }
  return pem;
}

// The first certificate of a PEM text, null when none parses.
std::unique_ptr<X509, decltype(&X509_free)> FirstCertificate(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio != nullptr ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr,
      &X509_free);
  ERR_clear_error();
  return cert;
}

// How far ahead of this machine's clock a certificate's validity may start (clock skew).
constexpr time_t kNotBeforeSlackSeconds = 3600;

// The certificate parses and the key is its own: gRPC would start with either wrong and fail
// every handshake, with nothing in the process's own log. An encrypted key is refused (no
// passphrase is ever asked for: the callback declines).
absl::Status CheckPair(const std::string& cert_pem, const std::string& key_pem,
                       const TlsOptions& tls, absl::string_view prefix) {
  const auto cert = FirstCertificate(cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "cert_file: ", tls.cert_file,
                                                   ": its first certificate does not parse"));
  }
  // Expired or not yet valid, every peer refuses it in the handshake, and only the peer's log
  // says why. A certificate valid from up to an hour ahead is let through: one issued a moment
  // ago on a machine whose clock runs ahead would otherwise be refused for a while.
  const auto date_of = [](const ASN1_TIME* t) {
    std::unique_ptr<BIO, decltype(&BIO_free)> when(BIO_new(BIO_s_mem()), &BIO_free);
    std::string date = "?";
    if (when != nullptr && ASN1_TIME_print(when.get(), t) == 1) {
      char* data = nullptr;
      const long n = BIO_get_mem_data(when.get(), &data);
      date.assign(data, static_cast<size_t>(n));
    }
    ERR_clear_error();
    return date;
  };
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "cert_file: ", tls.cert_file,
                                                   ": the certificate expired on ",
                                                   date_of(X509_get0_notAfter(cert.get()))));
  }
  time_t an_hour_ahead = time(nullptr) + kNotBeforeSlackSeconds;
  if (X509_cmp_time(X509_get0_notBefore(cert.get()), &an_hour_ahead) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "cert_file: ", tls.cert_file, ": the certificate is not valid before ",
                     date_of(X509_get0_notBefore(cert.get())),
                     " (check the clock of this machine or the CA's)"));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), &BIO_free);
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      bio != nullptr ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr)
                     : nullptr,
      &EVP_PKEY_free);
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "key_file: ", tls.key_file, ": the private key does not parse (or is encrypted)"));
  }
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "key_file: ", tls.key_file,
                                                   " is not the private key of ", prefix,
                                                   "cert_file ", tls.cert_file));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> CertificateNotAfter(absl::string_view pem) {
  const auto cert = FirstCertificate(std::string(pem));
  if (cert == nullptr) return absl::InvalidArgumentError("no certificate parses");
  // ASN1_TIME_to_tm reads both UTCTime (years to 2049) and GeneralizedTime, as UTC.
  struct tm when {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &when) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("the certificate's notAfter is not a valid time");
  }
  return static_cast<int64_t>(timegm(&when));
}

absl::StatusOr<TlsFileContents> ReadTlsFiles(const TlsOptions& tls, absl::string_view prefix) {
  std::string cert_pem, key_pem;
  if (!tls.cert_file.empty()) {
    auto cert = ReadPem(tls.cert_file, prefix, "cert_file", "CERTIFICATE");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(tls.key_file, prefix, "key_file", "PRIVATE KEY");
    if (!key.ok()) return key.status();
    cert_pem = std::move(*cert);
    key_pem = std::move(*key);
  }
  std::string ca_pem;
  if (!tls.ca_file.empty()) {
    auto ca = ReadPem(tls.ca_file, prefix, "ca_file", "CERTIFICATE");
    if (!ca.ok()) return ca.status();
    ca_pem = std::move(*ca);
  }
  if (!tls.cert_file.empty()) {
    if (absl::Status s = CheckPair(cert_pem, key_pem, tls, prefix); !s.ok()) return s;
    if (!tls.own_role.empty()) {
      if (absl::Status s = CheckCertificateRole(cert_pem, tls.own_role, tls.cert_file, prefix);
          !s.ok()) {
        return s;
      }
    }
  }
  if (!tls.ca_file.empty() && FirstCertificate(ca_pem) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "ca_file: ", tls.ca_file, ": its first certificate does not parse"));
  }
  if (tls.refresh_interval_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "refresh_interval_s: must be >= 1, got ", tls.refresh_interval_s));
  }
  return TlsFileContents{
      .cert = std::move(cert_pem), .key = std::move(key_pem), .ca = std::move(ca_pem)};
}

namespace {

// Writes `text` to `path` as a whole: beside it first, then renamed over, so that a reader sees
// the old file or the new one, never a part. `mode`: the file's permissions.
absl::Status WriteWhole(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".next";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (chmod(tmp.c_str(), mode) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot replace ", path));
  }
  return absl::OkStatus();
}

constexpr char kFolderPrefix[] = "lazyattn-tls-";

// The inode of /proc/self/ns/pid, 0 when unknown. A recorded pid names a process only inside its
// pid namespace: containers sharing a /tmp each have their own, where the pid of a live process
// of another may well be free.
uint64_t PidNamespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// The first 8 hex digits of this boot's id, "" when unknown. Pid namespace inodes are unique
// only within one kernel (every host process has the same one), so a TMPDIR shared between
// machines, VMs or sandboxes with kernels of their own would otherwise let one remove the live
// folders of another.
std::string BootTag() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id) || id.size() < 8) return "";
  id.resize(8);
  for (const char c : id) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
  }
  return id;
}

// Whose a mirror folder is: the process, its pid namespace and its kernel's boot.
struct FolderOwner {
  pid_t pid;
  uint64_t pid_namespace;
  std::string boot;
};

// The owner a mirror folder's name records (`lazyattn-tls-<pid>-<pid namespace>-<boot>-XXXXXX`);
// nullopt for any other name, such as the `lazyattn-tls-XXXXXX` of builds that recorded none.
std::optional<FolderOwner> OwnerOf(std::string_view name) {
  const std::string_view prefix = kFolderPrefix;
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(name.data(), name.size()).substr(prefix.size()), '-');
  int64_t pid = 0;
  uint64_t pid_namespace = 0;
  if (parts.size() != 4 || parts[2].size() != 8 || parts[3].size() != 6 ||
      !absl::SimpleAtoi(parts[0], &pid) || !absl::SimpleAtoi(parts[1], &pid_namespace) ||
      pid <= 0 || pid > INT32_MAX) {
    return std::nullopt;
  }
  return FolderOwner{.pid = static_cast<pid_t>(pid),
                     .pid_namespace = pid_namespace,
                     .boot = std::string(parts[2])};
}

// Closes the descriptor on every way out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// The names in the open folder `dir` (a descriptor of its own is read: `dir` stays open).
std::vector<std::string> Entries(int dir) {
  std::vector<std::string> names;
  const int own = dup(dir);
  if (own < 0) return names;
  DIR* d = fdopendir(own);
  if (d == nullptr) {
    close(own);
    return names;
  }
  rewinddir(d);
  while (const dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  closedir(d);
  return names;
}

// Removes `name` from the open folder `parent` when it is a mirror folder whose process is gone:
// a directory (a symbolic link is never followed, whoever made it) of this user, whose name
// records a pid of this pid namespace (`pid_namespace`) that no process has (kill: ESRCH). Only
// what is directly in it is unlinked (its copies; a symbolic link itself, not its target; never
// a subfolder), then the folder when that emptied it. Best effort: errors leave it there.
// Another user cannot swap the folder between these checks and the removal: in /tmp (sticky)
// only its owner, this user, may rename or remove it.
bool RemoveIfStale(int parent, const std::string& name, const FolderOwner& self) {
  const std::optional<FolderOwner> owner = OwnerOf(name);
  if (!owner.has_value() || owner->pid_namespace != self.pid_namespace ||
      owner->boot != self.boot || owner->pid == self.pid) {
    return false;
  }
  if (kill(owner->pid, 0) == 0 || errno != ESRCH) return false;  // alive, or not ours to signal
  struct stat entry {};
  if (fstatat(parent, name.c_str(), &entry, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(entry.st_mode) ||
      entry.st_uid != geteuid()) {
    return false;
  }
  Fd folder{openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  struct stat opened {};
  if (folder.fd < 0 || fstat(folder.fd, &opened) != 0 || opened.st_dev != entry.st_dev ||
      opened.st_ino != entry.st_ino || opened.st_uid != geteuid()) {
    return false;  // replaced since it was checked
  }
  for (const std::string& file : Entries(folder.fd)) {
    struct stat st {};
    if (fstatat(folder.fd, file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode)) {
      unlinkat(folder.fd, file.c_str(), 0);
    }
  }
  return unlinkat(parent, name.c_str(), AT_REMOVEDIR) == 0;
}

// Removes the mirror folders under `base` that this user's processes, killed outright, left
// (TlsFileMirror's destructor never ran). Nothing when this process's pid namespace or boot is
// unknown. Once per `base` and process: the scan reads the whole folder (a /tmp of many
// thousands of entries takes a noticeable part of a second), and a process's later mirrors
// would find nothing new.
void RemoveStaleFolders(const std::string& base, const FolderOwner& self) {
  if (self.pid_namespace == 0 || self.boot.empty()) return;
  static absl::Mutex scanned_mu(absl::kConstInit);
  static std::set<std::string>* scanned = new std::set<std::string>();  // never destroyed
  {
    absl::MutexLock lock(&scanned_mu);
    if (!scanned->insert(base).second) return;
  }
  Fd parent{open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (parent.fd < 0) return;
  for (const std::string& name : Entries(parent.fd)) {
    if (OwnerOf(name).has_value() && RemoveIfStale(parent.fd, name, self)) {
      LogInfo("tls")
          .Str("folder", absl::StrCat(base, "/", name))
          .Msg("removed the TLS folder of a process that no longer runs");
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFileMirror>> TlsFileMirror::Create(const TlsOptions& tls) {
  absl::StatusOr<TlsFileContents> contents = ReadTlsFiles(tls);
  if (!contents.ok()) return contents.status();
  const char* tmpdir = getenv("TMPDIR");
  const std::string base = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  const FolderOwner self{.pid = getpid(), .pid_namespace = PidNamespace(), .boot = BootTag()};
  // The owner in the name, so that the next mirror made after this process was killed outright
  // can tell the folder is nobody's (RemoveStaleFolders).
  std::string templ = absl::StrCat(base, "/", kFolderPrefix, self.pid, "-", self.pid_namespace, "-",
                                   self.boot.empty() ? "00000000" : self.boot, "-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {  // mode 0700
    return absl::InternalError(absl::StrCat("cannot make a private folder for the TLS files (",
                                            templ, "): set TMPDIR to a writable folder"));
  }
  RemoveStaleFolders(base, self);
  std::unique_ptr<TlsFileMirror> mirror(new TlsFileMirror(tls, templ));
  {
    absl::MutexLock mirror_lock(&mirror->mu_);
    if (absl::Status s = mirror->Publish(*contents); !s.ok()) return s;  // the folder goes too
  }
  mirror->thread_ = std::thread([m = mirror.get()] { m->Loop(); });
  return mirror;
}

absl::StatusOr<std::shared_ptr<TlsFileMirror>> TlsFileMirror::For(const TlsOptions& tls) {
  using Key = std::tuple<std::string, std::string, std::string, int, std::string>;
  // OpenSSL's own exit handler is registered before the registry exists, so it runs after the
  // registry's destructor has stopped every mirror's thread (which may be inside OpenSSL).
  OPENSSL_init_crypto(0, nullptr);
  static absl::Mutex registry_mu(absl::kConstInit);
  // Kept to the end of the process (a channel made from a mirror's files cannot hold it), and
  // destroyed at exit after main's servers and channels, which removes the folders. A process
  // killed outright leaves its folder (three small files) behind, until the next mirror one of
  // its user's processes makes (RemoveStaleFolders).
  static std::map<Key, std::shared_ptr<TlsFileMirror>> registry;
  const Key key{tls.cert_file, tls.key_file, tls.ca_file, tls.refresh_interval_s, tls.own_role};
  absl::MutexLock lock(&registry_mu);
  // An existing mirror is returned as it is: a router dials workers as they appear, and files
  // caught mid-rotation must not stop it dialling with the last good set (start-up paths check
  // the files themselves: StartGrpcServer, RouterServer::Create, a first MakeChannel).
  if (auto it = registry.find(key); it != registry.end()) return it->second;
  absl::StatusOr<std::unique_ptr<TlsFileMirror>> made = Create(tls);
  if (!made.ok()) return made.status();
  std::shared_ptr<TlsFileMirror> mirror = std::move(*made);
  registry.emplace(key, mirror);
  return mirror;
}

TlsFileMirror::TlsFileMirror(const TlsOptions& source, std::string dir)
    : source_(source), dir_(std::move(dir)), watched_(source) {
  auto at = [&](const std::string& original, const char* name) {
    return original.empty() ? std::string() : absl::StrCat(dir_, "/", name);
  };
  watched_.cert_file = at(source.cert_file, "cert.pem");
  watched_.key_file = at(source.key_file, "key.pem");
  watched_.ca_file = at(source.ca_file, "ca.pem");
  // gRPC re-reads the copies, which change only when a good set replaces them: often enough that
  // a new set is served soon after it is copied, rarely enough that a router's provider per
  // worker channel (each re-reading three files) stays cheap.
  watched_.refresh_interval_s = std::clamp(source.refresh_interval_s, 1, 10);
}

TlsFileMirror::~TlsFileMirror() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status TlsFileMirror::Publish(const TlsFileContents& contents) {
  if (contents == published_) return absl::OkStatus();
  // The CA and the certificate before the key: gRPC reads the key and the certificate apart, and
  // a key read between the two renames is refused by its pair check or fails handshakes until
  // its next read, a second later, never aborts.
  if (!watched_.ca_file.empty() && contents.ca != published_.ca) {
    if (absl::Status s = WriteWhole(watched_.ca_file, contents.ca, 0644); !s.ok()) return s;
  }
  if (!watched_.cert_file.empty() && contents.cert != published_.cert) {
    if (absl::Status s = WriteWhole(watched_.cert_file, contents.cert, 0644); !s.ok()) return s;
  }
  if (!watched_.key_file.empty() && contents.key != published_.key) {
    if (absl::Status s = WriteWhole(watched_.key_file, contents.key, 0600); !s.ok()) return s;
  }
  published_ = contents;
  for (const auto& [id, listener] : listeners_) listener(published_);
  return absl::OkStatus();
}

std::unique_ptr<TlsFileMirror::Subscription> TlsFileMirror::Subscribe(Listener listener) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_listener_++;
  listener(published_);
  listeners_.emplace(id, std::move(listener));
  return std::unique_ptr<Subscription>(new Subscription(this, id));
}

TlsFileMirror::Subscription::~Subscription() {
  absl::MutexLock lock(&mirror_->mu_);
  mirror_->listeners_.erase(id_);
}

absl::Status TlsFileMirror::RefreshNow() {
  absl::StatusOr<TlsFileContents> contents = ReadTlsFiles(source_);
  absl::MutexLock lock(&mu_);
  if (!contents.ok()) {
    const std::string error(contents.status().message());
    if (error != last_error_) {
      LogWarning("tls")
          .Str("error", error)
          .Msg("TLS files not reloaded: they do not pass; the previous ones stay in service");
      last_error_ = error;
    }
    return contents.status();
  }
  const bool changed = !(*contents == published_);
  if (absl::Status s = Publish(*contents); !s.ok()) {
    LogWarning("tls").Str("error", std::string(s.message())).Msg("TLS files not reloaded");
    return s;
  }
  if (changed || !last_error_.empty()) {
    LogInfo("tls")
        .Str("cert_file", source_.cert_file)
        .Str("ca_file", source_.ca_file)
        .Msg(changed ? "TLS files reloaded" : "TLS files pass again");
  }
  last_error_.clear();
  return absl::OkStatus();
}

void TlsFileMirror::Loop() {
  const absl::Duration interval = absl::Seconds(source_.refresh_interval_s);
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval)) {
    mu_.Unlock();
    (void)RefreshNow();
    mu_.Lock();
  }
}

}  // namespace lazyattn
