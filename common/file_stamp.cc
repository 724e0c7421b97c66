#include "common/file_stamp.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

FileStamp FromStat(const struct stat& st) {
  return FileStamp{.device = static_cast<uint64_t>(st.st_dev),
                   .inode = static_cast<uint64_t>(st.st_ino),
                   .size = static_cast<int64_t>(st.st_size),
                   .mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// Closes the descriptor on every way out.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

FileStamp StampOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return FileStamp{};
  return FromStat(st);
}

absl::StatusOr<StampedText> ReadStampedFile(const std::string& path, int64_t max_bytes) {
  constexpr int kTries = 3;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    // Non-blocking: opening a FIFO for reading would otherwise wait for a writer.
    Descriptor file{open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
    struct stat before {};
    if (file.fd < 0 || fstat(file.fd, &before) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (!S_ISREG(before.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": not a regular file"));
    }
    if (before.st_size > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", before.st_size,
                                                     " bytes, more than ", max_bytes));
    }
    StampedText out{.stamp = FromStat(before)};
    char buf[64 * 1024];
    while (true) {
      const ssize_t n = read(file.fd, buf, sizeof(buf));
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::InvalidArgumentError(
            absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
      }
      out.text.append(buf, static_cast<size_t>(n));
      if (static_cast<int64_t>(out.text.size()) > max_bytes) break;  // grew: the stamps differ
    }
    struct stat after {};
    // Read whole: as many bytes as the file has, and the same version before and after.
    if (fstat(file.fd, &after) == 0 && FromStat(after) == out.stamp &&
        static_cast<int64_t>(out.text.size()) == out.stamp.size) {
      return out;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("cannot read ", path,
                                                 ": it kept changing while it was read (", kTries,
                                                 " tries); write it elsewhere and rename it over"));
}

}  // namespace lazyattn
