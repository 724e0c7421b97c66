#include "tools/cachesim/closed_form.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tools/cachesim/replay.h"

namespace lazyattn {

double ZipfHeadSum(int64_t n, double a) {
  double s = 0;
  for (int64_t i = n; i >= 1; --i) s += std::pow(static_cast<double>(i), -a);  // small terms first
  return s;
}

double StaticPositionGain(int64_t c, int64_t d, double a) {
  return ZipfHeadSum(c, a) / ZipfHeadSum(c / d, a);
}

double CheLruHitRatio(const std::vector<double>& p, int copies, double capacity) {
  // Characteristic time T: sum over entries of P(referenced within T) = capacity.
  auto occupancy = [&](double t) {
    double s = 0;
    for (double pi : p) s += copies * -std::expm1(-pi / copies * t);
    return s;
  };
  if (capacity >= static_cast<double>(p.size()) * copies) return 1.0;
  double lo = 0, hi = 1;
  while (occupancy(hi) < capacity) hi *= 2;
  for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (occupancy(mid) < capacity ? lo : hi) = mid;
  }
  const double t = 0.5 * (lo + hi);
  double hit = 0;
  for (double pi : p) hit += pi * -std::expm1(-pi / copies * t);
  return hit;
}

absl::StatusOr<Trace> PositionTrace(const PositionCheckOptions& o) {
  if (o.positions < 1) return absl::InvalidArgumentError("--positions must be >= 1");
  if (o.capacity < o.positions) {
    return absl::InvalidArgumentError(
        absl::StrCat("--capacity ", o.capacity, " must be at least --positions ", o.positions,
                     " (a position-aware cache must hold one document at every position)"));
  }
  if (o.num_documents < o.capacity) {
    return absl::InvalidArgumentError("--documents must be at least --capacity");
  }
  if (o.num_requests <= o.warmup_requests) {
    return absl::InvalidArgumentError("--requests must exceed --warmup");
  }
  if (!(o.zipf_a >= 0) || !std::isfinite(o.zipf_a)) {
    return absl::InvalidArgumentError("--skews: must be >= 0");
  }
  Trace trace;
  trace.seed = o.seed;
  trace.doc_tokens.assign(o.num_documents, o.block_size);
  SimRng rng(o.seed * 0x2545f4914f6cdd1dull + 7);
  const ZipfSampler zipf(o.num_documents, o.zipf_a);
  trace.requests.resize(o.num_requests);
  for (TraceRequest& r : trace.requests) {
    r.system_tokens = rng.Below(o.positions) * o.block_size;
    r.docs = {zipf.Sample(rng)};
    r.question_tokens = 0;
  }
  return trace;
}

absl::StatusOr<PositionCheckResult> RunPositionCheck(const PositionCheckOptions& o) {
  ASSIGN_OR_RETURN(const Trace trace, PositionTrace(o));
  PositionCheckResult res;
  res.num_blocks = o.capacity + o.positions - 1;
  const ZipfSampler zipf(o.num_documents, o.zipf_a);
  std::vector<double> p(o.num_documents);
  for (int64_t i = 0; i < o.num_documents; ++i) p[i] = zipf.Probability(i);
  for (int64_t i = 0; i < o.capacity; ++i) res.static_lazy += p[i];
  for (int64_t i = 0; i < o.capacity / o.positions; ++i) res.static_block += p[i];
  res.che_lazy = CheLruHitRatio(p, 1, static_cast<double>(o.capacity));
  res.che_block = CheLruHitRatio(p, o.positions, static_cast<double>(o.capacity));
  ReplayOptions ro{.num_blocks = res.num_blocks,
                   .block_size = o.block_size,
                   .warmup_requests = o.warmup_requests};
  ro.mode = CacheMode::kLazy;
  ASSIGN_OR_RETURN(const ReplayStats lazy, Replay(trace, ro));
  ro.mode = CacheMode::kBlock;
  ASSIGN_OR_RETURN(const ReplayStats block, Replay(trace, ro));
  res.sim_lazy = lazy.HitRatio();
  res.sim_block = block.HitRatio();
  return res;
}

}  // namespace lazyattn
