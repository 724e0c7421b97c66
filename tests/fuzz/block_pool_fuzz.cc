// Fuzzes BlockPool (services/worker/cache/block_pool.h) with random Allocate / Ref / Unref /
// SetCached sequences, misuse included (ids past the pool, Ref of a free block, Unref of an
// unreferenced one, caching a free block). A reference model of the header's contract runs beside
// the pool: every return value, each block's state, the counts and errors() must agree with it,
// and CheckInvariant() must hold while there was no misuse. A disagreement traps.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "services/worker/cache/block_pool.h"
#include "tests/fuzz/fuzz_input.h"

namespace lazyattn {
namespace {

#define FUZZ_CHECK(cond)           \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

constexpr int kMaxOps = 1000;

struct ModelBlock {
  int32_t refs = 0;
  bool cached = false;
  bool free() const { return refs == 0 && !cached; }
};

class Harness {
 public:
  explicit Harness(int64_t n) : pool_(n), model_(n) {}

  void Allocate() {
    const std::optional<BlockId> b = pool_.Allocate();
    bool any_free = false;
    for (const ModelBlock& m : model_) any_free |= m.free();
    FUZZ_CHECK(b.has_value() == any_free);
    if (!b) return;
    FUZZ_CHECK(*b < model_.size() && model_[*b].free());
    model_[*b].refs = 1;
  }

  void Ref(BlockId b) {
    const bool valid = b < model_.size() && !model_[b].free();
    FUZZ_CHECK(pool_.Ref(b) == valid);
    if (valid) {
      ++model_[b].refs;
    } else {
      ++misuses_;
    }
  }

  void Unref(BlockId b) {
    const bool valid = b < model_.size() && model_[b].refs > 0;
    FUZZ_CHECK(pool_.Unref(b) == valid);
    if (valid) {
      --model_[b].refs;
    } else {
      ++misuses_;
    }
  }

  void SetCached(BlockId b, bool cached) {
    const bool valid = b < model_.size() && (!cached || model_[b].cached || model_[b].refs > 0);
    FUZZ_CHECK(pool_.SetCached(b, cached) == valid);
    if (valid) {
      model_[b].cached = cached;
    } else {
      ++misuses_;
    }
  }

  void Check() const {
    int64_t free = 0, referenced = 0, cached_unreferenced = 0;
    for (BlockId b = 0; b < model_.size(); ++b) {
      const ModelBlock& m = model_[b];
      FUZZ_CHECK(pool_.ref_count(b) == m.refs);
      FUZZ_CHECK(pool_.cached(b) == m.cached);
      FUZZ_CHECK(pool_.is_free(b) == m.free());
      if (m.refs > 0) {
        ++referenced;
      } else if (m.cached) {
        ++cached_unreferenced;
      } else {
        ++free;
      }
    }
    FUZZ_CHECK(pool_.num_free() == free);
    FUZZ_CHECK(pool_.num_referenced() == referenced);
    FUZZ_CHECK(pool_.num_cached_unreferenced() == cached_unreferenced);
    FUZZ_CHECK(pool_.errors() == misuses_);
    if (misuses_ == 0) FUZZ_CHECK(pool_.CheckInvariant().ok());
  }

  size_t size() const { return model_.size(); }

 private:
  BlockPool pool_;
  std::vector<ModelBlock> model_;
  int64_t misuses_ = 0;
};

}  // namespace
}  // namespace lazyattn

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lazyattn;
  fuzz::FuzzInput in(data, size);
  Harness h(in.Range(0, 40));
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const uint8_t choice = in.Byte();
    // Ids mostly inside the pool, sometimes just past it, now and then far past it.
    const uint8_t pick = in.Byte();
    const BlockId b = pick == 255 ? 0xffffffffu : static_cast<BlockId>(pick % (h.size() + 2));
    switch (choice % 5) {
      case 0:
        h.Allocate();
        break;
      case 1:
        h.Ref(b);
        break;
      case 2:
        h.Unref(b);
        break;
      default:
        h.SetCached(b, choice & 8);
        break;
    }
    h.Check();
  }
  return 0;
}
