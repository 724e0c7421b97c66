#include "services/worker/cuda/cuda_model_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/block_copy_rerotate.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope_kv_append.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_linear.h"
#include "kernels/cuda/swiglu.h"
#include "services/worker/cuda/decode_table_gather.h"
#include "services/worker/cuda/decode_table_store.h"
#include "services/worker/engine/sampler.h"

namespace lazyattn {
namespace {

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

  absl::Status Reserve(int64_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    generation_.fetch_add(1, std::memory_order_relaxed);
    Release();
    bytes = std::max<int64_t>(bytes, 4096);
    const cudaError_t e =
        pinned_host_ ? cudaMallocHost(&ptr_, bytes) : cudaMalloc(&ptr_, bytes);
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
  auto operator<=>(const GraphKey&) const = default;
};

int64_t Align16(int64_t n) { return (n + 15) / 16 * 16; }

constexpr int kGraphBlockBucket = 64;  // table width granularity of decode graphs (1,024 tokens)
constexpr size_t kMaxGraphs = 512;

// A one-token chunk whose query sees every key of its table (`keys` valid slots): the decode
// kernel's case.
bool IsDecodeChunk(const ForwardChunk& ch, int64_t keys) {
  return ch.tokens.size() == 1 && !ch.block_table.empty() && ch.first_query_index == keys - 1;
}

}  // namespace

struct CudaModelRunner::State {
  cudaStream_t stream = nullptr;
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
  int64_t chained_launches = 0;
  bool profiling = false;
  StepProfile profile;
  std::optional<std::chrono::steady_clock::time_point> last_return;  // while profiling

  void ClearGraphs() {
    for (auto& [key, g] : graphs) {
      if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
    }
    graphs.clear();
  }

  absl::Status RunGraph(const GraphKey& key, const std::function<absl::Status()>& enqueue) {
    if (graphs.size() >= kMaxGraphs && !graphs.contains(key)) ClearGraphs();
    Graph& g = graphs[key];
    if (g.exec == nullptr && ++g.seen < 2) return enqueue();
    if (g.exec == nullptr) {
      cudaGraph_t graph = nullptr;
      RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const absl::Status captured = enqueue();
      const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
      if (!captured.ok()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        return captured;
      }
      RETURN_IF_CUDA_ERROR(ended);
      const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
      cudaGraphDestroy(graph);
      RETURN_IF_CUDA_ERROR(made);
      ++graph_captures;
    }
    ++graph_launches;
    RETURN_IF_CUDA_ERROR(cudaGraphLaunch(g.exec, stream));
    return absl::OkStatus();
  }

  ~State() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      ClearGraphs();
      cudaStreamDestroy(stream);
    }
    for (HostSlot& slot : slots) {
      for (cudaEvent_t e : {slot.copied, slot.start, slot.end}) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  }
};

int64_t CudaKvBytesPerBlock(const ModelConfig& c) {
  return int64_t{2} * c.num_layers * c.kv_size() * kDefaultKvBlockSize *
         static_cast<int64_t>(sizeof(bf16));
}

CudaModelRunner::~CudaModelRunner() = default;

void CudaModelRunner::set_profiling(bool on) {
  State& s = *state_;
  for (State::HostSlot& slot : s.slots) {
    if (on && slot.start == nullptr) {
      cudaEventCreate(&slot.start);
      cudaEventCreate(&slot.end);
    }
  }
  s.profiling = on && s.slots[0].start != nullptr && s.slots[1].start != nullptr;
  s.profile = {};
  s.last_return.reset();
}

CudaModelRunner::StepProfile CudaModelRunner::profile() const { return state_->profile; }

int64_t CudaModelRunner::graph_launches() const { return state_->graph_launches; }
int64_t CudaModelRunner::graph_captures() const { return state_->graph_captures; }
int64_t CudaModelRunner::fused_qkv_rope_launches() const {
  return state_->fused_qkv_rope_launches;
}
int64_t CudaModelRunner::packed_weight_bytes() const { return state_->packed_bytes; }
int64_t CudaModelRunner::chained_launches() const { return state_->chained_launches; }

