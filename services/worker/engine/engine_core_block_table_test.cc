// Persistent block tables (engine_core_block_table.h): the table alone, and the engine's tables as
// a backend sees them. A recording backend checks every chunk against the ForwardChunk contract (a
// version's unchanged entries are the previous version's; a decode step changes at most one
// entry), and EngineOptions::check_pool_every_step compares every table with the one rebuilt from
// the request's segments after every step (what the engine built before tables persisted), so a
// wrong entry stops the engine and fails these tests.
#include "services/worker/engine/engine_core_block_table.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "common/monotonic_time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/cpu_runner.h"
#include "services/worker/engine/engine_core.h"
#include "services/worker/engine/pipelining_cpu_runner_for_test.h"
#include "services/worker/engine/request_prep.h"
#include "services/worker/model/model_fingerprint.h"
#include "services/worker/model/random_weights.h"
#include "services/worker/model/tokenizer/byte_tokenizer.h"

namespace lazyattn {
namespace {

std::vector<KvBlockEntry> Entries(const SequenceBlockTable& t) {
  return {t.entries().begin(), t.entries().end()};
}

TEST(SequenceBlockTableTest, GrowsAcrossBlocksAndSegmentsChangingOnlyTheTail) {
  constexpr int B = 4;
  SequenceBlockTable t(B);
  t.Reset(7);
  const std::vector<BlockId> prefix = {10, 11}, doc = {20, 21, 22}, query = {30, 31, 32};
  ASSERT_TRUE(t.Cover(0, prefix, 6, 0));
  auto s = t.Take();
  EXPECT_EQ(s.sequence, 7u);
  EXPECT_EQ(s.version, 1u);
  EXPECT_EQ(s.unchanged, 0);
  EXPECT_EQ(Entries(t), (std::vector<KvBlockEntry>{PackKvBlockEntry(10, 0, 4),
                                                   PackKvBlockEntry(11, 0, 2)}));
  // The prefix completes (its last entry changes), a document and 1 query token are added.
  ASSERT_TRUE(t.Cover(0, prefix, 7, 0));
  ASSERT_TRUE(t.Cover(1, doc, 9, 7));
  ASSERT_TRUE(t.Cover(2, query, 1, 16));
  s = t.Take();
  EXPECT_EQ(s.version, 2u);
  EXPECT_EQ(s.unchanged, 1);
  EXPECT_EQ(Entries(t), (std::vector<KvBlockEntry>{
                            PackKvBlockEntry(10, 0, 4), PackKvBlockEntry(11, 0, 3),
                            PackKvBlockEntry(20, 7, 4), PackKvBlockEntry(21, 7, 4),
                            PackKvBlockEntry(22, 7, 1), PackKvBlockEntry(30, 16, 1)}));
  // Decode: the last entry fills up, then a new one is appended; nothing else changes.
  for (int64_t tokens = 2; tokens <= 9; ++tokens) {
    ASSERT_TRUE(t.Cover(2, query, tokens, 16));
    s = t.Take();
    const int64_t entries = static_cast<int64_t>(s.entries.size());
    EXPECT_EQ(entries, 5 + (tokens + B - 1) / B);
    // Appending keeps every old entry; a count change leaves all but the last.
    EXPECT_EQ(s.unchanged, entries - 1);
    EXPECT_EQ(KvEntryValid(s.entries.back()), static_cast<uint32_t>((tokens - 1) % B + 1));
  }
  // Covering the same again changes nothing.
  ASSERT_TRUE(t.Cover(2, query, 9, 16));
  s = t.Take();
  EXPECT_EQ(s.unchanged, static_cast<int64_t>(s.entries.size()));
  // A shrink (a launched step that never ran) drops the tail; a regrow re-sends it.
  ASSERT_TRUE(t.Cover(2, query, 5, 16));
  ASSERT_TRUE(t.Cover(2, query, 6, 16));
  s = t.Take();
  EXPECT_EQ(s.entries.size(), 7u);
  EXPECT_EQ(s.unchanged, 6);
  EXPECT_EQ(s.entries.back(), PackKvBlockEntry(31, 16, 2));
  // Out of order, or blocks missing: refused, nothing changed.
  EXPECT_FALSE(t.Cover(0, prefix, 7, 0));
  EXPECT_FALSE(t.Cover(4, query, 1, 16));
  EXPECT_FALSE(t.Cover(2, query, 13, 16)) << "covered past the segment's blocks";
  EXPECT_EQ(t.entries().size(), 7u);
  // Reset: a new sequence whose first version shares nothing.
  t.Reset(8);
  ASSERT_TRUE(t.Cover(0, prefix, 3, 0));
  s = t.Take();
  EXPECT_EQ(s.sequence, 8u);
  EXPECT_EQ(s.version, 1u);
  EXPECT_EQ(s.unchanged, 0);
}

// What a backend that keeps tables would hold: per sequence, the last version it took. Checks each
// chunk against the ForwardChunk contract and records what it had to take.
class TableRecorder {
 public:
  void See(const ForwardChunk& ch, int block_size) {
    const std::vector<KvBlockEntry> entries(ch.block_table.begin(), ch.block_table.end());
    int64_t keys = 0;
    for (KvBlockEntry e : entries) {
      keys += KvEntryValid(e);
      any_delta_ |= KvEntryDelta(e) != 0;
      EXPECT_TRUE(KvEntryValid(e) >= 1 && KvEntryValid(e) <= static_cast<uint32_t>(block_size));
    }
    // The table ends with the chunk's last token: earlier segments whole, its own up to it.
    EXPECT_EQ(keys, ch.first_query_index + static_cast<int64_t>(ch.tokens.size()));
    if (ch.table_sequence == 0) return;
    ++chunks_;
    if (ch.table_version == 1) {
      EXPECT_EQ(ch.table_unchanged, 0);
      // A sequence's first version: an id no earlier table had.
      EXPECT_TRUE(seen_.insert(ch.table_sequence).second) << "sequence id reused";
    }
    EXPECT_TRUE(seen_.contains(ch.table_sequence)) << "a sequence that began unseen";
    auto it = held_.find(ch.table_sequence);
    if (it != held_.end()) {
      EXPECT_GT(ch.table_version, it->second.version);
    }
    if (it != held_.end() && it->second.version + 1 == ch.table_version) {
      const std::vector<KvBlockEntry>& before = it->second.entries;
      ASSERT_LE(ch.table_unchanged, static_cast<int64_t>(before.size()));
      ASSERT_LE(ch.table_unchanged, static_cast<int64_t>(entries.size()));
      EXPECT_TRUE(std::equal(before.begin(), before.begin() + ch.table_unchanged,
                             entries.begin()))
          << "an entry promised unchanged changed (sequence " << ch.table_sequence << ")";
      const int64_t taken = static_cast<int64_t>(entries.size()) - ch.table_unchanged;
      if (ch.tokens.size() == 1) {
        EXPECT_LE(taken, 1) << "a decode step changed more than its last entry";
        ++decodes_;
      }
      entries_taken_ += taken;
    } else {
      ++whole_tables_;
      entries_taken_ += static_cast<int64_t>(entries.size());
    }
    held_[ch.table_sequence] = {ch.table_version, entries};
  }
  // A step the backend refused or that failed: nothing of it was kept.
  void Forget(std::span<const ForwardChunk> chunks) {
    for (const ForwardChunk& ch : chunks) held_.erase(ch.table_sequence);
  }
  bool any_delta() const { return any_delta_; }
  int64_t sequences() const { return static_cast<int64_t>(seen_.size()); }
  int64_t decodes() const { return decodes_; }
  int64_t whole_tables() const { return whole_tables_; }
  int64_t chunks() const { return chunks_; }

