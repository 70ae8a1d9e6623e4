// The AVX2 level (Intel Haswell+, AMD Zen 1-4, Intel Atom/Celeron of the N and J series before
// Gracemont...): built with -mavx2 -mfma -mf16c. The code is avx2_level_inl.h's, which this level
// shares with the AVX-VNNI one; here its integer dot products are vpmaddubsw + vpmaddwd.
#include "avx2_level_inl.h"

namespace edgectl {

const KernelTable& kernel_table_avx2() {
  static const KernelTable table = level_table("avx2");
  return table;
}

}  // namespace edgectl
