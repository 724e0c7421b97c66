#include "services/worker/model/model_fingerprint.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/document_key.h"
#include "common/status_macros.h"
#include "services/worker/model/ggml_type.h"
#include "services/worker/model/gguf_file.h"

namespace lazyattn {
namespace {

constexpr int64_t kSample = 4096;  // values fingerprinted at each end of every tensor

// The first and the last min(kSample, n) values of an n-value tensor, as raw fp32 bytes.
void AppendSample(std::span<const float> head, std::span<const float> tail, std::string& out) {
  out.append(reinterpret_cast<const char*>(head.data()), head.size() * sizeof(float));
  out.append(reinterpret_cast<const char*>(tail.data()), tail.size() * sizeof(float));
}

// Every tensor of the layout in fingerprint order: (slot, layer).
std::vector<std::pair<WeightSlot, int>> SlotOrder(const ModelConfig& c) {
  std::vector<std::pair<WeightSlot, int>> order = {{WeightSlot::kTokenEmbedding, -1},
                                                   {WeightSlot::kOutputNorm, -1},
                                                   {WeightSlot::kLmHead, -1}};
  for (int l = 0; l < c.num_layers; ++l) {
    for (WeightSlot s : {WeightSlot::kAttnNorm, WeightSlot::kWqkv, WeightSlot::kWo,
                         WeightSlot::kFfnNorm, WeightSlot::kGateUp, WeightSlot::kDown}) {
      order.emplace_back(s, l);
    }
  }
  return order;
}

std::string ConfigBytes(const ModelConfig& c) {
  std::string bytes = absl::StrCat("llama|", c.vocab_size, "|", c.hidden_size, "|",
                                   c.intermediate_size, "|", c.num_layers, "|", c.num_heads, "|",
                                   c.num_kv_heads, "|", c.head_dim, "|", c.rms_norm_eps, "|",
                                   c.rope.theta, "|", c.max_positions, "|");
  for (double f : RopeInverseFrequencies(c.rope)) absl::StrAppend(&bytes, f, ",");
  return bytes;
}

// Values [begin, end) of a slot as the host loader would hold them, read from the file: only the
// rows (for RoPE-ordered tensors, the whole heads) of the placed tensors that cover the range
// are dequantized.
absl::StatusOr<std::vector<float>> SlotValues(const GgufFile& file, const ModelConfig& c,
                                              const std::vector<WeightPlacement>& placements,
                                              WeightSlot slot, int layer, int64_t begin,
                                              int64_t end) {
  std::vector<float> out(end - begin);
  for (const WeightPlacement& p : placements) {
    if (p.slot != slot || p.layer != layer) continue;
    const int64_t cols = p.shape.back(), rows = p.shape.size() == 2 ? p.shape[0] : 1;
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + rows * cols);
    if (lo >= hi) continue;
    // Whole rows, widened to whole heads where rows move within a head.
    const int64_t group = p.rope_heads > 0 ? c.head_dim : 1;
    const int64_t first = (lo - p.offset) / cols / group * group;
    const int64_t last = ((hi - p.offset - 1) / cols / group + 1) * group;  // exclusive
    ASSIGN_OR_RETURN(const GgufTensorInfo* t, file.FindTensor(p.name));
    ASSIGN_OR_RETURN(const size_t row_bytes, GgmlRowBytes(t->type, cols));
    std::vector<float> part((last - first) * cols);
    const auto* rows_data = static_cast<const uint8_t*>(t->data) + first * row_bytes;
    RETURN_IF_ERROR(DequantizeToF32(t->type, rows_data, (last - first) * cols, part.data()));
    if (p.rope_heads > 0) {
      UnpermuteGgufRopeRows(part.data(), static_cast<int>((last - first) / c.head_dim), c.head_dim,
                            cols);
    }
    const int64_t part_begin = p.offset + first * cols;
    std::copy(part.begin() + (lo - part_begin), part.begin() + (hi - part_begin),
              out.begin() + (lo - begin));
  }
  return out;
}

}  // namespace

std::string ModelFingerprint(const ModelWeights& w) {
  std::string bytes = ConfigBytes(w.config);
  for (const auto& [slot, layer] : SlotOrder(w.config)) {
    // Packed matrices fingerprint the fp32 values they stand for, so both forms of one file
    // agree (the conversions are exact and the same as the fp32 loader's).
    const PackedMatrix* packed = WeightSlotPacked(w, slot, layer);
    if (packed != nullptr && !packed->empty()) {
      const int64_t n = packed->rows() * packed->cols, k = std::min(kSample, n);
      AppendSample(packed->Values(0, k), packed->Values(n - k, n), bytes);
      continue;
    }
    const std::vector<float>& v = WeightSlotVector(w, slot, layer);
    const int64_t n = static_cast<int64_t>(v.size()), k = std::min(kSample, n);
    AppendSample(std::span(v).first(k), std::span(v).last(k), bytes);
  }
  return Sha256Hex(bytes);
}

absl::StatusOr<std::string> GgufModelFingerprint(const GgufFile& file) {
  ASSIGN_OR_RETURN(const ModelConfig c, GgufModelConfig(file));
  // SlotValues reads rows at offsets computed from the config's shapes: only safe once every
  // tensor is known to have them (cheap; no tensor data is touched).
  RETURN_IF_ERROR(CheckGgufWeights(file, c));
  const std::vector<WeightPlacement> placements = GgufWeightPlacements(c);
  std::string bytes = ConfigBytes(c);
  for (const auto& [slot, layer] : SlotOrder(c)) {
    const int64_t n = WeightSlotElements(c, slot), k = std::min(kSample, n);
    ASSIGN_OR_RETURN(auto head, SlotValues(file, c, placements, slot, layer, 0, k));
    ASSIGN_OR_RETURN(auto tail, SlotValues(file, c, placements, slot, layer, n - k, n));
    AppendSample(head, tail, bytes);
  }
  return Sha256Hex(bytes);
}

std::string TokenizerFingerprint(const Tokenizer& t) {
  std::string bytes = absl::StrCat(static_cast<int>(t.pre_tokenizer()), "|", t.bos_id(), "|",
                                   t.eos_id(), "|", t.add_bos(), "|");
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    const auto text = t.TokenText(id);
    absl::StrAppend(&bytes, text.size(), ":");
    bytes.append(text.data(), text.size());
    absl::StrAppend(&bytes, static_cast<int>(t.token_type(id)), "|");
  }
  return Sha256Hex(bytes);
}

}  // namespace lazyattn