 private:
  struct Held {
    uint64_t version = 0;
    std::vector<KvBlockEntry> entries;
  };
  std::map<uint64_t, Held> held_;
  std::set<uint64_t> seen_;  // every sequence id seen
  bool any_delta_ = false;
  int64_t chunks_ = 0, decodes_ = 0, whole_tables_ = 0, entries_taken_ = 0;
};

class EngineBlockTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weights_ = MakeRandomWeights(TinyTestConfig(), 3);
    tokenizer_ = MakeByteTokenizer();
    identity_ = {ModelFingerprint(*weights_), TokenizerFingerprint(*tokenizer_)};
  }

  EngineRequest Request(std::vector<int> docs, CacheMode mode, int max_tokens) {
    EngineRequest r;
    r.system_prefix = "Answer from the documents.\n";  // 27 tokens: a partial last block
    for (int d : docs) {
      std::mt19937 rng(100 + d);
      std::vector<int32_t> t(17 + 13 * d);
      for (int32_t& x : t) x = static_cast<int32_t>(rng() % 256);
      r.documents.push_back({.id = "doc" + std::to_string(d), .token_ids = t});
    }
    r.question = "Which one?";
    r.mode = mode;
    r.sampling = {.max_tokens = max_tokens, .ignore_eos = true};
    return r;
  }

