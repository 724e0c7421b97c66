// Shared by the DirectoryIndex tests (directory_index_*_test.cc): keys, worker statuses and events
// to feed the index, and IndexTest, whose index runs on a fake clock (now_) that tests advance.
#ifndef LAZYATTN_SERVICES_KVDIR_INDEX_DIRECTORY_INDEX_TEST_FIXTURE_H_
#define LAZYATTN_SERVICES_KVDIR_INDEX_DIRECTORY_INDEX_TEST_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "services/kvdir/index/directory_index.h"

namespace lazyattn::kvdir::testing {

inline constexpr absl::Duration kLease = absl::Seconds(3);

inline DocumentKey Key(uint64_t n) { return DocumentKey{n, ~n}; }

inline v1::WorkerStatus Status(const std::string& id) {
  v1::WorkerStatus s;
  s.set_worker_id(id);
  s.set_address(id + ".local:7000");
  return s;
}

inline v1::WorkerStatus StatusAt(const std::string& id, const std::string& address) {
  v1::WorkerStatus s = Status(id);
  s.set_address(address);
  return s;
}

inline DocEvent Stored(uint64_t key, int64_t tokens, int64_t offset = kLazyOffset) {
  return DocEvent{DocEventKind::kStored, DocEntry{Key(key), tokens, offset}};
}
inline DocEvent Evicted(uint64_t key, int64_t offset = kLazyOffset) {
  return DocEvent{DocEventKind::kEvicted, DocEntry{Key(key), 0, offset}};
}

// A worker that said Hello (seq 1) and sent an empty snapshot (seq 2): ready for events at seq 3.
// Outside an anonymous namespace: the tests of one fixture in several files must share its type.
class IndexTest : public ::testing::Test {
 protected:
  // `peer_host`: the host the worker's stream comes from.
  uint64_t Join(const std::string& id, uint64_t epoch = 7, const std::string& peer_host = "") {
    const uint64_t session =
        index_.Hello(Status(id), epoch, 1, now_, {.peer_host = peer_host}).session;
    EXPECT_EQ(index_.ApplySnapshot(id, session, 2, {}, nullptr, now_).outcome,
              ApplyOutcome::kApplied);
    return session;
  }
  // id -> resident_tokens for `keys`.
  std::vector<std::pair<std::string, int64_t>> Tokens(const std::vector<DocumentKey>& keys) {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const WorkerResidency& r : index_.Lookup(keys, now_)) {
      out.emplace_back(r.status.worker_id(), r.resident_tokens);
    }
    return out;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  DirectoryIndex index_{kLease};
};

using Pair = std::pair<std::string, int64_t>;

}  // namespace lazyattn::kvdir::testing

#endif  // LAZYATTN_SERVICES_KVDIR_INDEX_DIRECTORY_INDEX_TEST_FIXTURE_H_
