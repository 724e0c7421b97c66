// The persistent decode tables' host planner (decode_table_store.h), with a CPU twin of the gather
// kernel standing in for the device: whatever the sequences do (grow, start, end, skip steps,
// appear twice, fail to launch), every gathered row equals the chunk's whole table, while a
// decode step uploads only the entries that changed.
#include "services/worker/cuda/decode_table_store.h"

#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "services/worker/engine/engine_core_block_table.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

// decode_table_gather.cu on the host.
struct TwinDevice {
  std::vector<KvBlockEntry> store;
  std::vector<KvBlockEntry> Gather(const std::vector<DecodeTableRow>& rows,
                                   const std::vector<KvBlockEntry>& patch, int64_t capacity,
                                   int width) {
    std::vector<KvBlockEntry> dense(rows.size() * width, 0);
    for (size_t d = 0; d < rows.size(); ++d) {
      const DecodeTableRow& r = rows[d];
      for (int i = 0; i < r.n; ++i) {
        KvBlockEntry e;
        if (i >= r.from) {
          e = patch.at(r.patch + i - r.from);
          if (r.slot >= 0) store.at(r.slot * capacity + i) = e;
        } else {
          EXPECT_GE(r.slot, 0);
          e = store.at(r.slot * capacity + i);
        }
        dense[d * width + i] = e;
      }
    }
    return dense;
  }
};

ModelConfig Config() {
  ModelConfig c = TinyTestConfig();
  c.max_positions = 1 << 20;
  return c;
}

// A decode sequence as the engine keeps it: a lazy-mode table (two segments with their deltas)
// growing one token per step.
struct Sequence {
  SequenceBlockTable table;
  std::vector<BlockId> blocks;
  int64_t tokens = 0;
  ForwardChunk chunk;
  int32_t token = 1;
  int64_t slot = 0;
  SequenceBlockTable::Snapshot Step() {
    ++tokens;
    // Three blocks for the document, then the query's.
    const int64_t query_blocks = std::max<int64_t>(0, tokens - 40 + 15) / kDefaultKvBlockSize;
    while (static_cast<int64_t>(blocks.size()) < 3 + query_blocks) {
      blocks.push_back(static_cast<BlockId>(blocks.size() * 7 % 1000));
    }
    const int64_t first = std::min<int64_t>(tokens, 40);  // a 40-token document, then the query
    table.Cover(0, std::span(blocks).subspan(0, 3), first, 0);
    if (tokens > 40) {
      table.Cover(1, std::span(blocks).subspan(3), tokens - 40, 40);
    }
    auto snap = table.Take();
    chunk.tokens = std::span(&token, 1);
    slot = int64_t{blocks.back()} * kDefaultKvBlockSize;
    chunk.kv_slots = std::span(&slot, 1);
    chunk.block_table = snap.entries;
    chunk.first_query_index = tokens - 1;
    chunk.table_sequence = snap.sequence;
    chunk.table_version = snap.version;
    chunk.table_unchanged = snap.unchanged;
    chunk.emit_logits = false;
    return snap;
  }
};

TEST(DecodeTableStoreTest, GatheredTablesEqualTheChunksWhileOnlyChangesAreUploaded) {
  const ModelConfig config = Config();
  std::mt19937 rng(5);
  DecodeTableStore store;
  TwinDevice device;
  std::map<uint64_t, Sequence> live;
  uint64_t next_sequence = 1;
  int64_t uploaded = 0, decode_rows = 0, whole = 0;
  for (int step = 0; step < 400; ++step) {
    // Sequences start and end; some sit a step out (their next version skips none, but the
    // store may evict them).
    if (live.size() < 12 && rng() % 3 == 0) {
      Sequence& s = live[next_sequence];
      s.table.Reset(next_sequence++);
      s.tokens = static_cast<int64_t>(rng() % 200);  // prefilled elsewhere
    }
    if (!live.empty() && rng() % 10 == 0) live.erase(std::next(live.begin(), rng() % live.size()));
    std::vector<ForwardChunk> chunks;
    for (auto& [id, s] : live) {
      if (rng() % 8 == 0) continue;
      s.Step();
      chunks.push_back(s.chunk);
    }
    if (chunks.empty()) continue;
    std::vector<DecodeTableStore::Checked> checked;
    std::vector<uint64_t> sequences;
    int64_t max_entries = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto c = store.Check(chunks[i], i, config, 1000);
      ASSERT_TRUE(c.ok()) << c.status();
      int64_t keys = 0;
      for (KvBlockEntry e : chunks[i].block_table) keys += KvEntryValid(e);
      EXPECT_EQ(c->summary.keys, keys);
      EXPECT_EQ(c->summary.delta_entries > 0, chunks[i].first_query_index >= 40);
      checked.push_back(*c);
      sequences.push_back(chunks[i].table_sequence);
      max_entries = std::max<int64_t>(max_entries, chunks[i].block_table.size());
    }
    if (store.BeginStep(static_cast<int>(chunks.size()), max_entries, sequences)) {
      device.store.assign(store.store_entries(), 0xdeadbeef);  // reallocated: old contents gone
    }
    std::vector<DecodeTableRow> rows;
    std::vector<KvBlockEntry> patch;
    for (size_t i = 0; i < chunks.size(); ++i) {
      store.PlanRow(chunks[i], checked[i].from, &rows, &patch);
    }
    if (rng() % 25 == 0) {  // the launch fails before the device saw it
      store.ForgetAll();
      continue;
    }
    const int width = static_cast<int>(max_entries);
    const std::vector<KvBlockEntry> dense = device.Gather(rows, patch, store.capacity(), width);
    for (size_t d = 0; d < chunks.size(); ++d) {
      const auto& t = chunks[d].block_table;
      ASSERT_TRUE(std::equal(t.begin(), t.end(), dense.begin() + d * width))
          << "step " << step << " row " << d;
      if (rows[d].from == 0) ++whole;
    }
    uploaded += static_cast<int64_t>(patch.size());
    decode_rows += static_cast<int64_t>(chunks.size());
  }
  // Mostly one entry a row: the whole table only for new, evicted or resynchronized sequences.
  EXPECT_GT(decode_rows, 1000);
  EXPECT_GT(whole, 20);
  EXPECT_LT(whole * 5, decode_rows);
  EXPECT_LT(uploaded, decode_rows * 4);
}

