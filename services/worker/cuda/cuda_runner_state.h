// The CUDA runner's state behind CudaModelRunner::State (cuda_model_runner.h keeps CUDA types out
// of its header): device buffers, workspaces, the stream, the host slots of launched steps, the
// decode graphs and the step profile. Internal to the runner's sources, one part each:
//   cuda_model_runner.cc   creation, weight packing, GEMM warm-up, block copies, collection
//   cuda_step_launch.cc    one step's host assembly, buffer growth, launches and copies back
//   cuda_step_layers.cc    one step's layer launches, embedding to sampled ids
//   cuda_decode_graphs.cc  decode-only steps captured and replayed as CUDA graphs
//   cuda_step_profile.cc   where a step's time goes (CudaModelRunner::StepProfile)
#ifndef LAZYATTN_SERVICES_WORKER_CUDA_CUDA_RUNNER_STATE_H_
#define LAZYATTN_SERVICES_WORKER_CUDA_CUDA_RUNNER_STATE_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/skinny_wgmma_linear.h"
#include "services/worker/cuda/cuda_model_runner.h"
#include "services/worker/cuda/decode_table_store.h"

namespace lazyattn {
namespace cuda_runner_internal {

using bf16 = __nv_bfloat16;

// A device (or pinned host) allocation that only grows. Growing drops the old contents, so the
// caller grows only between steps, after the stream is idle.
class Buffer {
 public:
  explicit Buffer(bool pinned_host = false) : pinned_host_(pinned_host) {}
  ~Buffer() { Release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Bumped by every (re)allocation of any buffer: what was captured with older pointers is stale.
  static int64_t generation() { return generation_.load(std::memory_order_relaxed); }

  // Test seam: the `n`th allocation from now (1: the next) fails as a cudaMalloc out of memory
  // does; 0 turns it off. Process-wide, as generation() is.
  static void FailAllocationForTest(int64_t n) {
    fail_countdown_.store(n, std::memory_order_relaxed);
  }

  absl::Status Reserve(int64_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    generation_.fetch_add(1, std::memory_order_relaxed);
    Release();
    bytes = std::max<int64_t>(bytes, 4096);
    const bool injected = fail_countdown_.load(std::memory_order_relaxed) > 0 &&
                          fail_countdown_.fetch_sub(1, std::memory_order_relaxed) == 1;
    const cudaError_t e = injected       ? cudaErrorMemoryAllocation
                          : pinned_host_ ? cudaMallocHost(&ptr_, bytes)
                                         : cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes >> 20, " MiB of ",
                                                       pinned_host_ ? "pinned host" : "GPU",
                                                       " memory for a forward step"));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  int64_t bytes() const { return bytes_; }
  template <typename T>
  T* as(int64_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }

 private:
  void Release() {
    if (ptr_ != nullptr) pinned_host_ ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  static inline std::atomic<int64_t> generation_{0};  // shared by every runner's thread
  static inline std::atomic<int64_t> fail_countdown_{0};
  bool pinned_host_;
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// A decode-only step's shape: everything its launches depend on besides buffer contents.
struct GraphKey {
  int batch = 0;
  int table_width = 0;  // blocks per row of the decode tables (bucketed)
  bool rotate = false;
  int sampler = 0;  // 0: no row emits, 1: the greedy argmax, 2: SampleRowsCuda
  // Rows that sample: usually `batch`, fewer when a one-token chunk that emits nothing (the last
  // token of a document's encoding) passes for a decode row. The LM head's and the samplers' row
  // counts, and the offsets of the metadata sections after the logit rows, depend on it.
  int out_rows = 0;
  auto operator<=>(const GraphKey&) const = default;
};

// One section of a step's metadata: host bytes copied into the pinned upload at `offset`.
struct StepSection {
  const void* src;
  int64_t bytes;
  int64_t offset = 0;
};

// What a step's layer launches (State::EnqueueLayers) take from Launch besides the runner's
// settings and the buffers: the step's shape and where its metadata sections lie.
struct StepShape {
  int64_t rows = 0;      // query rows, decode rows first
  int64_t out_rows = 0;  // rows that sample
  int num_decode = 0, num_prefill = 0;
  int max_decode_blocks = 0;  // width of the dense decode tables
  bool any_delta = false;     // some table carries a RoPE delta: the kernels rotate
  bool decode_only = false;
  bool argmax_only = true;  // every sampling row is greedy
  const PagedPrefillPlan* plan = nullptr;
  std::span<const StepSection> sections;  // Launch's list, in its order
};

}  // namespace cuda_runner_internal

struct CudaModelRunner::State {
  using Buffer = cuda_runner_internal::Buffer;
  using GraphKey = cuda_runner_internal::GraphKey;
  using bf16 = cuda_runner_internal::bf16;