int64_t CudaModelRunner::kv_pool_bytes() const {
  return num_kv_blocks_ * CudaKvBytesPerBlock(config());
}

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    std::unique_ptr<CudaModelWeights> weights, const CudaRunnerOptions& options) {
  if (weights == nullptr) return absl::InvalidArgumentError("cuda runner: no weights");
  const ModelConfig& c = weights->config();
  if (c.head_dim != 64 && c.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend supports head_dim 64 and 128; model ", c.name, " has ", c.head_dim));
  }
  ASSIGN_OR_RETURN(const DeviceInfo info, QueryDevice(options.device));
  RETURN_IF_CUDA_ERROR(cudaSetDevice(options.device));
  auto r = std::unique_ptr<CudaModelRunner>(new CudaModelRunner());
  r->weights_ = std::move(weights);
  r->device_ = options.device;
  r->use_graphs_ = options.cuda_graphs;
  r->fused_norms_ = options.fused_norms && options.skinny_gemms;
  r->wgmma_max_rows_ = std::clamp(options.wgmma_max_rows, 0, 64);
  r->wgmma_cuts_ = options.wgmma_cuts;
  for (const auto& [name, cut] : {std::pair{"qkv", options.wgmma_cuts.qkv},
                                  std::pair{"o", options.wgmma_cuts.o},
                                  std::pair{"gate_up", options.wgmma_cuts.gate_up},
                                  std::pair{"down", options.wgmma_cuts.down}}) {
    const bool tile_ok = std::string_view(name) == "gate_up"
                             ? cut.tile_features == 0 || cut.tile_features == 128
                             : cut.tile_features == 0 || cut.tile_features == 64 ||
                                   cut.tile_features == 128 || cut.tile_features == 256;
    if (!tile_ok || cut.splits < 0 || cut.splits > 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wgmma_cuts.", name, ": tile_features ", cut.tile_features, " / splits ", cut.splits,
          " (tile_features 0, 64, 128 or 256, gate_up 0 or 128; splits 0 to 8)"));
    }
  }
  r->fused_qkv_rope_ = options.fused_qkv_rope;
  r->early_kv_loads_ = options.early_decode_kv_loads;
  // The wgmma kernel's code is sm_90a only.
  const bool hopper = info.compute_major == 9 && info.compute_minor == 0;
  r->prefill_kernel_ = hopper ? options.prefill_kernel : PrefillKernel::kMmaSync;
  r->num_kv_blocks_ = options.num_kv_blocks > 0
                          ? options.num_kv_blocks
                          : options.kv_budget_bytes / CudaKvBytesPerBlock(c);
  if (r->num_kv_blocks_ < 1 || r->num_kv_blocks_ > (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV budget of ", options.kv_budget_bytes, " bytes holds ", r->num_kv_blocks_,
        " blocks (one block of ", c.name, " takes ", CudaKvBytesPerBlock(c), " bytes)"));
  }
  r->state_ = std::make_unique<State>();
  State& s = *r->state_;
  s.sm_count = info.sm_count;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  for (State::HostSlot& slot : s.slots) {
    RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  }
  ASSIGN_OR_RETURN(s.rope, DeviceRopeTable::Create(RopeTable(c.rope, c.max_positions)));
  ASSIGN_OR_RETURN(s.gemm, CublasLtGemm::Create());
  s.gemm->set_skinny(options.skinny_gemms);
  s.gemm->set_autotune(options.autotune_gemms);
  ASSIGN_OR_RETURN(s.decode_workspace, PagedDecodeWorkspace::Create(options.device));
  if (r->wgmma_max_rows_ >= 2) {
    s.wgmma_workspace = std::make_unique<SkinnyWgmmaWorkspace>();
    RETURN_IF_ERROR(s.wgmma_workspace->Init());
  }
  s.layer_stride = r->num_kv_blocks_ * c.kv_size() * kDefaultKvBlockSize;
  const int64_t pool_bytes = s.layer_stride * c.num_layers * static_cast<int64_t>(sizeof(bf16));
  RETURN_IF_ERROR(s.k_pool.Reserve(pool_bytes));
  RETURN_IF_ERROR(s.v_pool.Reserve(pool_bytes));
  // Unwritten slots are never read (tables count only valid ones), but zeros keep a bad table
  // from feeding NaN garbage into a softmax.
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(s.k_pool.as<void>(), 0, pool_bytes, s.stream));
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(s.v_pool.as<void>(), 0, pool_bytes, s.stream));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s.stream));
  if (options.wgmma_packed_weights && r->wgmma_max_rows_ >= 2 &&
      SkinnyWgmmaLinearSupports(1, 64, 1, nullptr, nullptr, nullptr)) {
    RETURN_IF_ERROR(r->PackWeights());
  }
  if (options.warm_up_gemms) RETURN_IF_ERROR(r->WarmUpGemms());
  return r;
}

absl::Status CudaModelRunner::PackWeights() {
  State& s = *state_;
  const ModelConfig& c = config();
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t qkv = c.q_size() + 2 * c.kv_size();
  // (out, in) of wqkv, wo, w_gate_up, w_down; packed gate/up rows must start at 64-row groups.
  const int64_t shapes[4][2] = {{qkv, H}, {H, c.q_size()}, {2 * I, H}, {H, I}};
  const bool pack[4] = {true, true, I % 64 == 0, true};
  int64_t per_layer = 0;
  for (int m = 0; m < 4; ++m) {
    if (pack[m]) per_layer += PackedWeightsElements(shapes[m][0], shapes[m][1]);
  }
  const int64_t bytes = per_layer * c.num_layers * static_cast<int64_t>(sizeof(bf16));
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  // A speed-up only: never worth taking the memory the steps themselves need.
  if (bytes + kPackedWeightsHeadroomBytes > static_cast<int64_t>(free_bytes)) {
    return absl::OkStatus();
  }
  s.packed_bytes = bytes;
  RETURN_IF_ERROR(s.packed_weights.Reserve(s.packed_bytes));
  bf16* next = s.packed_weights.as<bf16>();
  s.packed.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    const CudaLayerWeights& L = weights_->layer(l);
    const bf16* sources[4] = {L.wqkv, L.wo, L.w_gate_up, L.w_down};
    const bf16** targets[4] = {&s.packed[l].wqkv, &s.packed[l].wo, &s.packed[l].w_gate_up,
                               &s.packed[l].w_down};
    for (int m = 0; m < 4; ++m) {
      if (!pack[m]) continue;
      RETURN_IF_ERROR(PackWeightsForWgmma(sources[m], shapes[m][0], shapes[m][1], next, s.stream));
      *targets[m] = next;
      next += PackedWeightsElements(shapes[m][0], shapes[m][1]);
    }
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s.stream));
  return absl::OkStatus();
}

