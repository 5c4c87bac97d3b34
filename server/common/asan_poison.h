// ASAN_POISON_MEMORY_REGION and ASAN_UNPOISON_MEMORY_REGION: AddressSanitizer's
// macros where the build has it, no-ops otherwise. Pool memory that is free
// (a chunk in a free list or parked in a cache) is poisoned, so a read or
// write through a stale pointer fails under ASan instead of passing silently.
#ifndef KVCACHE_SERVER_COMMON_ASAN_POISON_H_
#define KVCACHE_SERVER_COMMON_ASAN_POISON_H_

#if defined(__has_include) && __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>  // no-op macros unless built with ASan
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

#endif  // KVCACHE_SERVER_COMMON_ASAN_POISON_H_
