// For tests that need certificates: a fresh set from tools/gen-certs in a folder named after the
// running test, and whole-file reads. tools/gen-certs is run from the source tree, as ctest runs
// tests (their working directory is the repository).
#ifndef LAZYATTN_COMMON_TEST_CERTS_FOR_TEST_H_
#define LAZYATTN_COMMON_TEST_CERTS_FOR_TEST_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace lazyattn::testing {

// TempDir()/PREFIX-TESTNAME-PID (per process: ctest may run a binary's tests side by side) with
// a CA and the certificates `tools/gen-certs --workers WORKERS --force` makes there (kvdir,
// router-0, worker-0..); "" when gen-certs failed (the test's ASSERT says so).
inline std::string MakeTestCerts(const std::string& prefix, int workers = 1) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/", prefix, "-",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name(), "-", getpid());
  const std::string command =
      absl::StrCat("tools/gen-certs --out '", dir, "' --workers ", workers, " --force >/dev/null");
  return std::system(command.c_str()) == 0 ? dir : "";
}

// The whole text of `path` ("" when it cannot be read).
inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace lazyattn::testing

#endif  // LAZYATTN_COMMON_TEST_CERTS_FOR_TEST_H_
