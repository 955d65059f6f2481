#pragma once
// XXH3 with run-time dispatch to the widest vector unit the CPU has: on x86-64 libxxhash's
// dispatcher replaces XXH3_64bits* with its AVX2/AVX-512 builds (about 3.5x the SSE2 default
// on 4 MiB buffers on the development box); elsewhere the plain functions. Include this instead
// of <xxhash.h> where large buffers are hashed.
#include <xxhash.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <xxh_x86dispatch.h>
#endif
