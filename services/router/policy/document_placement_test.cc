#include "services/router/policy/document_placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "services/router/policy/worker_selector.h"

namespace lazyattn::router {
namespace {

using ::testing::ElementsAre;

TEST(PlaceDocumentsTest, OffsetsArePrefixPlusEarlierDocuments) {
  const std::vector<int64_t> tokens = {96, 10, 7};
  EXPECT_THAT(PlaceDocuments(1, tokens), ElementsAre(1, 97, 107));
  EXPECT_THAT(PlaceDocuments(0, tokens), ElementsAre(0, 96, 106));
}

TEST(PlaceDocumentsTest, UnknownPrefixOrEstimatedDocumentLeavesTheRestUnplaced) {
  EXPECT_THAT(PlaceDocuments(std::nullopt, std::vector<int64_t>{96, 10}),
              ElementsAre(kUnplaced, kUnplaced));
  EXPECT_THAT(PlaceDocuments(-3, std::vector<int64_t>{96}), ElementsAre(kUnplaced));
  // A text document (-1: only estimated) is placed itself; the documents after it are not.
  EXPECT_THAT(PlaceDocuments(5, std::vector<int64_t>{10, -1, 20, 30}),
              ElementsAre(5, 15, kUnplaced, kUnplaced));
  // A sum past int64 cannot place the next one (hostile counts never overflow).
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(PlaceDocuments(5, std::vector<int64_t>{max, 1}), ElementsAre(5, kUnplaced));
}

TEST(PrefixLengthsTest, LearnsReplacesAndStaysBounded) {
  PrefixLengths lengths(/*capacity=*/2);
  EXPECT_EQ(lengths.Get(1), std::nullopt);
  lengths.Record(1, 12);
  lengths.Record(1, 13);  // the latest answer wins
  lengths.Record(2, -1);  // ignored
  EXPECT_EQ(lengths.Get(1), 13);
  EXPECT_EQ(lengths.Get(2), std::nullopt);
  lengths.Record(2, 0);
  EXPECT_EQ(lengths.Get(2), 0);
  EXPECT_EQ(lengths.size(), 2u);
  lengths.Record(3, 4);  // full: cleared, then recorded
  EXPECT_EQ(lengths.size(), 1u);
  EXPECT_EQ(lengths.Get(3), 4);
  EXPECT_EQ(lengths.Get(1), std::nullopt);
}

TEST(PlaceBlockDocumentsTest, RefsTakeTheOffsetOfTheirFirstOccurrence) {
  // Request documents: A (96 tokens), B (text), A again, C; refs are distinct: A, B, C.
  std::vector<DocumentRef> refs(3);
  refs[0].document_index = 0;
  refs[1].document_index = 1;
  refs[2].document_index = 3;
  PlaceBlockDocuments(refs, /*prefix=*/7, 1, std::vector<int64_t>{96, -1, 96, 50});
  EXPECT_TRUE(refs[0].positional && refs[1].positional && refs[2].positional);
  EXPECT_EQ(refs[0].prefix, 7u);
  EXPECT_EQ(refs[0].offset, 1);
  EXPECT_EQ(refs[0].relative_offset, 0);
  EXPECT_EQ(refs[1].offset, 97);
  EXPECT_EQ(refs[1].relative_offset, 96);
  EXPECT_EQ(refs[2].offset, kUnplaced);  // after the text document
  EXPECT_EQ(refs[2].relative_offset, kUnplaced);
  // The prefix's length not learned yet: no global offset, but the relative one is known.
  PlaceBlockDocuments(refs, 7, std::nullopt, std::vector<int64_t>{96, -1, 96, 50});
  EXPECT_EQ(refs[1].offset, kUnplaced);
  EXPECT_EQ(refs[1].relative_offset, 96);
  refs[0].document_index = 9;  // out of range
  PlaceBlockDocuments(refs, 7, 1, std::vector<int64_t>{96});
  EXPECT_EQ(refs[0].offset, kUnplaced);
  EXPECT_EQ(refs[0].relative_offset, kUnplaced);
}

TEST(SpeculativeKeyTest, LazyByDocumentBlockByDocumentAndOffset) {
  DocumentRef lazy;
  lazy.key = DocumentKey{1, 2};
  EXPECT_EQ(SpeculativeKey(lazy), lazy.key);
  DocumentRef at0 = lazy, at37 = lazy, unplaced = lazy;
  at0.positional = at37.positional = unplaced.positional = true;
  at0.relative_offset = 0;
  at37.relative_offset = 37;
  DocumentRef other_prefix = at37;
  other_prefix.prefix = 5;
  EXPECT_EQ(SpeculativeKey(unplaced), std::nullopt);
  ASSERT_TRUE(SpeculativeKey(at0).has_value() && SpeculativeKey(at37).has_value());
  EXPECT_NE(*SpeculativeKey(at0), *SpeculativeKey(at37));
  EXPECT_NE(*SpeculativeKey(at37), *SpeculativeKey(other_prefix));
  EXPECT_NE(*SpeculativeKey(at0), lazy.key);
  EXPECT_EQ(SpeculativeKey(at37), SpeculativeKey(at37));
}

}  // namespace
}  // namespace lazyattn::router
