/* guard.h — KVB_GUARD: a CPU backend whose device tier host code cannot touch.
 *
 * On a GPU the device tier is memory the host cannot address; on the CPU it is the heap, so engine or method
 * code that still reads KV bytes directly works on the CPU and breaks (or pays page migrations) on the GPU.
 * The guard makes the CPU behave like the GPU here: device-tier blocks come from one process-wide arena, an
 * anonymous mapping that is PROT_NONE except while a backend op runs, so such code dies with SIGSEGV in the
 * tests instead of passing. Host-tier blocks stay plain heap memory.
 *
 * The arena reserves a large MAP_NORESERVE range once (no memory is committed until a page is written) and
 * hands out page-rounded blocks first-fit from an address-ordered free list, bumping its top when no free
 * extent fits. A freed block's pages go back to the system at once (madvise MADV_DONTNEED: they read as zeros
 * when handed out again, which is also how alloc returns zeroed memory), and the top shrinks when the block
 * below it is freed, so a long run (a test suite, a KV store reallocated every decode step) neither grows
 * its resident set nor runs out of address space. It lives until the process exits: blocks may be freed
 * after the backend that allocated them (a context sharing another's backend).
 *
 * Opening and closing the arena is one mprotect of its used range [base, top) each way, counted so that an
 * op calling another op (or two threads in ops at once) keeps it open until the last one returns. While any
 * op runs, every thread can touch the arena: the guard catches host code outside ops, not a race beside
 * one. */
#ifndef KVB_GUARD_H
#define KVB_GUARD_H

#include <stddef.h>

#include "kernels/backend.h"

/* 1 when $KVB_GUARD asks for the guard (set, and neither "" nor "0"). */
int kvb_guard_wanted(void);

/* A backend that runs every op of `inner` (compute ops, data ops, sync, kv_writer) with the arena open, and
 * whose allocator hands out device-tier memory from the arena (host tier: the heap). It owns inner (freeing it
 * frees inner); copies, traffic and errors of inner's ops show in its own fields. NULL + err when the arena
 * cannot be reserved (inner is freed then too). */
kvb_backend *kvb_guard_wrap(kvb_backend *inner, char *err, size_t err_len);

#endif
