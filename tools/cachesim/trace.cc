#include "tools/cachesim/trace.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace lazyattn {
namespace {

// Token id ranges, disjoint so that a system block can never equal a document or question block.
constexpr int32_t kSystemBase = 1;
constexpr int32_t kDocumentBase = 1 << 20;
constexpr int32_t kQuestionBase = 1 << 30;
constexpr uint64_t kDocumentRange = kQuestionBase - kDocumentBase;
constexpr uint64_t kQuestionRange = (uint64_t{1} << 31) - 1 - kQuestionBase;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Hash3(uint64_t a, uint64_t b, uint64_t c) { return Mix(Mix(Mix(a) ^ b) ^ c); }

absl::Status Invalid(const std::string& flag, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

}  // namespace

uint64_t SimRng::Next() {
  state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double SimRng::Uniform01() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int64_t SimRng::Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

ZipfSampler::ZipfSampler(int64_t n, double a) : cdf_(n) {
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) {
    sum += std::pow(static_cast<double>(r + 1), -a);
    cdf_[r] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;
}

int64_t ZipfSampler::Sample(SimRng& rng) const {
  const double u = rng.Uniform01();
  return std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
}

double ZipfSampler::Probability(int64_t rank) const {
  return rank == 0 ? cdf_[0] : cdf_[rank] - cdf_[rank - 1];
}

std::vector<int32_t> Trace::SystemTokens(int64_t n) const {
  std::vector<int32_t> t(n);
  for (int64_t j = 0; j < n; ++j) {
    t[j] = kSystemBase + static_cast<int32_t>(Hash3(seed, 0x5157, j) % (kDocumentBase - 1));
  }
  return t;
}

std::vector<int32_t> Trace::DocumentTokens(int64_t doc) const {
  std::vector<int32_t> t(doc_tokens[doc]);
  for (size_t j = 0; j < t.size(); ++j) {
    t[j] = kDocumentBase + static_cast<int32_t>(Hash3(seed, doc, j) % kDocumentRange);
  }
  return t;
}

std::vector<int32_t> Trace::QuestionTokens(int64_t request) const {
  // Hashed into their own id range: a question block equal to any other block would need 16
  // colliding 30-bit draws, so questions are unique in every practical sense.
  std::vector<int32_t> t(requests[request].question_tokens);
  for (size_t j = 0; j < t.size(); ++j) {
    t[j] = kQuestionBase + static_cast<int32_t>(Hash3(seed ^ 0x9e57, request, j) % kQuestionRange);
  }
  return t;
}

absl::StatusOr<Trace> GenerateTrace(const TraceOptions& o) {
  if (o.num_documents < 1) return Invalid("documents", "must be at least 1");
  if (o.doc_tokens_min < 1) return Invalid("doc-tokens-min", "must be at least 1");
  if (o.doc_tokens_max < o.doc_tokens_min) {
    return Invalid("doc-tokens",
                   absl::StrCat(o.doc_tokens_max, " is below --doc-tokens-min ", o.doc_tokens_min));
  }
  if (o.docs_per_request < 1 || o.docs_per_request > o.num_documents) {
    return Invalid("docs-per-request",
                   absl::StrCat("must be in [1, --documents = ", o.num_documents, "]"));
  }
  if (o.num_requests < 1) return Invalid("requests", "must be at least 1");
  if (!(o.zipf_a >= 0) || !std::isfinite(o.zipf_a)) return Invalid("skew", "must be >= 0");
  if (o.system_tokens < 0) return Invalid("system-tokens", "must be >= 0");
  if (o.question_tokens < 0) return Invalid("question-tokens", "must be >= 0");

  Trace trace;
  trace.seed = o.seed;
  SimRng rng(Hash3(o.seed, 0x7ace, 0));
  trace.doc_tokens.resize(o.num_documents);
  for (int64_t& len : trace.doc_tokens) {
    len = o.doc_tokens_min + rng.Below(o.doc_tokens_max - o.doc_tokens_min + 1);
  }
  const ZipfSampler zipf(o.num_documents, o.zipf_a);
  // Distinct documents per request by rejection. With a steep skew and k close to the pool size
  // rejection could take very long; bound it and say so.
  const int64_t max_draws = 10000 + 1000 * static_cast<int64_t>(o.docs_per_request);
  trace.requests.resize(o.num_requests);
  for (TraceRequest& r : trace.requests) {
    r.system_tokens = o.system_tokens;
    r.question_tokens = o.question_tokens;
    int64_t draws = 0;
    while (static_cast<int>(r.docs.size()) < o.docs_per_request) {
      if (++draws > max_draws) {
        return Invalid(
            "docs-per-request",
            absl::StrCat("could not draw ", o.docs_per_request, " distinct documents in ",
                         max_draws, " draws at skew ", o.zipf_a,
                         "; use fewer documents per request or a larger pool"));
      }
      const int64_t d = zipf.Sample(rng);
      if (std::find(r.docs.begin(), r.docs.end(), d) == r.docs.end()) r.docs.push_back(d);
    }
    // Later draws are biased towards less popular documents (popular ones get rejected as
    // duplicates), so the draw order must not become the prompt order.
    for (int i = static_cast<int>(r.docs.size()) - 1; i > 0; --i) {
      std::swap(r.docs[i], r.docs[rng.Below(i + 1)]);
    }
  }
  return trace;
}

TraceSummary Summarize(const Trace& trace) {
  TraceSummary s;
  absl::flat_hash_set<int64_t> seen;
  for (const TraceRequest& r : trace.requests) {
    for (int64_t d : r.docs) {
      ++s.doc_refs;
      s.doc_tokens += trace.doc_tokens[d];
      if (seen.insert(d).second) {
        ++s.distinct_docs;
        s.distinct_doc_tokens += trace.doc_tokens[d];
      }
    }
  }
  return s;
}

}  // namespace lazyattn
