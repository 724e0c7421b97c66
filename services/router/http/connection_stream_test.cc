// ConnectionStream's write wait budget on its own, over a Unix socket pair with small buffers: the
// test's reader thread takes the bytes at a steady pace, so each write of a large answer waits on
// it, as the router's writes wait on a slow client.
#include "services/router/http/connection_stream.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace lazyattn::router {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// A socket pair whose reading end is drained by a thread at about `bytes_per_s` (4 KiB reads),
// until the writing end closes.
class PacedPair {
 public:
  explicit PacedPair(double bytes_per_s) {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
    const int small = 8 << 10;
    setsockopt(fds_[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    setsockopt(fds_[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    reader_ = std::thread([this, bytes_per_s] {
      const auto start = steady_clock::now();
      char buf[4096];
      for (ssize_t n; (n = read(fds_[1], buf, sizeof(buf))) > 0;) {
        read_ += static_cast<size_t>(n);
        std::this_thread::sleep_until(
            start + std::chrono::duration_cast<steady_clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(read_) / bytes_per_s)));
      }
    });
  }
  ~PacedPair() {
    CloseWriter();
    reader_.join();
    close(fds_[1]);
  }
  int writer() const { return fds_[0]; }
  void CloseWriter() {
    if (fds_[0] >= 0) close(fds_[0]);
    fds_[0] = -1;
  }

 private:
  int fds_[2] = {-1, -1};
  std::atomic<size_t> read_{0};
  std::thread reader_;
};

// Writes `bytes` through `stream` as cpp-httplib does (each write may be partial); the bytes
// written before a write failed, or all of them.
size_t WriteAll(ConnectionStream& stream, size_t bytes) {
  const std::string piece(16 << 10, 'x');
  size_t written = 0;
  while (written < bytes) {
    const ssize_t n = stream.write(piece.data(), std::min(piece.size(), bytes - written));
    if (n < 0) break;
    written += static_cast<size_t>(n);
  }
  return written;
}

double SecondsSince(steady_clock::time_point start) {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

// The reader takes 1 MB in ~2 s, so the writes wait ~2 s in all: past a 300 ms budget they fail.
TEST(ConnectionStreamTest, WritesFailOnceTheyHaveWaitedTheirBudget) {
  PacedPair pair(/*bytes_per_s=*/500e3);
  PlainStream stream(pair.writer(), milliseconds(1000), milliseconds(10000));
  stream.BeginRequest(0);
  stream.set_write_wait_budget(milliseconds(300));
  const auto start = steady_clock::now();
  const size_t written = WriteAll(stream, 1 << 20);
  EXPECT_LT(written, size_t{1} << 20) << "not cut";
  EXPECT_GE(SecondsSince(start), 0.3);
  EXPECT_LT(SecondsSince(start), 1.5) << "cut late";
}

// The same reader and budget, but the bytes earn waiting time at 100 KB/s: 1 MB earns 10 s, far
// more than the ~2 s the writes wait, so a client reading faster than the earning rate is never
// cut however long its answer.
TEST(ConnectionStreamTest, BytesSentEarnWaitingTimeAtTheGivenRate) {
  PacedPair pair(/*bytes_per_s=*/500e3);
  PlainStream stream(pair.writer(), milliseconds(1000), milliseconds(10000));
  stream.BeginRequest(0);
  stream.set_write_wait_budget(milliseconds(300), /*earned_bytes_per_s=*/100'000);
  const auto start = steady_clock::now();
  EXPECT_EQ(WriteAll(stream, 1 << 20), size_t{1} << 20);
  EXPECT_GT(SecondsSince(start), 1.0) << "the writes did not wait past the budget: no test";
}

// Five requests on one connection each wait ~0.5 s (~0.35-0.45 s counted) against a 1 s budget:
// more than two budgets in all, but the time waited starts again at each request (a kept-alive
// connection's later answers are not cut for its earlier ones). The same writes as one request
// are cut.
TEST(ConnectionStreamTest, TheBudgetStartsAgainAtEachRequest) {
  {
    PacedPair pair(/*bytes_per_s=*/500e3);
    PlainStream stream(pair.writer(), milliseconds(1000), milliseconds(10000));
    for (int request = 0; request < 5; ++request) {
      stream.BeginRequest(0);
      stream.set_write_wait_budget(milliseconds(1000));
      EXPECT_EQ(WriteAll(stream, 250'000), 250'000u) << "request " << request << " cut";
    }
  }
  PacedPair pair(/*bytes_per_s=*/500e3);
  PlainStream stream(pair.writer(), milliseconds(1000), milliseconds(10000));
  stream.BeginRequest(0);
  stream.set_write_wait_budget(milliseconds(1000));
  size_t written = 0;
  for (int request = 0; request < 5; ++request) written += WriteAll(stream, 250'000);
  EXPECT_LT(written, 1'250'000u) << "the same writes in one request were not cut: no test";
}

// What a request's bytes earned does not carry over either: the first request earns far more
// than it waits (250 KB at 100 KB/s: 2.5 s, against ~0.5 s of waits), the second earns nothing
// and waits ~0.5 s against a 300 ms budget, so it is cut.
TEST(ConnectionStreamTest, EarnedTimeStartsAgainAtEachRequest) {
  PacedPair pair(/*bytes_per_s=*/500e3);
  PlainStream stream(pair.writer(), milliseconds(1000), milliseconds(10000));
  stream.BeginRequest(0);
  stream.set_write_wait_budget(milliseconds(300), /*earned_bytes_per_s=*/100'000);
  ASSERT_EQ(WriteAll(stream, 250'000), 250'000u);
  stream.BeginRequest(0);
  stream.set_write_wait_budget(milliseconds(300));
  EXPECT_LT(WriteAll(stream, 250'000), 250'000u) << "the first request's earnings were kept";
}

}  // namespace
}  // namespace lazyattn::router
