#include "kernels/cpu/decode_rows.h"

#include <vector>

#include "kernels/cpu/half_rows.h"
#include "kernels/include/quant_linear.h"

namespace lazyattn::cpu_internal {
namespace {

bool UseAvx2(int group, int d) {
  static const bool avx2 = CpuSupportsIsa(CpuIsa::kAvx2);
  return avx2 && d % 8 == 0 && group >= 1 && group <= 8;
}

// Eight partial sums, which compilers turn into SIMD adds without reassociation flags.
float Dot(const float* a, const float* b, int d) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int x = 0;
  for (; x + 8 <= d; x += 8) {
    for (int i = 0; i < 8; ++i) s[i] += a[x + i] * b[x + i];
  }
  float sum = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; x < d; ++x) sum += a[x] * b[x];
  return sum;
}

// One row in fp32: in place, or widened into `buf`.
const float* Row(const KvRows& r, int64_t j, int d, std::vector<float>& buf) {
  if (r.f32 != nullptr) return r.f32 + j * d;
  buf.resize(d);
  HalfToFloatRow(r.f16 + j * d, d, buf.data());
  return buf.data();
}

}  // namespace

void ScoreRowsPortable(const float* q, int group, int d, float scale, const KvRows& k,
                       float* scores) {
  std::vector<float> buf;
  for (int64_t j = 0; j < k.rows; ++j) {
    const float* kj = Row(k, j, d, buf);
    for (int g = 0; g < group; ++g) scores[j * group + g] = Dot(q + int64_t{g} * d, kj, d) * scale;
  }
}

void AccumulateRowsPortable(const float* p, int group, int d, const KvRows& v, float* acc) {
  std::vector<float> buf;
  for (int64_t j = 0; j < v.rows; ++j) {
    const float* vj = Row(v, j, d, buf);
    for (int g = 0; g < group; ++g) {
      const float w = p[j * group + g];
      float* a = acc + int64_t{g} * d;
      for (int x = 0; x < d; ++x) a[x] += w * vj[x];
    }
  }
}

void ScoreRows(const float* q, int group, int d, float scale, const KvRows& k, float* scores) {
  if (UseAvx2(group, d)) {
    ScoreRowsAvx2(q, group, d, scale, k, scores);
  } else {
    ScoreRowsPortable(q, group, d, scale, k, scores);
  }
}

void AccumulateRows(const float* p, int group, int d, const KvRows& v, float* acc) {
  if (UseAvx2(group, d)) {
    AccumulateRowsAvx2(p, group, d, v, acc);
  } else {
    AccumulateRowsPortable(p, group, d, v, acc);
  }
}

}  // namespace lazyattn::cpu_internal
