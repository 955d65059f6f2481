// The AVX2 scan kernels with PDEP-based select (see scan_avx2.cpp).
#define DC_SCAN_AVX2_PDEP 1
#include "scan_avx2.cpp"  // NOLINT(bugprone-suspicious-include): compiled again, other flags