// cuBLASLt's autotuning (one timing per power-of-two row bucket and shape, gemm.h) runs inside
// the first step that meets a new bucket, stalling that step by tens of milliseconds; a decode
// batch that grows by one request would pay it in the middle of serving. So every bucket up to
// kWarmRows (LM head: up to kWarmLogitRows) is tuned here, on scratch buffers and layer 0's
// weights, with the step's own output types.
absl::Status CudaModelRunner::WarmUpGemms() {
  constexpr int64_t kWarmRows = 1024, kWarmLogitRows = 256;
  const ModelConfig& c = config();
  State& s = *state_;
  const int64_t H = c.hidden_size, Q = c.q_size(), I = c.intermediate_size;
  const int64_t qkv_width = Q + 2 * c.kv_size();
  Buffer in, out;
  RETURN_IF_ERROR(in.Reserve(kWarmRows * std::max({H, Q, I}) * int64_t{sizeof(bf16)}));
  RETURN_IF_ERROR(out.Reserve(std::max(kWarmRows * std::max({qkv_width, 2 * I, H}),
                                       kWarmLogitRows * c.vocab_size) *
                              int64_t{sizeof(float)}));
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(
      in.as<void>(), 0, kWarmRows * std::max({H, Q, I}) * int64_t{sizeof(bf16)}, s.stream));
  const CudaLayerWeights& L = weights_->layer(0);
  const bf16* x = in.as<bf16>();
  CublasLtGemm& g = *s.gemm;
  for (int64_t rows = 1; rows <= kWarmRows; rows *= 2) {
    RETURN_IF_ERROR(g.Linear(x, L.wqkv, rows, H, qkv_width, out.as<void>(), GemmOutputType::kBf16,
                             false, s.stream));
    RETURN_IF_ERROR(
        g.Linear(x, L.wo, rows, Q, H, out.as<void>(), GemmOutputType::kFp32, false, s.stream));
    RETURN_IF_ERROR(g.Linear(x, L.w_gate_up, rows, H, 2 * I, out.as<void>(),
                             GemmOutputType::kBf16, false, s.stream));
    RETURN_IF_ERROR(
        g.Linear(x, L.w_down, rows, I, H, out.as<void>(), GemmOutputType::kFp32, false, s.stream));
    if (rows <= kWarmLogitRows) {
      RETURN_IF_ERROR(g.Linear(x, weights_->lm_head(), rows, H, c.vocab_size, out.as<void>(),
                               GemmOutputType::kFp32, false, s.stream));
    }
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s.stream));
  return absl::OkStatus();
}

absl::Status CudaModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) {
    if (c.src >= num_kv_blocks_ || c.dst >= num_kv_blocks_ || c.src == c.dst) {
      return absl::InvalidArgumentError("block copy names a block out of range or onto itself");
    }
    if (std::abs(int64_t{c.delta}) >= config().max_positions) {
      return absl::InvalidArgumentError("block copy delta past the model's context");
    }
  }
  if (copies.empty()) return absl::OkStatus();
  State& s = *state_;
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  const int64_t bytes = static_cast<int64_t>(copies.size_bytes());
  if (!s.in_flight.empty()) {
    return absl::FailedPreconditionError("block copy while a launched step is uncollected");
  }
  RETURN_IF_ERROR(s.host_copy_list.Reserve(bytes));
  RETURN_IF_ERROR(s.metadata.Reserve(bytes));
  std::memcpy(s.host_copy_list.as<void>(), copies.data(), bytes);
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.metadata.as<void>(), s.host_copy_list.as<void>(), bytes,
                                       cudaMemcpyHostToDevice, s.stream));
  const ModelConfig& c = config();
  RETURN_IF_ERROR(BlockCopyRerotate({.copies = s.metadata.as<BlockCopy>(),
                                     .num_copies = static_cast<int>(copies.size()),
                                     .num_layers = c.num_layers,
                                     .layer_stride = s.layer_stride,
                                     .num_kv_heads = c.num_kv_heads,
                                     .head_dim = c.head_dim,
                                     .rope = s.rope->view(),
                                     .k_pool = s.k_pool.as<bf16>(),
                                     .v_pool = s.v_pool.as<bf16>()},
                                    s.stream));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s.stream));
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> CudaModelRunner::Forward(std::span<const ForwardChunk> chunks) {
  if (!state_->in_flight.empty()) {
    return absl::FailedPreconditionError("Forward while a launched step is uncollected");
  }
  if (chunks.empty()) return ForwardOutput{};
  RETURN_IF_ERROR(Launch(chunks, /*previous_step_rows=*/{}));
  return Collect();
}

