// The AVX-512 scan kernel with vector compression of each block's changes (see scan_avx512.cpp):
// only scan_changes; select and write use the plain AVX-512 kernels.
#define DC_SCAN_VECTOR_CHANGES 1
#define DC_SCAN_CHANGES_ONLY 1
#include "scan_avx512.cpp"  // NOLINT(bugprone-suspicious-include): compiled again, other flags