  struct Run {
    std::vector<absl::Status> status;
    std::vector<std::vector<int32_t>> tokens;
    int64_t preemptions = 0;
    int chained = 0;
  };
  // Runs the requests to the end with every table checked against its rebuild after every step,
  // on the CPU backend (optionally pipelined, every `fail_every`-th chained launch failing),
  // every chunk recorded in recorder_.
  Run Drive(const std::vector<EngineRequest>& requests, int64_t blocks, int max_batch_tokens,
            bool pipeline = false, int fail_every = 0) {
    recorder_ = TableRecorder();
    auto runner = std::make_unique<testing::PipeliningCpuRunner>(weights_.get(), blocks, fail_every,
                                                                 pipeline);
    runner->on_run = [this](std::span<const ForwardChunk> chunks) {
      for (const ForwardChunk& ch : chunks) recorder_.See(ch, kDefaultKvBlockSize);
    };
    runner->on_refused_launch = [this](std::span<const ForwardChunk> chunks) {
      recorder_.Forget(chunks);
    };
    testing::PipeliningCpuRunner* runner_ptr = runner.get();
    core_ = std::make_unique<EngineCore>(std::move(runner), tokenizer_.get(),
                                         EngineOptions{.max_batch_tokens = max_batch_tokens,
                                                       .pipeline_decode = pipeline,
                                                       .check_pool_every_step = true});
    Run run;
    run.status.resize(requests.size());
    run.tokens.resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      auto p = PrepareRequest(requests[i], *tokenizer_, weights_->config, identity_, {});
      EXPECT_TRUE(p.ok()) << p.status();
      p->callbacks.on_done = [&run, i](const absl::Status& s, const RequestResult& r) {
        run.status[i] = s;
        run.tokens[i] = r.token_ids;
      };
      core_->Add(std::move(*p));
    }
    for (int guard = 0; core_->HasWork() && guard < 20000; ++guard) core_->Step(MonotonicNow());
    EXPECT_FALSE(core_->HasWork());
    EXPECT_TRUE(core_->health().ok()) << core_->health();
    run.preemptions = core_->stats().preemptions;
    run.chained = runner_ptr->chained();
    return run;
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelIdentity identity_;
  std::unique_ptr<EngineCore> core_;
  TableRecorder recorder_;
};

// Requests decode across several block boundaries in every mode: the tables equal their rebuild
// after every step, each decode step changes one entry, lazy tables carry the documents' deltas
// and block tables none (their K is rotated at the global position already).
TEST_F(EngineBlockTableTest, TablesGrowAppendOnlyInEveryMode) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock, CacheMode::kPrefix,
                         CacheMode::kFull}) {
    SCOPED_TRACE(CacheModeName(mode));
    std::vector<EngineRequest> reqs = {Request({0, 1}, mode, 40), Request({1, 2}, mode, 23),
                                       Request({2, 0, 1}, mode, 35)};
    const Run run = Drive(reqs, 256, 48, false, 0);
    for (const absl::Status& s : run.status) EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(run.tokens[0].size(), 40u);
    const TableRecorder& rec = recorder_;
    EXPECT_EQ(rec.sequences(), 3);  // one per request: nothing reset them
    EXPECT_GE(rec.decodes(), 39 + 22 + 34 - 3);
    // Whole tables only for each request's first chunk.
    EXPECT_EQ(rec.whole_tables(), 3);
    EXPECT_EQ(rec.any_delta(), mode == CacheMode::kLazy);
  }
}

// Preempted requests restart under new sequence ids (their blocks went back to the pool), and
// their recomputed tables equal the rebuild; the answers equal those of unhurried runs.
TEST_F(EngineBlockTableTest, PreemptionStartsANewSequence) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock, CacheMode::kPrefix}) {
    SCOPED_TRACE(CacheModeName(mode));
    std::vector<EngineRequest> reqs;
    for (int i = 0; i < 8; ++i) reqs.push_back(Request({i % 5, (i + 2) % 5}, mode, 40));
    const Run tight = Drive(reqs, 40, 32, false, 0);
    EXPECT_GT(tight.preemptions, 0);
    EXPECT_GT(recorder_.sequences(), 8);
    const Run roomy = Drive(reqs, 512, 32);
    EXPECT_EQ(roomy.preemptions, 0);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_TRUE(tight.status[i].ok()) << tight.status[i];
      EXPECT_EQ(tight.tokens[i], roomy.tokens[i]) << "request " << i;
    }
  }
}

// Pipelined decode extends a table before the step ahead of it is read, and some chained launches
// fail (the backend then holds an older version and must take the whole table); the contract and
// the rebuild hold throughout, and the answers are the step-by-step ones.
TEST_F(EngineBlockTableTest, PipelinedStepsAndFailedLaunchesKeepTheContract) {
  for (CacheMode mode : {CacheMode::kLazy, CacheMode::kBlock}) {
    SCOPED_TRACE(CacheModeName(mode));
    std::vector<EngineRequest> reqs = {Request({0, 1}, mode, 37), Request({2}, mode, 30),
                                       Request({1, 3}, mode, 45)};
    const Run plain = Drive(reqs, 256, 256);
    const Run piped = Drive(reqs, 256, 256, /*pipeline=*/true, /*fail_every=*/4);
    EXPECT_GT(piped.chained, 10);
    EXPECT_GT(recorder_.whole_tables(), 3) << "no failed launch made a backend resync";
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_TRUE(piped.status[i].ok()) << piped.status[i];
      EXPECT_EQ(piped.tokens[i], plain.tokens[i]) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace lazyattn