  cudaStream_t stream = nullptr;
  // Brings return_logits rows back to the host while the next step runs (HostSlot).
  cudaStream_t copy_stream = nullptr;
  int sm_count = 0;
  std::unique_ptr<DeviceRopeTable> rope;
  std::unique_ptr<CublasLtGemm> gemm;
  std::unique_ptr<PagedDecodeWorkspace> decode_workspace;
  std::unique_ptr<SkinnyWgmmaWorkspace> wgmma_workspace;  // with options.wgmma_max_rows
  // With options.wgmma_packed_weights: each layer's matrices in PackWeightsForWgmma's layout
  // (null where the kernel cannot take them packed), all in one allocation.
  struct PackedLayer {
    const bf16 *wqkv = nullptr, *wo = nullptr, *w_gate_up = nullptr, *w_down = nullptr;
  };
  std::vector<PackedLayer> packed;
  Buffer packed_weights;
  int64_t packed_bytes = 0;
  Buffer k_pool, v_pool;  // [layer][block][kv_head][16][head_dim]
  int64_t layer_stride = 0;  // elements
  // Per-step buffers, grown on demand.
  int64_t row_capacity = 0, logit_row_capacity = 0;
  // Activations [rows][...]. The residual stream x and the output projections' products (delta,
  // added into x by the next norm) are fp32; the rest bf16.
  Buffer x, delta, h, qkv, q_rot, attn, gate_up, act;
  // Sampling rows: normalized (bf16) and their fp32 logits [rows][vocab].
  Buffer last_hidden, logits;
  Buffer sampled;  // packed argmax keys [logit rows] (all-greedy steps)
  Buffer ids, logprobs;  // SampleRowsCuda's results [logit rows]
  Buffer metadata;
  // Decode tables kept between steps (decode_table_store.h): the host plan, the device store
  // [slots][capacity] and the dense [rows][width] table the decode kernel reads.
  DecodeTableStore tables;
  Buffer table_store, decode_tables;
  // The host side of a launched step, two of them: a step may be enqueued (Launch) while the
  // one before it still runs, so the two may share neither the pinned metadata being uploaded
  // nor the pinned buffers the results come back to.
  struct HostSlot {
    Buffer metadata{/*pinned_host=*/true};
    Buffer logits{/*pinned_host=*/true};   // return_logits rows, packed in row order
    // The same rows on the device: copied there on the step's stream (a device copy, ~10 us for
    // 32 rows of 128K), then brought back on `copy_stream`, so the next step's kernels do not
    // wait for a copy over PCIe (~0.4 ms for those 16 MB).
    Buffer staged_logits;
    cudaEvent_t rows_staged = nullptr;     // on the step's stream, after the device copy
    cudaEvent_t logits_copied = nullptr;   // on copy_stream, after the copy back
    // The step has rows coming back on copy_stream: Collect waits for them, and so does the
    // next Launch on this slot where a failed Collect did not.
    bool logits_pending = false;
    Buffer sampled{/*pinned_host=*/true};  // packed argmax keys (all-greedy steps)
    Buffer ids{/*pinned_host=*/true};      // drawn ids (other steps)
    Buffer logprobs{/*pinned_host=*/true};
    cudaEvent_t copied = nullptr;          // after the step's copies back to the host
    cudaEvent_t start = nullptr, end = nullptr;  // while profiling
    bool profiled = false;
    std::vector<bool> row_logits;  // per emitting row: its logits come back
    bool argmax_only = false;      // the ids are in `sampled` (packed keys)
    bool any_logprob = false;
    std::chrono::steady_clock::time_point entered;
    double prep_ms = 0, enqueue_ms = 0;
  };
  HostSlot slots[2];
  std::deque<int> in_flight;  // launched, uncollected slots, oldest first
  // Rows of the last launch when each chunk had one emitting row, else -1: what a launch with
  // previous_step_rows may follow; and where its ids are (packed keys or drawn ids).
  int64_t last_greedy_rows = -1;
  bool last_argmax_only = false;
  Buffer host_copy_list{/*pinned_host=*/true};  // CopyBlocks' list
  Buffer prefill_workspace;
  // Decode graphs. A shape runs eagerly the first time (cuBLASLt picks its algorithms, kernels
  // set their attributes), is captured the second time and replayed from then on.
  using StepProfile = CudaModelRunner::StepProfile;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    int seen = 0;
  };
  std::map<GraphKey, Graph> graphs;
  int64_t graph_launches = 0, graph_captures = 0, fused_qkv_rope_launches = 0;
  int64_t residual_in_product_steps = 0;
  int64_t chained_launches = 0;
  bool profiling = false;
  StepProfile profile;
  std::optional<std::chrono::steady_clock::time_point> last_return;  // while profiling

  // Drops every decode graph (they hold the pointers of the buffers they were captured with).
  void ClearGraphs();
  // Runs `enqueue` for a decode-only step of shape `key`: eagerly the first time, captured into
  // a graph and launched the second, replayed from then on (cuda_decode_graphs.cc).
  absl::Status RunGraph(const GraphKey& key, const std::function<absl::Status()>& enqueue);
  // Enqueues the step's layers, from the embedding to the sampled ids, on `stream` with
  // `runner`'s settings (cuda_step_layers.cc); the part a decode graph captures. A member of
  // the state rather than of the runner so the runner's public header stays as it is.
  absl::Status EnqueueLayers(const CudaModelRunner& runner,
                             const cuda_runner_internal::StepShape& step);
  // Adds a collected step's times to `profile` (while profiling; cuda_step_profile.cc).
  void RecordStepProfile(const HostSlot& slot);

  ~State();
};

}  // namespace lazyattn

#endif  // LAZYATTN_SERVICES_WORKER_CUDA_CUDA_RUNNER_STATE_H_
