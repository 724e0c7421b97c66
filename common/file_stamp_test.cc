#include "common/file_stamp.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

// What an operator may point a key file at by mistake: a FIFO (opening it for reading would wait
// for a writer: the router would hang at start or in its auth filter), a directory, a file far
// larger than any key list. Each is refused at once, naming the path.
TEST_F(FileStampTest, AFifoADirectoryAndAnOversizedFileAreRefusedAtOnce) {
  const std::string fifo = dir_ + "/keys.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const absl::Time start = absl::Now();
  absl::StatusOr<StampedText> read = ReadStampedFile(fifo);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("not a regular file"));
  EXPECT_THAT(read.status().message(), HasSubstr(fifo));

  read = ReadStampedFile(dir_);
  EXPECT_THAT(read.status().message(), HasSubstr("not a regular file"));

  const std::string big = Write("big.yaml", std::string(2048, 'k'));
  read = ReadStampedFile(big, /*max_bytes=*/1024);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("2048 bytes, more than 1024"));
  EXPECT_TRUE(ReadStampedFile(big, /*max_bytes=*/2048).ok());

  // A symbolic link to a regular file (a Kubernetes Secret's files are) is read through.
  const std::string link = dir_ + "/keys.link";
  std::filesystem::create_symlink(big, link);
  read = ReadStampedFile(link);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->text.size(), 2048u);
}

}  // namespace
}  // namespace lazyattn
