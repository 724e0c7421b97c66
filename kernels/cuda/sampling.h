// Token sampling on the GPU: every row of a step, greedy and sampled mixed, one draw per row,
// with the rules of kernels/include/sampling.h (penalties, temperature, top-k, top-p, min-p,
// Philox-seeded Gumbel-max draw with rejection for top-p and min-p). Only the chosen ids (and,
// on request, their log-probabilities) are written; nothing is sorted.
//
// One thread-block cluster per row (up to 8 CTAs, Hopper's distributed shared memory): each CTA
// loads its slice of the row into shared memory once, and every later pass (max, the top-k
// radix select, each rejection round's draw and mass check) reads shared memory; partial
// results meet through the cluster's shared memory in a fixed order, so a row's result does not
// depend on scheduling or on the other rows of the batch.
#ifndef LAZYATTN_KERNELS_CUDA_SAMPLING_H_
#define LAZYATTN_KERNELS_CUDA_SAMPLING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/include/sampling.h"

namespace lazyattn {

struct SampleRowsArgs {
  const float* logits = nullptr;  // device [rows][row_stride] fp32; the first `vocab` are used
  int64_t row_stride = 0;
  int rows = 0;
  int vocab = 0;
  const SamplingRowParams* params = nullptr;  // device [rows]
  const PenaltyEntry* penalties = nullptr;    // device, indexed by the rows' penalty ranges
  // Device [rows] (with kCountInputToken rows): each row's input token; may be null otherwise.
  // input_token_rows (device [rows], optional) indirects it: row r's token is
  // input_tokens[input_token_rows[r]].
  const int32_t* input_tokens = nullptr;
  const int32_t* input_token_rows = nullptr;
  int32_t* out_ids = nullptr;      // device [rows]
  float* out_logprobs = nullptr;   // device [rows], written for kSampleLogprob rows; may be null
};

// InvalidArgument for shapes out of range (vocabularies past 409,600 ids do not fit 8 CTAs'
// shared memory) or null pointers; Internal for a launch failure.
absl::Status SampleRowsCuda(const SampleRowsArgs& args, cudaStream_t stream);

// CTAs per row (the cluster size) SampleRowsCuda uses for `vocab`.
int SamplingClusterSize(int vocab);

// Whether SampleRowsCuda takes a vocabulary of `vocab` ids (1 to 409,600: its slices of a row
// fit 8 CTAs' shared memory). A runner checks it once, at its start, since every sampled step of
// a model past it would fail.
bool SampleRowsCudaSupports(int64_t vocab);

// ids[i] = out_ids[source_rows[i]] into tokens[i], on the device (pipelined decode: a sampled
// step's ids become the next step's input tokens without a trip through the host).
absl::Status SampledIdsToTokensCuda(const int32_t* ids, const int32_t* source_rows, int rows,
                                    int32_t* tokens, cudaStream_t stream);

// Greedy rows only, spread over the whole card: the same argmax as SampleRowsCuda's greedy rule
// (the lowest id among equal maxima, NaN lowest), found by many CTAs per row instead of one (one
// CTA reads a 128K vocabulary in ~24 us; the GPU's decode step has no time for that). Each CTA
// folds its slice into packed[row] with a 64-bit atomicMax of (order key << 32 | ~id), so the
// result does not depend on the order CTAs finish in. packed: device [rows], cleared by this
// call (a memset on the stream); the id is GreedyIdFromPacked(packed[row]).
absl::Status GreedyArgmaxCuda(const float* logits, int64_t row_stride, int rows, int vocab,
                              uint64_t* packed, cudaStream_t stream);

inline int32_t GreedyIdFromPacked(uint64_t packed) {
  return static_cast<int32_t>(~static_cast<uint32_t>(packed));
}

// tokens[i] = GreedyIdFromPacked(packed[source_rows[i]]) for i < rows, on the device: a step's
// greedy ids become the next step's input tokens without a trip through the host (pipelined
// decode). source_rows: device [rows], each a valid row of `packed`.
absl::Status GreedyIdsToTokensCuda(const uint64_t* packed, const int32_t* source_rows, int rows,
                                   int32_t* tokens, cudaStream_t stream);

}  // namespace lazyattn

#endif  // LAZYATTN_KERNELS_CUDA_SAMPLING_H_
