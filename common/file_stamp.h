// Which version of a file a process has read, for files re-read while it runs (API keys,
// certificates): a reload is due when the stamp differs, and the text read must belong to the
// stamp recorded with it.
//
//   ASSIGN_OR_RETURN(StampedText keys, ReadStampedFile(path));
//   ... later, every reload interval:
//   if (StampOf(path) != keys.stamp) Reload();
#ifndef LAZYATTN_COMMON_FILE_STAMP_H_
#define LAZYATTN_COMMON_FILE_STAMP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace lazyattn {

// Where a file lives (device, inode: a file renamed over the path is another one, whatever its
// size and time) and its size and modification time (one rewritten in place).
struct FileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = -1;
  int64_t mtime_ns = -1;
  bool operator==(const FileStamp&) const = default;
};

// The stamp of `path` now (following symbolic links, as a Kubernetes Secret's files are); the
// default stamp, equal to no real file's, when it cannot be stat'ed.
FileStamp StampOf(const std::string& path);

struct StampedText {
  std::string text;
  FileStamp stamp;  // of the version `text` was read from
};

// `path` read whole through one descriptor, stat'ed before and after: a read the file changed
// under (rewritten in place, not renamed over) is read again, up to three times, so the text is
// never half of one version and half of another. Only a regular file (a symbolic link to one is
// followed) of at most `max_bytes`: a FIFO or a device would block or never end the read.
// InvalidArgument naming the path when it cannot be opened or read, is not such a file, or kept
// changing.
absl::StatusOr<StampedText> ReadStampedFile(const std::string& path,
                                            int64_t max_bytes = int64_t{16} << 20);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_FILE_STAMP_H_
