// The inner loops of the decode attention (paged_decode_attention_cpu.cc) over one block's rows of
// one KV head, for the query heads of its GQA group at once, on fp32 or F16 pools: AVX2 + FMA +
// F16C where the CPU has them (CpuSupportsIsa(kAvx2)) and head_dim is a multiple of 8 and the
// group at most 8, portable loops otherwise. A key or value row is read once for the whole group;
// F16 rows are widened in registers (vcvtph2ps), never copied.
#ifndef LAZYATTN_KERNELS_CPU_DECODE_ROWS_H_
#define LAZYATTN_KERNELS_CPU_DECODE_ROWS_H_

#include <cstdint>

namespace lazyattn::cpu_internal {

// Rows of one block of one KV head: exactly one of f32 / f16 is set, [rows][d].
struct KvRows {
  const float* f32 = nullptr;
  const uint16_t* f16 = nullptr;
  int64_t rows = 0;
};

// scores[j * group + g] = scale * (q[g] . k_j) for j < k.rows; q: [group][d].
void ScoreRows(const float* q, int group, int d, float scale, const KvRows& k, float* scores);
// acc[g][x] += p[j * group + g] * v_j[x] for j < v.rows, x < d; acc: [group][d].
void AccumulateRows(const float* p, int group, int d, const KvRows& v, float* acc);

// The forms themselves, for tests (the AVX2 ones require d % 8 == 0, 1 <= group <= 8).
void ScoreRowsPortable(const float* q, int group, int d, float scale, const KvRows& k,
                       float* scores);
void AccumulateRowsPortable(const float* p, int group, int d, const KvRows& v, float* acc);
void ScoreRowsAvx2(const float* q, int group, int d, float scale, const KvRows& k, float* scores);
void AccumulateRowsAvx2(const float* p, int group, int d, const KvRows& v, float* acc);

}  // namespace lazyattn::cpu_internal

#endif  // LAZYATTN_KERNELS_CPU_DECODE_ROWS_H_
