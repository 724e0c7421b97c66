#include "tools/cli/doc_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_stamp.h"
#include "common/status_macros.h"

namespace lazyattn {
namespace {

// A file that reports no size: a pipe (`--doc <(cmd)`, `/dev/stdin`), a character device, or a
// regular file of /proc or /sys (size 0). Read as a stream up to max_bytes + 1 bytes, so that
// /dev/zero is refused once it passes the limit; a FIFO is waited on, as a shell's `cat` would.
absl::StatusOr<std::string> ReadStream(const std::string& path, int64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  std::string text;
  char buf[1 << 16];
  while (static_cast<int64_t>(text.size()) <= max_bytes) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", path, ": more than ", max_bytes, " bytes"));
  }
  return text;
}

// One --doc file: a regular file with a size through ReadStampedFile (a file rewritten while read
// is read again); anything else but a directory as a bounded stream.
absl::StatusOr<std::string> ReadDocFile(const std::string& path, int64_t max_bytes) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": a directory"));
  }
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    ASSIGN_OR_RETURN(StampedText read, ReadStampedFile(path, max_bytes));
    return std::move(read.text);
  }
  return ReadStream(path, max_bytes);
}

}  // namespace

void DeclareDocFlags(CliArgs& args, const std::string& help) {
  args.Declare("doc", CliArgs::Kind::kRepeated, help);
  args.Declare("max-doc-bytes", CliArgs::Kind::kValue,
               absl::StrCat("the largest --doc file read, in bytes (default ", kDefaultMaxDocBytes,
                            ": the router's default limits.max_document_bytes)"));
}

absl::StatusOr<std::vector<std::string>> ReadDocFiles(const CliArgs& args) {
  constexpr int64_t kMaxLimit = std::numeric_limits<int32_t>::max();
  ASSIGN_OR_RETURN(const int64_t max_bytes, args.Int("max-doc-bytes", kDefaultMaxDocBytes));
  if (max_bytes < 1 || max_bytes > kMaxLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-doc-bytes: ", max_bytes, " outside [1, ", kMaxLimit, "]"));
  }
  std::vector<std::string> texts;
  for (const std::string& path : args.Strings("doc")) {
    absl::StatusOr<std::string> read = ReadDocFile(path, max_bytes);
    if (!read.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--doc: ", read.status().message(),
                                                     " (--doc takes a file of at most ", max_bytes,
                                                     " bytes: --max-doc-bytes)"));
    }
    texts.push_back(*std::move(read));
  }
  return texts;
}

}  // namespace lazyattn
