#include "services/worker/cuda/cuda_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/block_copy_rerotate.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention.h"
#include "kernels/cuda/rope_table_cuda.h"
#include "kernels/cuda/sampling.h"
#include "services/worker/cuda/cuda_runner_state.h"

namespace lazyattn {

using cuda_runner_internal::bf16;
using cuda_runner_internal::Buffer;

CudaModelRunner::State::~State() {
  if (stream != nullptr) {
    cudaStreamSynchronize(stream);
    ClearGraphs();
    cudaStreamDestroy(stream);
  }
  if (copy_stream != nullptr) {
    cudaStreamSynchronize(copy_stream);
    cudaStreamDestroy(copy_stream);
  }
  for (HostSlot& slot : slots) {
    for (cudaEvent_t e :
         {slot.copied, slot.rows_staged, slot.logits_copied, slot.start, slot.end}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
}

int64_t CudaKvBytesPerBlock(const ModelConfig& c) {
  return int64_t{2} * c.num_layers * c.kv_size() * kDefaultKvBlockSize *
         static_cast<int64_t>(sizeof(bf16));
}

CudaModelRunner::~CudaModelRunner() = default;

int64_t CudaModelRunner::fused_qkv_rope_launches() const {
  return state_->fused_qkv_rope_launches;
}

int64_t CudaModelRunner::residual_in_product_steps() const {
  return state_->residual_in_product_steps;
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
  if (!SampleRowsCudaSupports(c.vocab_size)) {
    // Greedy steps would run, but every step with a sampled row would fail, with its batch.
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend's sampler takes vocabularies of up to 409,600 ids; model ",
                     c.name, " has ", c.vocab_size));
  }
  ASSIGN_OR_RETURN(const DeviceInfo info, QueryDevice(options.device));
  RETURN_IF_CUDA_ERROR(cudaSetDevice(options.device));
  auto r = std::unique_ptr<CudaModelRunner>(new CudaModelRunner());
  r->weights_ = std::move(weights);
  r->device_ = options.device;
  r->use_graphs_ = options.cuda_graphs;
  r->fused_norms_ = options.fused_norms && options.skinny_gemms;
  r->residual_in_products_ = options.residual_in_products;
  r->wgmma_max_rows_ = std::clamp(options.wgmma_max_rows, 0, 64);
  r->wgmma_cuts_ = options.wgmma_cuts;
  for (const auto& [name, cut] : {std::pair{"qkv", options.wgmma_cuts.qkv},
                                  std::pair{"o", options.wgmma_cuts.o},
                                  std::pair{"gate_up", options.wgmma_cuts.gate_up},
                                  std::pair{"down", options.wgmma_cuts.down}}) {
    const bool tile_ok = std::string_view(name) == "gate_up"
                             ? cut.tile_features == 0 || cut.tile_features == 64 ||
                                   cut.tile_features == 128
                             : cut.tile_features == 0 || cut.tile_features == 64 ||
                                   cut.tile_features == 128 || cut.tile_features == 256;
    if (!tile_ok || cut.splits < 0 || cut.splits > 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wgmma_cuts.", name, ": tile_features ", cut.tile_features, " / splits ", cut.splits,
          " (tile_features 0, 64, 128 or 256, gate_up 0, 64 or 128; splits 0 to 8)"));
    }
  }
  r->fused_qkv_rope_ = options.fused_qkv_rope;
  r->early_kv_loads_ = options.early_decode_kv_loads;
  // The wgmma kernel's code is sm_90a only.
  const bool hopper = info.compute_major == 9 && info.compute_minor == 0;
  r->prefill_kernel_ = hopper ? options.prefill_kernel : PrefillKernel::kMmaSync;
  if (options.prefill_variant < 0 || options.prefill_variant >= PrefillWgmmaWsVariants()) {
    return absl::InvalidArgumentError(absl::StrCat("prefill_variant ", options.prefill_variant,
                                                   ": 0 to ", PrefillWgmmaWsVariants() - 1));
  }
  r->prefill_variant_ = options.prefill_variant;
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
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s.copy_stream, cudaStreamNonBlocking));
  for (State::HostSlot& slot : s.slots) {
    for (cudaEvent_t* e : {&slot.copied, &slot.rows_staged, &slot.logits_copied}) {
      RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
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
  RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out.as<void>(), 0, kWarmRows * H * int64_t{sizeof(float)},
                                       s.stream));
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
    // Steps past the wgmma kernel's rows add o and down into the residual (residual_in_products):
    // plans of their own, tuned here too (out is zeroed: the accumulating form reads it).
    if (residual_in_products_ && rows > 1 && rows > wgmma_max_rows_) {
      RETURN_IF_ERROR(
          g.Linear(x, L.wo, rows, Q, H, out.as<void>(), GemmOutputType::kFp32, true, s.stream));
      RETURN_IF_ERROR(g.Linear(x, L.w_down, rows, I, H, out.as<void>(), GemmOutputType::kFp32,
                               true, s.stream));
    }
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
  // The decode graphs read their metadata from this buffer: grown here, outside Launch, its
  // new memory would go unnoticed by Launch's own check, and a replay would read freed memory.
  const int64_t metadata_bytes_before = s.metadata.bytes();
  RETURN_IF_ERROR(s.metadata.Reserve(bytes));
  if (s.metadata.bytes() != metadata_bytes_before) s.ClearGraphs();
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
  if (slot.logits_pending) {
    // Cleared only once the copy is known done: after a failed wait the next Launch on this
    // slot waits again.
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(slot.logits_copied));
    slot.logits_pending = false;
  }
  if (slot.profiled && s.profiling) s.RecordStepProfile(slot);
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
