#include "common/file_stamp.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

class FileStampTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/file-stamp-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  // Sets `path`'s modification time to `seconds` since the epoch.
  static void SetMtime(const std::string& path, time_t seconds) {
    const struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  }

  std::string dir_;
};

TEST_F(FileStampTest, ReadsTheTextWithTheStampOfItsVersion) {
  const std::string path = Write("keys.yaml", "keys: []\n");
  absl::StatusOr<StampedText> read = ReadStampedFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->text, "keys: []\n");
  EXPECT_EQ(read->stamp, StampOf(path));
  EXPECT_EQ(read->stamp.size, 9);
}

// A key rotated by renaming a new file over the old one keeps its length (names and hashes of
// fixed size), and a copy can keep its time (cp -p, rsync -t): only the inode tells them apart.
TEST_F(FileStampTest, AFileRenamedOverIsAnotherVersionWhateverItsSizeAndTime) {
  const std::string path = Write("keys.yaml", "key: aaaa\n");
  SetMtime(path, 1'700'000'000);
  const FileStamp old = StampOf(path);
  const std::string next = Write("keys.yaml.next", "key: bbbb\n");
  SetMtime(next, 1'700'000'000);
  std::filesystem::rename(next, path);
  const FileStamp now = StampOf(path);
  EXPECT_EQ(now.size, old.size);
  EXPECT_EQ(now.mtime_ns, old.mtime_ns);
  EXPECT_NE(now, old);
}

TEST_F(FileStampTest, AFileRewrittenInPlaceIsAnotherVersion) {
  const std::string path = Write("keys.yaml", "key: aaaa\n");
  SetMtime(path, 1'700'000'000);
  const FileStamp old = StampOf(path);
  std::ofstream(path, std::ios::trunc) << "key: bbbb, cccc\n";
  EXPECT_NE(StampOf(path), old);
}

TEST_F(FileStampTest, AMissingFileHasNoStampAndIsNamedWhenRead) {
  const std::string path = dir_ + "/absent.yaml";
  EXPECT_EQ(StampOf(path), FileStamp{});
  absl::StatusOr<StampedText> read = ReadStampedFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace lazyattn
