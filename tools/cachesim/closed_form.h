// The position-multiplicity argument of DESIGN.md section 1, checked against the simulator.
//
// Model: every reference is one document drawn from Zipf(a) and placed at one of D positions,
// uniformly. A position-agnostic cache (lazy) of C entries can hold the C most popular documents;
// a position-aware one (block) needs an entry per (document, position), so it holds C/D documents
// at all D positions. With a static top-C cache the hit ratios are sums of Zipf probabilities and
//   gain = sum_{i<=C} i^-a / sum_{i<=C/D} i^-a   (2.87x at D=20, C=100, a=0.85).
// Our caches are LRU, not static; Che's approximation gives LRU's hit ratio under independent
// references, so the check prints the static formula, the LRU prediction and the simulation.
//
// The simulated trace realizes position s (0 <= s < D) with a system prompt of s*L tokens, all
// prefixes of one shared prompt (D-1 radix-tree blocks, budgeted on top of the C entries), followed
// by one document of L = block_size tokens (one block): the cache then holds exactly C documents.
#ifndef LAZYATTN_TOOLS_CACHESIM_CLOSED_FORM_H_
#define LAZYATTN_TOOLS_CACHESIM_CLOSED_FORM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/cachesim/trace.h"

namespace lazyattn {

// sum_{i=1..n} i^-a.
double ZipfHeadSum(int64_t n, double a);
// The static formula: ZipfHeadSum(c, a) / ZipfHeadSum(c / d, a).
double StaticPositionGain(int64_t c, int64_t d, double a);
// Che's approximation of an LRU cache of `capacity` entries when document i (probability p[i])
// is stored as `copies` entries of equal probability p[i]/copies.
double CheLruHitRatio(const std::vector<double>& p, int copies, double capacity);

struct PositionCheckOptions {
  int64_t num_documents = 10000;
  int64_t capacity = 100;  // C: cached documents
  int positions = 20;      // D
  double zipf_a = 0.85;
  int64_t num_requests = 200000;
  int64_t warmup_requests = 20000;
  int block_size = 16;
  uint64_t seed = 1;
};

struct PositionCheckResult {
  int64_t num_blocks = 0;                    // pool size given to the simulator: C + D - 1
  double static_lazy = 0, static_block = 0;  // top-C and top-C/D Zipf mass (finite pool)
  double che_lazy = 0, che_block = 0;        // LRU prediction
  double sim_lazy = 0, sim_block = 0;        // simulated, document-token hit ratio
  double static_gain() const { return static_lazy / static_block; }
  double che_gain() const { return che_lazy / che_block; }
  double sim_gain() const { return sim_lazy / sim_block; }
};

// The one-document-per-request trace described above.
absl::StatusOr<Trace> PositionTrace(const PositionCheckOptions& options);
absl::StatusOr<PositionCheckResult> RunPositionCheck(const PositionCheckOptions& options);

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CACHESIM_CLOSED_FORM_H_
