// Synthetic RAG request traces for the cache simulator.
//
// A trace is a pool of documents (id -> length in tokens) and a sequence of requests
// `[system][doc_1 .. doc_k][question]`. Document popularity is Zipf with exponent `a` over the pool
// (a = 0 is uniform; id 0 is the most popular), each request holds k distinct documents in a random
// order, every request shares the same system prompt and has a question of unique tokens. Token
// contents are deterministic functions of the seed and the ids, so a trace is fully described by
// its options and two runs with the same options are identical on every platform.
#ifndef LAZYATTN_TOOLS_CACHESIM_TRACE_H_
#define LAZYATTN_TOOLS_CACHESIM_TRACE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyattn {

// SplitMix64: small, fast and identical everywhere (std:: distributions are not).
class SimRng {
 public:
  explicit SimRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  double Uniform01();        // [0, 1), 53 random bits
  int64_t Below(int64_t n);  // [0, n), n > 0
 private:
  uint64_t state_;
};

// Draws ranks 0..n-1 with P(rank r) proportional to (r+1)^-a.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double a);
  int64_t Sample(SimRng& rng) const;
  double Probability(int64_t rank) const;
  int64_t size() const { return static_cast<int64_t>(cdf_.size()); }

 private:
  std::vector<double> cdf_;  // cdf_[r] = P(rank <= r); cdf_.back() == 1
};

struct TraceOptions {
  int64_t num_documents = 100000;
  int64_t doc_tokens_min = 512;  // each document's length is uniform in [min, max], fixed per doc
  int64_t doc_tokens_max = 512;
  int docs_per_request = 5;
  int64_t num_requests = 10000;
  double zipf_a = 1.5;
  int64_t system_tokens = 64;
  int64_t question_tokens = 64;
  uint64_t seed = 1;
};

struct TraceRequest {
  int64_t system_tokens = 0;  // length of the prefix of the shared system prompt this request uses
  std::vector<int64_t> docs;  // document ids, in prompt order
  int64_t question_tokens = 0;
};

struct Trace {
  uint64_t seed = 0;
  std::vector<int64_t> doc_tokens;  // length of each document id
  std::vector<TraceRequest> requests;

  // Token contents. System and document tokens repeat across requests; question tokens of
  // request i never occur anywhere else.
  std::vector<int32_t> SystemTokens(int64_t n) const;
  std::vector<int32_t> DocumentTokens(int64_t doc) const;
  std::vector<int32_t> QuestionTokens(int64_t request) const;
};

// InvalidArgument naming the offending option (as its command-line flag) when options are bad.
absl::StatusOr<Trace> GenerateTrace(const TraceOptions& options);

struct TraceSummary {
  int64_t doc_refs = 0;    // document occurrences over all requests
  int64_t doc_tokens = 0;  // their tokens
  int64_t distinct_docs = 0;
  int64_t distinct_doc_tokens = 0;
  // Hit ratio of a position-agnostic cache of unlimited size: every reference but the first.
  double UnlimitedHitRatio() const {
    return doc_tokens == 0 ? 0.0 : 1.0 - static_cast<double>(distinct_doc_tokens) / doc_tokens;
  }
};
TraceSummary Summarize(const Trace& trace);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CACHESIM_TRACE_H_
