/* kvops.h — the CPU backend's data ops (kernels/backend.h, "data ops"): plain loops in the summation orders
 * the header fixes, which are the orders of the method code they replace, so results stay bit-identical. */
#ifndef KVB_CPU_KVOPS_H
#define KVB_CPU_KVOPS_H

#include "kernels/backend.h"

#include "kernels/cpu/pool.h"

/* Set be's data-op pointers (copy .. pod_merge) to the CPU implementations. They use no backend state
 * besides be->traffic and the thread pool (pod_merge). */
void cpu_install_data_ops(kvb_backend *be);
/* The elementwise ops on per-slot vectors (mul_f32 .. block_ranks; elemops.c), installed by the above. */
void cpu_install_elem_ops(kvb_backend *be);
/* The CPU backend's thread pool (backend_cpu.c). */
kvb_pool *cpu_backend_pool(const kvb_backend *be);

#endif