absl::Status CudaModelRunner::Launch(std::span<const ForwardChunk> chunks,
                                     std::span<const int32_t> previous_step_rows) {
  const auto entered = std::chrono::steady_clock::now();
  const ModelConfig& c = config();
  State& s = *state_;
  // Each table is checked over the entries the device does not hold yet: O(new entries).
  std::vector<DecodeTableStore::Checked> checked(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSIGN_OR_RETURN(checked[i], s.tables.Check(chunks[i], i, c, num_kv_blocks_));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].k_rotation_base > chunks[i].segment_delta) {
      return absl::InvalidArgumentError(
          absl::StrCat("forward chunk ", i, ": k_rotation_base past the segment's offset"));
    }
  }
  if (chunks.empty()) return absl::InvalidArgumentError("a launched step needs chunks");
  if (s.in_flight.size() >= 2) {
    return absl::FailedPreconditionError("two launched steps are already uncollected");
  }
  const bool chained = !previous_step_rows.empty();
  const int64_t previous_greedy_rows = s.last_greedy_rows;
  const bool previous_argmax_only = s.last_argmax_only;
  // Only a launch that succeeds says what the next one may take its tokens from.
  s.last_greedy_rows = -1;
  if (chained) {
    bool valid = previous_step_rows.size() == chunks.size() && previous_greedy_rows > 0;
    for (size_t i = 0; valid && i < chunks.size(); ++i) {
      valid = chunks[i].tokens.size() == 1 && previous_step_rows[i] >= 0 &&
              previous_step_rows[i] < previous_greedy_rows;
    }
    if (!valid) {
      return absl::FailedPreconditionError(absl::StrCat(
          "previous_step_rows: ", previous_step_rows.size(), " rows for ", chunks.size(),
          " chunks of one token each, each below the emitting rows of the step before (",
          previous_greedy_rows, ")"));
    }
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  // The slot the uncollected step (if any) does not use.
  const int slot_index = s.in_flight.empty() ? 0 : 1 - s.in_flight.back();
  State::HostSlot& slot = s.slots[slot_index];

  // --- Host: the step's metadata, rows in device order (decode chunks first). ---
  std::vector<size_t> order;
  std::vector<bool> is_decode(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    is_decode[i] = IsDecodeChunk(chunks[i], checked[i].summary.keys);
    if (is_decode[i]) order.push_back(i);
  }
  const int num_decode = static_cast<int>(order.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!is_decode[i]) order.push_back(i);
  }
  int64_t rows = 0;
  for (const ForwardChunk& ch : chunks) rows += static_cast<int64_t>(ch.tokens.size());
  std::vector<int32_t> tokens, local, deltas;
  std::vector<int64_t> slots;
  std::vector<int64_t> chunk_row(chunks.size());
  tokens.reserve(rows);
  local.reserve(rows);
  deltas.reserve(rows);
  slots.reserve(rows);
  bool any_delta = false;
  int max_decode_blocks = 0;
  for (size_t i : order) {
    const ForwardChunk& ch = chunks[i];
    chunk_row[i] = static_cast<int64_t>(tokens.size());
    for (size_t t = 0; t < ch.tokens.size(); ++t) {
      tokens.push_back(ch.tokens[t]);
      // K at k_rotation_base + local, Q at segment_delta + local (RopeKvAppend's convention).
      local.push_back(static_cast<int32_t>(ch.k_rotation_base + ch.local_start + t));
      deltas.push_back(static_cast<int32_t>(ch.segment_delta - ch.k_rotation_base));
      slots.push_back(ch.kv_slots[t]);
    }
    any_delta |= checked[i].summary.delta_entries > 0;
  }
  for (int d = 0; d < num_decode; ++d) {
    max_decode_blocks =
        std::max(max_decode_blocks, static_cast<int>(chunks[order[d]].block_table.size()));
  }
  // Decode-only steps replay a CUDA graph per (batch, table width, ...): the table width is
  // rounded up so one graph serves kGraphBlockBucket blocks of growth (rows are zero-padded and
  // the kernel stops at each sequence's own block count).
  const bool decode_only = num_decode == static_cast<int>(chunks.size());
  if (decode_only && use_graphs_) {
    max_decode_blocks = (max_decode_blocks + kGraphBlockBucket - 1) / kGraphBlockBucket *
                        kGraphBlockBucket;
  }
  // Only what the device does not hold of each decode table goes up (decode_table_store.h); the
  // gather kernel assembles the [num_decode][max_decode_blocks] table on the device.
  DecodeTableStore::LaunchGuard table_guard(s.tables);
  std::vector<const ForwardChunk*> decode_chunks;
  std::vector<int64_t> decode_from;
  for (int d = 0; d < num_decode; ++d) {
    decode_chunks.push_back(&chunks[order[d]]);
    decode_from.push_back(checked[order[d]].from);
  }
  const DecodeTableStore::StepPlan tables = s.tables.PlanStep(decode_chunks, decode_from);
  // Emitting rows, chunk order: their device rows, sampling parameters (penalty histories
  // appended to one entry list) and whether their logits come back.
  std::vector<int32_t> logit_rows;
  std::vector<bool> row_logits;
  std::vector<SamplingRowParams> row_params;
  std::vector<PenaltyEntry> penalties;
  bool argmax_only = true, any_logprob = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ForwardChunk& ch = chunks[i];
    if (!ch.emit_logits) continue;
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    SamplingRowParams p = ch.sampling;
    p.penalty_begin = p.penalty_count = 0;
    if (HasPenalties(p)) {
      const std::vector<PenaltyEntry> e = PenaltyEntries(ch.penalty_tokens, ch.penalty_prompt_tokens);
      p.penalty_begin = static_cast<int32_t>(penalties.size());
      p.penalty_count = static_cast<int32_t>(e.size());
      penalties.insert(penalties.end(), e.begin(), e.end());
      if (chained) p.flags |= kCountInputToken;
    }
    argmax_only &= (!(p.temperature > 0) || p.top_k == 1) && !HasPenalties(p) &&
                   !(p.flags & kSampleLogprob);
    any_logprob |= (p.flags & kSampleLogprob) != 0;
    for (int64_t t = ch.logits_for_all_tokens ? 0 : n - 1; t < n; ++t) {
      logit_rows.push_back(static_cast<int32_t>(chunk_row[i] + t));
      row_logits.push_back(ch.return_logits);
      row_params.push_back(p);
    }
  }
  const int64_t out_rows = static_cast<int64_t>(logit_rows.size());
  const int64_t logits_rows = std::count(row_logits.begin(), row_logits.end(), true);

  PagedPrefillPlan plan;
  const int num_prefill = static_cast<int>(chunks.size()) - num_decode;
  if (num_prefill > 0) {
    std::vector<PagedPrefillSequence> seqs;
    for (size_t k = num_decode; k < order.size(); ++k) {
      const ForwardChunk& ch = chunks[order[k]];
      seqs.push_back({.num_queries = static_cast<int>(ch.tokens.size()),
                      .first_query_index = ch.first_query_index,
                      .block_table = ch.block_table.data(),
                      .num_blocks = static_cast<int>(ch.block_table.size())});
    }
    RETURN_IF_ERROR(plan.Build({.num_heads = c.num_heads,
                                .num_kv_heads = c.num_kv_heads,
                                .head_dim = c.head_dim,
                                .num_pool_blocks = num_kv_blocks_},
                               seqs.data(), num_prefill,
                               {.sm_count = s.sm_count,
                                .rope_max_positions = c.max_positions,
                                .ctas_per_sm = PrefillCtasPerSm(
                                    prefill_kernel_, c.head_dim,
                                    any_delta ? PrefillRotation::kRotateQ
                                              : PrefillRotation::kNone)}));
  }

  // Where each row's input token comes from in the step before (pipelined decode), device order.
  // (Always `rows` long, so the sections after it keep their offsets in a replayed graph.)
  std::vector<int32_t> token_source_rows(rows, 0);
  if (chained) {
    for (size_t k = 0; k < order.size(); ++k) token_source_rows[k] = previous_step_rows[order[k]];
  }

  // One metadata buffer, one upload.
  struct Section {
    const void* src;
    int64_t bytes;
    int64_t offset = 0;
  };
  Section sec[] = {{tokens.data(), rows * 4},
                   {local.data(), rows * 4},
                   {deltas.data(), rows * 4},
                   {slots.data(), rows * 8},
                   {logit_rows.data(), out_rows * 4},
                   {tables.rows.data(),
                    static_cast<int64_t>(tables.rows.size() * sizeof(DecodeTableRow))},
                   {tables.num_blocks.data(), int64_t{num_decode} * 4},
                   {plan.metadata(), num_prefill > 0 ? plan.metadata_bytes() : 0},
                   {token_source_rows.data(), static_cast<int64_t>(token_source_rows.size()) * 4},
                   {row_params.data(), out_rows * static_cast<int64_t>(sizeof(SamplingRowParams))},
                   {penalties.data(),
                    static_cast<int64_t>(penalties.size() * sizeof(PenaltyEntry))},
                   // Last: its size changes from step to step, and a replayed graph needs the
                   // sections it reads at the offsets it was captured with.
                   {tables.patch.data(),
                    static_cast<int64_t>(tables.patch.size() * sizeof(KvBlockEntry))}};
  int64_t meta_bytes = 0;
  for (Section& x : sec) {
    x.offset = meta_bytes;
    meta_bytes += Align16(x.bytes);
  }

  // --- Buffers (grown only while no launched step can still use them: see `grows`). ---
  const int64_t H = c.hidden_size, Q = c.q_size(), KV = c.kv_size(), I = c.intermediate_size;
  const int64_t V = c.vocab_size, qkv_width = Q + 2 * KV;
  const int64_t generation_before = Buffer::generation();
  const int64_t dense_table_bytes = int64_t{num_decode} * max_decode_blocks * 8;
  const bool grows = rows > s.row_capacity || out_rows > s.logit_row_capacity ||
                     meta_bytes > s.metadata.bytes() || tables.store_grew ||
                     dense_table_bytes > s.decode_tables.bytes() ||
                     (num_prefill > 0 && plan.workspace_bytes() > s.prefill_workspace.bytes());
  if (grows && !s.in_flight.empty()) RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s.stream));
  if (rows > s.row_capacity) {
    const int64_t cap = std::max<int64_t>(rows, 256);
    for (auto [buf, width] : {std::pair{&s.h, H}, {&s.qkv, qkv_width}, {&s.q_rot, Q},
                              {&s.attn, Q}, {&s.gate_up, 2 * I}, {&s.act, I}}) {
      RETURN_IF_ERROR(buf->Reserve(cap * width * static_cast<int64_t>(sizeof(bf16))));
    }
    RETURN_IF_ERROR(s.x.Reserve(cap * H * static_cast<int64_t>(sizeof(float))));
    RETURN_IF_ERROR(s.delta.Reserve(cap * H * static_cast<int64_t>(sizeof(float))));
    s.row_capacity = cap;
  }
  if (out_rows > s.logit_row_capacity) {
    const int64_t cap = std::max<int64_t>(out_rows, 64);
    RETURN_IF_ERROR(s.last_hidden.Reserve(cap * H * static_cast<int64_t>(sizeof(bf16))));
    RETURN_IF_ERROR(s.logits.Reserve(cap * V * static_cast<int64_t>(sizeof(float))));
    RETURN_IF_ERROR(s.sampled.Reserve(cap * static_cast<int64_t>(sizeof(uint64_t))));
    RETURN_IF_ERROR(s.ids.Reserve(cap * static_cast<int64_t>(sizeof(int32_t))));
    RETURN_IF_ERROR(s.logprobs.Reserve(cap * static_cast<int64_t>(sizeof(float))));
    s.logit_row_capacity = cap;
  }
  RETURN_IF_ERROR(s.metadata.Reserve(std::max<int64_t>(meta_bytes, int64_t{1} << 20)));
  RETURN_IF_ERROR(s.table_store.Reserve(s.tables.store_entries() * 8));
  RETURN_IF_ERROR(s.decode_tables.Reserve(dense_table_bytes));
  if (num_prefill > 0) RETURN_IF_ERROR(s.prefill_workspace.Reserve(plan.workspace_bytes()));
  if (Buffer::generation() != generation_before) s.ClearGraphs();  // they hold old pointers
  // This slot's pinned buffers: no uncollected step uses them.
  RETURN_IF_ERROR(slot.metadata.Reserve(std::max<int64_t>(meta_bytes, int64_t{1} << 20)));
  RETURN_IF_ERROR(slot.logits.Reserve(std::max<int64_t>(logits_rows, 1) * V *
                                      static_cast<int64_t>(sizeof(float))));
  RETURN_IF_ERROR(slot.sampled.Reserve(std::max<int64_t>(out_rows, 1) *
                                       static_cast<int64_t>(sizeof(uint64_t))));
  RETURN_IF_ERROR(slot.ids.Reserve(std::max<int64_t>(out_rows, 1) * 4));
  RETURN_IF_ERROR(slot.logprobs.Reserve(std::max<int64_t>(out_rows, 1) * 4));
  for (const Section& x : sec) {
    if (x.bytes > 0) std::memcpy(slot.metadata.as<char>(x.offset), x.src, x.bytes);
  }

  cudaStream_t st = s.stream;
  // Everything from the embedding to the greedy ids: the part a CUDA graph replays.
  auto enqueue_compute = [&]() -> absl::Status {
    const auto* d_tokens = s.metadata.as<int32_t>(sec[0].offset);
    const auto* d_local = s.metadata.as<int32_t>(sec[1].offset);
    const auto* d_deltas = s.metadata.as<int32_t>(sec[2].offset);
    const auto* d_slots = s.metadata.as<int64_t>(sec[3].offset);
    const auto* d_logit_rows = s.metadata.as<int32_t>(sec[4].offset);
    const auto* d_tables = s.decode_tables.as<KvBlockEntry>();
    const auto* d_num_blocks = s.metadata.as<int32_t>(sec[6].offset);
    const void* d_plan = s.metadata.as<void>(sec[7].offset);
    float* x = s.x.as<float>();  // the residual stream stays fp32
    bf16 *h = s.h.as<bf16>(), *qkv = s.qkv.as<bf16>(),
         *q_rot = s.q_rot.as<bf16>(), *attn = s.attn.as<bf16>(), *gu = s.gate_up.as<bf16>(),
         *act = s.act.as<bf16>();
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    CublasLtGemm& gemm = *s.gemm;
    // The layer products of this step: cuBLASLt (or the one-row kernel behind it), or the wgmma
    // few-row kernel where it is on and supports the product.
    const bool wgmma = rows >= 2 && rows <= wgmma_max_rows_;
    auto linear = [&](const bf16* in_x, const bf16* w, const bf16* w_packed, int64_t in,
                      int64_t out, void* y, GemmOutputType type, bool accumulate,
                      SkinnyWgmmaConfig cut) -> absl::Status {
      if (wgmma && SkinnyWgmmaLinearSupports(rows, in, out, in_x, w, y)) {
        return SkinnyWgmmaLinearCuda(in_x, w, rows, in, out, y, type, accumulate,
                                     *s.wgmma_workspace, st, cut, w_packed);
      }
      return gemm.Linear(in_x, w, rows, in, out, y, type, accumulate, st);
    };
    auto linear_swiglu = [&](const bf16* in_x, const bf16* w,
                             const bf16* w_packed) -> absl::Status {
      if (wgmma && SkinnyWgmmaLinearSupports(rows, H, 2 * I, in_x, w, act)) {
        return SkinnyWgmmaLinearSwiGluCuda(in_x, w, rows, H, I, act, *s.wgmma_workspace, st,
                                           wgmma_cuts_.gate_up.splits, w_packed);
      }
      return gemm.LinearSwiGlu(in_x, w, rows, H, I, gu, act, st);
    };

    RETURN_IF_ERROR(EmbeddingGatherToF32Cuda(weights_->token_embedding(), V, H, d_tokens,
                                             static_cast<int>(rows), x, st));
    float* delta = s.delta.as<float>();
    const int dim = static_cast<int>(H);
    const float eps = c.rms_norm_eps;
    // One row: the norms run inside the skinny kernels that read them, and the projections
    // that end a residual branch add into x directly (the same fp32 sums as through delta).
    const bool fused = rows == 1 && fused_norms_ &&
                       SkinnyRmsNormLinearSupports(H, qkv_width, x, weights_->layer(0).wqkv) &&
                       SkinnyRmsNormLinearSupports(H, 2 * I, x, weights_->layer(0).w_gate_up);
    for (int l = 0; l < c.num_layers; ++l) {
      const CudaLayerWeights& L = weights_->layer(l);
      const State::PackedLayer P = s.packed.empty() ? State::PackedLayer{} : s.packed[l];
      bf16* k_pool = s.k_pool.as<bf16>() + l * s.layer_stride;
      bf16* v_pool = s.v_pool.as<bf16>() + l * s.layer_stride;
      const RopeKvAppendArgs rope_kv{.q = qkv,
                                     .q_row_stride = qkv_width,
                                     .k = qkv + Q,
                                     .k_row_stride = qkv_width,
                                     .v = qkv + Q + KV,
                                     .v_row_stride = qkv_width,
                                     .num_tokens = static_cast<int>(rows),
                                     .num_heads = c.num_heads,
                                     .num_kv_heads = c.num_kv_heads,
                                     .head_dim = c.head_dim,
                                     .local_positions = d_local,
                                     .deltas = d_deltas,
                                     .slots = d_slots,
                                     .rope = s.rope->view(),
                                     .q_out = q_rot,
                                     .k_pool = k_pool,
                                     .v_pool = v_pool};
      // At 2-64 rows with head_dim 128, RoPE and the K/V append can run in the QKV product.
      const bool fused_rope = wgmma && fused_qkv_rope_ &&
                              SkinnyWgmmaQkvRopeSupports(rows, H, rope_kv, h, L.wqkv);
      if (fused) {
        RETURN_IF_ERROR(SkinnyRmsNormLinearCuda(x, L.attn_norm, eps, L.wqkv, H, qkv_width, qkv,
                                                GemmOutputType::kBf16, /*accumulate=*/false, st));
      } else {
        // x += the previous layer's down projection (none before layer 0), then the norm.
        RETURN_IF_ERROR(
            l == 0 ? RmsNormF32ToBf16Cuda(x, L.attn_norm, rows, dim, eps, h, st)
                   : AddRmsNormF32ToBf16Cuda(x, delta, L.attn_norm, rows, dim, eps, h, st));
        if (!fused_rope) {
          RETURN_IF_ERROR(
              linear(h, L.wqkv, P.wqkv, H, qkv_width, qkv, GemmOutputType::kBf16,
                     /*accumulate=*/false, wgmma_cuts_.qkv));
        }
      }
      if (fused_rope) {
        RETURN_IF_ERROR(SkinnyWgmmaLinearQkvRopeCuda(h, L.wqkv, rows, H, rope_kv,
                                                     *s.wgmma_workspace, st,
                                                     {.splits = wgmma_cuts_.qkv.splits},
                                                     P.wqkv));
        ++s.fused_qkv_rope_launches;
      } else {
        RETURN_IF_ERROR(RopeKvAppend(rope_kv, st));
      }
      if (num_decode > 0) {
        RETURN_IF_ERROR(PagedDecodeAttention({.q = q_rot,
                                              .k_pool = k_pool,
                                              .v_pool = v_pool,
                                              .block_tables = d_tables,
                                              .num_blocks = d_num_blocks,
                                              .batch = num_decode,
                                              .num_heads = c.num_heads,
                                              .num_kv_heads = c.num_kv_heads,
                                              .head_dim = c.head_dim,
                                              .max_blocks_per_seq = max_decode_blocks,
                                              .scale = scale,
                                              .rotate = any_delta,
                                              .rope = s.rope->view(),
                                              .out = attn,
                                              .out_type = DecodeOutputType::kBf16,
                                              // A decode token's K/V goes to its own last block.
                                              .early_kv_loads = decode_only && early_kv_loads_},
                                             *s.decode_workspace, st));
      }
      if (num_prefill > 0) {
        RETURN_IF_ERROR(PagedPrefillAttention(
            plan,
            {.q = q_rot + int64_t{num_decode} * Q,
             .k_pool = k_pool,
             .v_pool = v_pool,
             .rope_cos = s.rope->view().cos,
             .rope_sin = s.rope->view().sin,
             .scale = scale,
             .out = attn + int64_t{num_decode} * Q,
             .device_metadata = d_plan,
             .workspace = s.prefill_workspace.as<void>(),
             .kernel = prefill_kernel_},
            any_delta ? PrefillRotation::kRotateQ : PrefillRotation::kNone, st));
      }
      if (fused) {
        RETURN_IF_ERROR(gemm.Linear(attn, L.wo, rows, Q, H, x, GemmOutputType::kFp32,
                                    /*accumulate=*/true, st));
        RETURN_IF_ERROR(
            SkinnyRmsNormLinearSwiGluCuda(x, L.ffn_norm, eps, L.w_gate_up, H, I, act, st));
        RETURN_IF_ERROR(gemm.Linear(act, L.w_down, rows, I, H, x, GemmOutputType::kFp32,
                                    /*accumulate=*/true, st));
        continue;
      }
      RETURN_IF_ERROR(
          linear(attn, L.wo, P.wo, Q, H, delta, GemmOutputType::kFp32, /*accumulate=*/false,
                 wgmma_cuts_.o));
      RETURN_IF_ERROR(AddRmsNormF32ToBf16Cuda(x, delta, L.ffn_norm, rows, dim, eps, h, st));
      RETURN_IF_ERROR(linear_swiglu(h, L.w_gate_up, P.w_gate_up));
      RETURN_IF_ERROR(
          linear(act, L.w_down, P.w_down, I, H, delta, GemmOutputType::kFp32,
                 /*accumulate=*/false, wgmma_cuts_.down));
    }
    if (out_rows > 0) {
      // The last residual step and the final norm over every row (one launch, cheap next to
      // the step), then the rows that sample, gathered like embedding rows, into the LM head.
      bf16* last = s.last_hidden.as<bf16>();
      RETURN_IF_ERROR(
          fused ? RmsNormF32ToBf16Cuda(x, weights_->output_norm(), rows, dim, eps, h, st)
                : AddRmsNormF32ToBf16Cuda(x, delta, weights_->output_norm(), rows, dim, eps, h,
                                          st));
      // A lone row is its own logit row: no gather.
      if (rows == 1) {
        last = h;
      } else {
        RETURN_IF_ERROR(
            EmbeddingGatherCuda(h, rows, H, d_logit_rows, static_cast<int>(out_rows), last, st));
      }
      RETURN_IF_ERROR(gemm.Linear(last, weights_->lm_head(), out_rows, H, V, s.logits.as<float>(),
                                  GemmOutputType::kFp32, /*accumulate=*/false, st));
      if (argmax_only) {  // all greedy: the argmax spread over the whole card
        RETURN_IF_ERROR(GreedyArgmaxCuda(s.logits.as<float>(), V, static_cast<int>(out_rows),
                                         static_cast<int>(V), s.sampled.as<uint64_t>(), st));
      } else {
        RETURN_IF_ERROR(SampleRowsCuda(
            {.logits = s.logits.as<float>(),
             .row_stride = V,
             .rows = static_cast<int>(out_rows),
             .vocab = static_cast<int>(V),
             .params = s.metadata.as<SamplingRowParams>(sec[9].offset),
             .penalties = s.metadata.as<PenaltyEntry>(sec[10].offset),
             .input_tokens = d_tokens,
             .input_token_rows = d_logit_rows,
             .out_ids = s.ids.as<int32_t>(),
             .out_logprobs = s.logprobs.as<float>()},
            st));
      }
    }
    return absl::OkStatus();
  };

  const auto prepared = std::chrono::steady_clock::now();
  auto enqueued = entered;
  slot.profiled = s.profiling;
  absl::Status status = [&]() -> absl::Status {
    if (slot.profiled) RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.start, st));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.metadata.as<void>(), slot.metadata.as<void>(),
                                         meta_bytes, cudaMemcpyHostToDevice, st));
    // Outside any graph: the patch's size and place change every step.
    RETURN_IF_ERROR(GatherDecodeTablesCuda(
        s.metadata.as<DecodeTableRow>(sec[5].offset), num_decode,
        s.metadata.as<KvBlockEntry>(sec[11].offset), s.table_store.as<KvBlockEntry>(),
        s.tables.capacity(), s.decode_tables.as<KvBlockEntry>(), max_decode_blocks, st));
    if (chained) {
      // The previous step's ids are still on the device (stream order): those of the rows
      // named become this step's tokens, over the placeholders just uploaded.
      if (previous_argmax_only) {
        RETURN_IF_ERROR(GreedyIdsToTokensCuda(s.sampled.as<uint64_t>(),
                                              s.metadata.as<int32_t>(sec[8].offset),
                                              static_cast<int>(rows),
                                              s.metadata.as<int32_t>(sec[0].offset), st));
      } else {
        RETURN_IF_ERROR(SampledIdsToTokensCuda(s.ids.as<int32_t>(),
                                               s.metadata.as<int32_t>(sec[8].offset),
                                               static_cast<int>(rows),
                                               s.metadata.as<int32_t>(sec[0].offset), st));
      }
    }
    if (decode_only && use_graphs_) {
      const GraphKey key{num_decode, max_decode_blocks, any_delta,
                         out_rows == 0 ? 0 : (argmax_only ? 1 : 2)};
      RETURN_IF_ERROR(s.RunGraph(key, enqueue_compute));
    } else {
      RETURN_IF_ERROR(enqueue_compute());
    }
    if (slot.profiled) RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.end, st));
    enqueued = std::chrono::steady_clock::now();
    if (out_rows > 0) {
      if (argmax_only) {
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.sampled.as<void>(), s.sampled.as<void>(),
                                             out_rows * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                             st));
      } else {
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.ids.as<void>(), s.ids.as<void>(),
                                             out_rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                             st));
        if (any_logprob) {
          RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.logprobs.as<void>(), s.logprobs.as<void>(),
                                               out_rows * sizeof(float), cudaMemcpyDeviceToHost,
                                               st));
        }
      }
      // Whole rows only where they were asked for, packed in order.
      int64_t packed = 0;
      for (int64_t r = 0; r < out_rows; ++r) {
        if (!row_logits[r]) continue;
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(slot.logits.as<float>() + packed * V,
                                             s.logits.as<float>() + r * V, V * sizeof(float),
                                             cudaMemcpyDeviceToHost, st));
        ++packed;
      }
    }
    RETURN_IF_CUDA_ERROR(cudaEventRecord(slot.copied, st));
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    // Leave no launch reading buffers that may be regrown; an uncollected step before this one
    // stays collectable (its results are in its own slot).
    cudaStreamSynchronize(s.stream);
    s.last_greedy_rows = -1;
    return status;
  }
  using Ms = std::chrono::duration<double, std::milli>;
  slot.row_logits = std::move(row_logits);
  slot.argmax_only = argmax_only;
  slot.any_logprob = any_logprob;
  slot.entered = entered;
  slot.prep_ms = Ms(prepared - entered).count();
  slot.enqueue_ms = Ms(enqueued - entered).count();
  bool one_row_each = out_rows == static_cast<int64_t>(chunks.size());
  for (const ForwardChunk& ch : chunks) one_row_each &= !ch.logits_for_all_tokens;
  s.last_greedy_rows = one_row_each ? out_rows : -1;
  s.last_argmax_only = argmax_only;
  s.in_flight.push_back(slot_index);
  s.chained_launches += chained;
  table_guard.Launched();
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> CudaModelRunner::Collect() {
  State& s = *state_;
  if (s.in_flight.empty()) return absl::FailedPreconditionError("no launched step to collect");
  // Popped before anything can fail: a failed collection still consumes its step, so the next
  // Collect() never returns an older step's results as a newer one's.
  const int slot_index = s.in_flight.front();
  s.in_flight.pop_front();
  State::HostSlot& slot = s.slots[slot_index];
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_));
  RETURN_IF_CUDA_ERROR(cudaEventSynchronize(slot.copied));
  if (slot.profiled && s.profiling) {
    using Ms = std::chrono::duration<double, std::milli>;
    const auto now = std::chrono::steady_clock::now();
    float gpu_ms = 0;
    cudaEventElapsedTime(&gpu_ms, slot.start, slot.end);
    ++s.profile.steps;
    s.profile.gpu_ms += gpu_ms;
    s.profile.forward_wall_ms += Ms(now - slot.entered).count();
    s.profile.prep_ms += slot.prep_ms;
    s.profile.enqueue_ms += slot.enqueue_ms;
    // A step launched before the last collection (pipelined) had no host time in between.
    if (s.last_return) {
      s.profile.between_ms += std::max(0.0, Ms(slot.entered - *s.last_return).count());
    }
    s.last_return = now;
  }
  const int64_t V = config().vocab_size;
  const int64_t out_rows = static_cast<int64_t>(slot.row_logits.size());
  const int64_t logits_rows = std::count(slot.row_logits.begin(), slot.row_logits.end(), true);
  ForwardOutput output;
  const float* host = slot.logits.as<float>();
  output.logits.assign(host, host + logits_rows * V);
  output.token_ids.resize(out_rows);
  output.logprobs.assign(out_rows, 0.0f);
  for (int64_t r = 0; r < out_rows; ++r) {
    output.token_ids[r] = slot.argmax_only ? GreedyIdFromPacked(slot.sampled.as<uint64_t>()[r])
                                           : slot.ids.as<int32_t>()[r];
  }
  if (slot.any_logprob) {
    std::copy_n(slot.logprobs.as<float>(), out_rows, output.logprobs.begin());
  }
  return output;
}

}  // namespace lazyattn
