#pragma once
// Function multi-versioning for the memory-bound loops: DC_HOT_CLONES compiles a function once for
// AVX-512 (x86-64-v4), once for AVX2 (x86-64-v3) and once generic; the loader picks per machine.
// Loops written in plain C++ are vectorised by the compiler inside each clone.
// Not under ThreadSanitizer: the clones' ifunc resolver runs during relocation, before the TSan
// runtime is up, and GCC instruments it: the process dies before main (seen with GCC 12).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DC_HOT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DC_HOT_CLONES
#endif
#define DC_INLINE inline __attribute__((always_inline))
