#include "tools/cachesim/trace.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace lazyattn {
namespace {

TEST(ZipfSamplerTest, RankFrequenciesMatchTheory) {
  for (double a : {0.0, 1.1, 2.1}) {
    const ZipfSampler zipf(1000, a);
    SimRng rng(7);
    const int kDraws = 200000;
    std::vector<int> count(1000);
    for (int i = 0; i < kDraws; ++i) ++count[zipf.Sample(rng)];
    double h = 0;
    for (int r = 1; r <= 1000; ++r) h += std::pow(r, -a);
    for (int rank : {0, 1, 9}) {
      const double p = std::pow(rank + 1, -a) / h;
      EXPECT_NEAR(zipf.Probability(rank), p, 1e-12);
      const double sigma = std::sqrt(p * (1 - p) / kDraws);
      EXPECT_NEAR(count[rank] / static_cast<double>(kDraws), p, 5 * sigma)
          << "a=" << a << " rank " << rank;
    }
  }
}

TraceOptions Small() {
  TraceOptions o;
  o.num_documents = 2000;
  o.doc_tokens_min = 100;
  o.doc_tokens_max = 700;
  o.docs_per_request = 5;
  o.num_requests = 4000;
  o.zipf_a = 1.1;
  return o;
}

TEST(TraceTest, SameOptionsSameTraceOtherSeedOtherTrace) {
  auto a = GenerateTrace(Small()), b = GenerateTrace(Small());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->doc_tokens, b->doc_tokens);
  ASSERT_EQ(a->requests.size(), b->requests.size());
  for (size_t i = 0; i < a->requests.size(); ++i)
    EXPECT_EQ(a->requests[i].docs, b->requests[i].docs);
  EXPECT_EQ(a->DocumentTokens(3), b->DocumentTokens(3));
  EXPECT_EQ(a->QuestionTokens(3), b->QuestionTokens(3));
  TraceOptions other = Small();
  other.seed = 2;
  auto c = GenerateTrace(other);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->requests[0].docs, c->requests[0].docs);
  EXPECT_NE(a->DocumentTokens(3), c->DocumentTokens(3));
}

TEST(TraceTest, RequestsHoldDistinctShuffledDocumentsAndUniqueQuestions) {
  auto t = GenerateTrace(Small());
  ASSERT_TRUE(t.ok());
  std::vector<int> top_at(5, 0);  // where the most popular document lands in the prompt
  for (const TraceRequest& r : t->requests) {
    ASSERT_EQ(r.docs.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      for (size_t j = i + 1; j < 5; ++j) EXPECT_NE(r.docs[i], r.docs[j]);
      if (r.docs[i] == 0) ++top_at[i];
    }
    EXPECT_EQ(r.system_tokens, 64);
    EXPECT_EQ(r.question_tokens, 64);
  }
  int total = 0;
  for (int n : top_at) total += n;
  for (int n : top_at) EXPECT_NEAR(n, total / 5.0, 0.25 * total / 5.0) << "order not shuffled";
  for (int64_t len : t->doc_tokens) {
    EXPECT_GE(len, 100);
    EXPECT_LE(len, 700);
  }
  EXPECT_NE(t->QuestionTokens(0), t->QuestionTokens(1));
  EXPECT_EQ(t->SystemTokens(64), t->SystemTokens(64));
}

TEST(TraceTest, OneDocumentPerRequestFollowsZipf) {
  TraceOptions o = Small();
  o.docs_per_request = 1;
  o.num_requests = 100000;
  auto t = GenerateTrace(o);
  ASSERT_TRUE(t.ok());
  int top = 0;
  for (const TraceRequest& r : t->requests) top += r.docs[0] == 0 ? 1 : 0;
  const double p = ZipfSampler(o.num_documents, o.zipf_a).Probability(0);
  EXPECT_NEAR(top / 100000.0, p, 5 * std::sqrt(p * (1 - p) / 100000));
  const TraceSummary s = Summarize(*t);
  EXPECT_EQ(s.doc_refs, 100000);
  EXPECT_GT(s.UnlimitedHitRatio(), 0.5);
}

TEST(TraceTest, BadOptionsNameTheFlag) {
  TraceOptions o = Small();
  o.docs_per_request = 3000;
  EXPECT_NE(GenerateTrace(o).status().message().find("--docs-per-request"), std::string::npos);
  o = Small();
  o.doc_tokens_min = 800;
  EXPECT_NE(GenerateTrace(o).status().message().find("--doc-tokens"), std::string::npos);
  o = Small();
  o.zipf_a = -1;
  EXPECT_EQ(GenerateTrace(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Small();
  o.num_documents = 10;
  o.docs_per_request = 10;
  o.zipf_a = 8;  // drawing all 10 distinct documents at this skew takes ~10^8 draws
  EXPECT_EQ(GenerateTrace(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazyattn
