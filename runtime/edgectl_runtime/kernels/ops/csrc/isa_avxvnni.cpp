// The AVX-VNNI level: AVX2 with the VEX-encoded vpdpbusd (CPUID.(EAX=7,ECX=1):EAX[4]; Intel Alder
// Lake and later client cores, among them the Gracemont cores of the N100/N305 in many mini-PCs,
// and Sapphire Rapids), on CPUs with no AVX-512 as on those with it. Built with -mavx2 -mfma -mf16c -mavxvnni: the AVX2
// level's code (avx2_level_inl.h), whose linear tiles then sum four u8 x s8 products into s32 in
// one instruction where AVX2 takes vpmaddubsw + vpmaddwd and an add. The same exact integer sums,
// so the same results as the AVX2 level, bit for bit.
#include "avx2_level_inl.h"

namespace edgectl {

const KernelTable& kernel_table_avxvnni() {
  static const KernelTable table = level_table("avxvnni");
  return table;
}

}  // namespace edgectl