TEST(DecodeTableStoreTest, SkippedVersionsDuplicatesAndEvictionUploadWholeTables) {
  const ModelConfig config = Config();
  DecodeTableStore store;
  Sequence a;
  a.table.Reset(1);
  a.tokens = 100;
  auto plan = [&](std::vector<ForwardChunk> chunks) {
    std::vector<DecodeTableRow> rows;
    std::vector<KvBlockEntry> patch;
    std::vector<uint64_t> seqs;
    std::vector<int64_t> from;
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto c = store.Check(chunks[i], i, config, 1000);
      EXPECT_TRUE(c.ok()) << c.status();
      from.push_back(c->from);
      seqs.push_back(chunks[i].table_sequence);
    }
    store.BeginStep(static_cast<int>(chunks.size()), 64, seqs);
    for (size_t i = 0; i < chunks.size(); ++i) store.PlanRow(chunks[i], from[i], &rows, &patch);
    return rows;
  };
  a.Step();
  EXPECT_EQ(plan({a.chunk})[0].from, 0);  // first sight: whole
  a.Step();
  auto rows = plan({a.chunk});
  EXPECT_EQ(rows[0].from, rows[0].n - 1);  // one new entry
  a.Step();  // a version the store never sees (a prefill chunk elsewhere, a failed launch)
  a.Step();
  EXPECT_EQ(plan({a.chunk})[0].from, 0);
  a.Step();
  ForwardChunk twice = a.chunk;
  rows = plan({a.chunk, twice});
  EXPECT_GE(rows[0].slot, 0);
  EXPECT_EQ(rows[1].slot, -1) << "a sequence twice in a step shares its slot";
  EXPECT_EQ(rows[1].from, 0);
  a.Step();
  EXPECT_EQ(plan({a.chunk})[0].from, 0) << "the slot of a duplicated sequence was kept";
  // A table that says more is unchanged than the store holds is taken whole.
  a.Step();
  a.chunk.table_unchanged = static_cast<int64_t>(a.chunk.block_table.size()) + 5;
  EXPECT_EQ(plan({a.chunk})[0].from, 0);
  // Checks still read the new entries: a bad one is refused, naming the chunk.
  a.Step();
  std::vector<KvBlockEntry> bad(a.chunk.block_table.begin(), a.chunk.block_table.end());
  bad.back() = PackKvBlockEntry(5000, 40, KvEntryValid(bad.back()));
  a.chunk.block_table = bad;
  auto refused = store.Check(a.chunk, 3, config, 1000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("forward chunk 3"), std::string::npos);
}

// More sequences than slots: a new one takes the least recently used slot of a sequence that is
// not in the step; that sequence uploads its whole table when it comes back, the others do not.
TEST(DecodeTableStoreTest, NewSequencesEvictTheLeastRecentlyUsed) {
  const ModelConfig config = Config();
  DecodeTableStore store;
  std::vector<Sequence> seqs(70);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].table.Reset(100 + i);
    seqs[i].tokens = 100;  // several entries: an incremental row keeps all but the last
  }
  auto step = [&](size_t begin, size_t end) {
    std::vector<ForwardChunk> chunks;
    std::vector<uint64_t> ids;
    for (size_t i = begin; i < end; ++i) {
      seqs[i].Step();
      chunks.push_back(seqs[i].chunk);
      ids.push_back(seqs[i].chunk.table_sequence);
    }
    std::vector<int64_t> from;
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto c = store.Check(chunks[i], i, config, 1000);
      EXPECT_TRUE(c.ok()) << c.status();
      from.push_back(c->from);
    }
    store.BeginStep(static_cast<int>(chunks.size()), 64, ids);
    std::vector<DecodeTableRow> rows;
    std::vector<KvBlockEntry> patch;
    for (size_t i = 0; i < chunks.size(); ++i) store.PlanRow(chunks[i], from[i], &rows, &patch);
    return rows;
  };
  step(0, 64);
  EXPECT_EQ(store.slots(), 64);
  step(0, 64);  // sequences 0..63 hold the 64 slots, all used in this step
  auto rows = step(64, 70);  // 6 new sequences take the slots of 6 of them
  for (const DecodeTableRow& r : rows) EXPECT_GE(r.slot, 0);
  rows = step(0, 64);
  int whole = 0;
  for (const DecodeTableRow& r : rows) whole += r.from == 0;
  EXPECT_EQ(whole, 6);
  EXPECT_EQ(store.slots(), 64);
}

}  // namespace
}  // namespace lazyattn
